//! The errors of the database drivers that a user can cause: a command-line value out of range,
//! a DSN that does not parse, a server that cannot be reached, refuses the login or does not
//! answer as PostgreSQL does, a database without the loaded tables. Each names the offending
//! value and says what was expected; `main` prints them (`tierscope-engine: error: ...`) and
//! exits with status 2, as for any other error.
//!
//! What a user cannot cause (a thread that panicked, an unknown operation index, a value of
//! the wrong type in a row the driver's own statements return) stays `anyhow`.
//!
//! Python (`tierscope.oltp`) reads some of these messages: "table usertable is missing",
//! "TPC-C tables missing: a, b (load ...", "connecting to PostgreSQL". Keep those words.

use std::sync::OnceLock;

use regex::Regex;

/// A bad command-line value, or a database that does not hold what the run needs.
#[derive(Debug, thiserror::Error)]
pub enum OltpError {
    /// `--table` with characters that cannot go into SQL unquoted.
    #[error("--table {0:?}: letters, digits and _ only")]
    TableName(String),
    /// A count that must be at least 1 (`--threads`, `--batch`, `--field-count`, ...).
    #[error("{option} must be at least 1, got {value}")]
    TooFew { option: &'static str, value: u64 },
    /// A number out of its range: NaN, infinite, negative, or too large for a run (seconds,
    /// a rate, a factor).
    #[error("{option} must be {expected}, got {value}")]
    OutOfRange { option: &'static str, value: f64, expected: &'static str },
    /// The YCSB table is not in the database.
    #[error("table {table} is missing: run `tierscope-engine ycsb load --dsn ...` first")]
    MissingTable { table: String },
    /// The YCSB table has no rows.
    #[error("table {table} is empty: load it first")]
    EmptyTable { table: String },
    /// Some of the nine TPC-C tables are not in the database.
    #[error("TPC-C tables missing: {} (load them with `tierscope-engine tpcc load --dsn ...`)", tables.join(", "))]
    MissingTables { tables: Vec<String> },
    /// The TPC-C warehouse table has no rows.
    #[error("the warehouse table is empty: load it with `tierscope-engine tpcc load`")]
    NoWarehouses,
    /// A load phase ran out of its `--max-seconds`.
    #[error("load: --max-seconds reached ({seconds} s): give it more time or load fewer rows")]
    LoadTimeout { seconds: f64 },
}

/// The longest time a run or a load may be given, in seconds (≈ 31 years: beyond any use, and
/// well below what `Duration` and `Instant` can hold).
pub const MAX_SECONDS: f64 = 1e9;
pub const POSITIVE_SECONDS: &str = "a number of seconds > 0 and <= 1e9 (every run is bounded in time)";
pub const NON_NEGATIVE_SECONDS: &str = "a number of seconds >= 0 and <= 1e9";

/// `value` as a count of at least 1.
pub fn at_least_one(option: &'static str, value: u64) -> Result<(), OltpError> {
    if value == 0 {
        return Err(OltpError::TooFew { option, value });
    }
    Ok(())
}

/// `value` as a number of seconds, > 0 (`positive`) or >= 0, at most [`MAX_SECONDS`].
pub fn seconds(option: &'static str, value: f64, positive: bool) -> Result<(), OltpError> {
    let low = if positive { value > 0.0 } else { value >= 0.0 };
    if !(low && value <= MAX_SECONDS) {
        let expected = if positive { POSITIVE_SECONDS } else { NON_NEGATIVE_SECONDS };
        return Err(OltpError::OutOfRange { option, value, expected });
    }
    Ok(())
}

/// `value` within `lo..=hi` (NaN is not).
pub fn within(option: &'static str, value: f64, lo: f64, hi: f64, expected: &'static str) -> Result<(), OltpError> {
    if !(lo..=hi).contains(&value) {
        return Err(OltpError::OutOfRange { option, value, expected });
    }
    Ok(())
}

/// A DSN its client library cannot parse (the DSN is shown with its password masked).
#[derive(Debug, thiserror::Error)]
pub enum DsnError {
    /// Not a libpq keyword string nor a postgres:// / postgresql:// URL.
    #[error(
        "DSN {dsn:?}: {reason} (expected a libpq string such as \"host=127.0.0.1 port=5432 user=u dbname=db\" \
         or a postgresql:// URL)"
    )]
    Postgres { dsn: String, reason: String },
    /// Not a mysql:// (or mariadb://) URL.
    #[error("DSN {dsn:?}: {reason} (expected mysql://user:password@host:port/db)")]
    Mysql { dsn: String, reason: String },
}

/// Why a connection could not be opened and logged in. The client library's error is part of
/// the message (`reason`), not a source, so `{err:#}` says it once.
#[derive(Debug, thiserror::Error)]
pub enum ConnectError {
    #[error(transparent)]
    Dsn(#[from] DsnError),
    /// Nothing answers at the address (refused, unknown host, no socket file, timeout...).
    #[error("connecting to {dbms} at {at}: {reason}")]
    Unreachable { dbms: &'static str, at: String, reason: String },
    /// The server answered and refused: wrong password, unknown user or database, too many
    /// connections...
    #[error("connecting to {dbms} at {at}: the server refused the login: {reason}")]
    Refused { dbms: &'static str, at: String, reason: String },
    /// What answered does not speak the protocol as the server should (another service on the
    /// port, a SCRAM proof that does not verify, a message out of place during the login).
    #[error("connecting to {dbms} at {at}: unexpected answer during the login: {what} (expected {dbms}'s login exchange)")]
    Unexpected { dbms: &'static str, at: String, what: String },
    /// The connection broke during the login.
    #[error("connecting to {dbms} at {at}: the connection broke during the login: {reason}")]
    Lost { dbms: &'static str, at: String, reason: String },
}

/// `dsn` as it may be shown: the value of a `password=` keyword and the password of a URL's
/// `user:password@` replaced by `***`.
pub fn masked(dsn: &str) -> String {
    static KEYWORD: OnceLock<Regex> = OnceLock::new();
    static URL: OnceLock<Regex> = OnceLock::new();
    let kw = KEYWORD.get_or_init(|| Regex::new(r"(?i)\b(password\s*=\s*)('(?:[^'\\]|\\.)*'?|\S+)").expect("valid regex"));
    let url = URL.get_or_init(|| Regex::new(r"(://[^:/@\s]*:)[^@/\s]*@").expect("valid regex"));
    let s = kw.replace_all(dsn, "${1}***");
    url.replace_all(&s, "${1}***@").into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn passwords_are_masked() {
        assert_eq!(masked("host=h user=u password=secret dbname=d"), "host=h user=u password=*** dbname=d");
        assert_eq!(masked("host=h password = 'se cret' dbname=d"), "host=h password = *** dbname=d");
        assert_eq!(masked("postgresql://u:secret@h:5432/db"), "postgresql://u:***@h:5432/db");
        assert_eq!(masked("mysql://u:secret@h:3306/db"), "mysql://u:***@h:3306/db");
        assert_eq!(masked("mysql://u@h:3306/db"), "mysql://u@h:3306/db");
        assert_eq!(masked("host=h user=u"), "host=h user=u");
    }

    #[test]
    fn ranges() {
        assert!(matches!(seconds("--duration", f64::NAN, true), Err(OltpError::OutOfRange { option: "--duration", .. })));
        assert!(seconds("--warmup", 0.0, false).is_ok());
        assert!(seconds("--duration", 0.0, true).is_err());
        assert!(seconds("--duration", MAX_SECONDS, true).is_ok());
        assert!(matches!(at_least_one("--threads", 0), Err(OltpError::TooFew { option: "--threads", value: 0 })));
        assert!(within("--x", f64::NAN, 0.0, 1.0, "in [0, 1]").is_err());
        assert_eq!(OltpError::LoadTimeout { seconds: 5.0 }.to_string(), "load: --max-seconds reached (5 s): give it more time or load fewer rows");
    }
}
