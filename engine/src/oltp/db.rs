//! One small client interface over PostgreSQL (`postgres` crate, extended protocol) and
//! MySQL/MariaDB (`mysql` crate, binary protocol): connect from a DSN, prepare statements once,
//! run them with positional values, and read rows as [`Val`]s.
//!
//! Statements are written once with `?` placeholders; for PostgreSQL they become `$1, $2, ...`.
//! Values are converted to the parameter types the server reports at prepare time, so the same
//! `Val::I(5)` binds to an `INTEGER`, a `BIGINT` or a `DOUBLE PRECISION` column.

use anyhow::{anyhow, bail, Context, Result};

use super::error::{masked, ConnectError, DsnError};
use super::pgwire::{self, PgWire, WireError};

/// Which server a DSN points at.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Dbms {
    Postgres,
    Mysql,
}

impl Dbms {
    /// `mysql://` and `mariadb://` URLs are MySQL/MariaDB; anything else (libpq keyword strings,
    /// `postgres://`, `postgresql://` URLs) is PostgreSQL.
    pub fn of_dsn(dsn: &str) -> Dbms {
        let d = dsn.trim_start();
        if d.starts_with("mysql://") || d.starts_with("mariadb://") {
            Dbms::Mysql
        } else {
            Dbms::Postgres
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Dbms::Postgres => "postgresql",
            Dbms::Mysql => "mariadb",
        }
    }
}

/// One value in or out of a statement.
#[derive(Clone, Debug, PartialEq)]
pub enum Val {
    Null,
    I(i64),
    F(f64),
    S(String),
}

impl Val {
    pub fn i64(&self) -> Result<i64> {
        match self {
            Val::I(v) => Ok(*v),
            Val::F(v) => Ok(*v as i64),
            Val::S(s) => s.trim().parse::<f64>().map(|f| f as i64).map_err(|_| anyhow!("expected an integer, got {s:?}")),
            Val::Null => bail!("expected an integer, got NULL"),
        }
    }

    pub fn f64(&self) -> Result<f64> {
        match self {
            Val::I(v) => Ok(*v as f64),
            Val::F(v) => Ok(*v),
            Val::S(s) => s.trim().parse::<f64>().map_err(|_| anyhow!("expected a number, got {s:?}")),
            Val::Null => bail!("expected a number, got NULL"),
        }
    }
}

impl From<i64> for Val {
    fn from(v: i64) -> Val {
        Val::I(v)
    }
}
impl From<i32> for Val {
    fn from(v: i32) -> Val {
        Val::I(v as i64)
    }
}
impl From<u32> for Val {
    fn from(v: u32) -> Val {
        Val::I(v as i64)
    }
}
impl From<u64> for Val {
    fn from(v: u64) -> Val {
        Val::I(v as i64)
    }
}
impl From<f64> for Val {
    fn from(v: f64) -> Val {
        Val::F(v)
    }
}
impl From<&str> for Val {
    fn from(v: &str) -> Val {
        Val::S(v.to_string())
    }
}
impl From<String> for Val {
    fn from(v: String) -> Val {
        Val::S(v)
    }
}

/// The statement of a connection, by the index `prepare` returned.
pub type Stmt = usize;

/// How a failed statement should be treated.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Failure {
    /// serialization failure or deadlock: the transaction may be retried
    Conflict,
    /// the connection is gone
    Broken,
    /// anything else (syntax, constraint, missing table...)
    Other,
}

pub enum Conn {
    Pg {
        client: Box<postgres::Client>,
        stmts: Vec<postgres::Statement>,
    },
    /// PostgreSQL through the small synchronous client (`pgwire`), the drivers' hot path
    Wire(Box<PgWire>),
    My {
        conn: Box<mysql::Conn>,
        stmts: Vec<mysql::Statement>,
    },
}

/// The most parameters [`Conn::query_count_text`] and [`Conn::execute_text`] pass without allocating.
const MAX_TEXT_PARAMS: usize = 4;

/// `?` placeholders as `$1, $2, ...` (no `?` inside string literals in our statements).
pub fn dollar_params(sql: &str) -> String {
    let mut out = String::with_capacity(sql.len() + 8);
    let mut n = 0;
    for c in sql.chars() {
        if c == '?' {
            n += 1;
            out.push('$');
            out.push_str(&n.to_string());
        } else {
            out.push(c);
        }
    }
    out
}

/// A PostgreSQL DSN (libpq keyword string or postgres:// URL) parsed.
pub fn pg_config(dsn: &str) -> Result<postgres::Config, DsnError> {
    dsn.parse().map_err(|e: postgres::Error| DsnError::Postgres { dsn: masked(dsn), reason: with_causes(&e) })
}

/// A MySQL/MariaDB DSN (mysql:// or mariadb:// URL) parsed.
pub fn mysql_opts(dsn: &str) -> Result<mysql::Opts, DsnError> {
    let url = dsn.trim().replacen("mariadb://", "mysql://", 1);
    mysql::Opts::from_url(&url).map_err(|e| DsnError::Mysql { dsn: masked(dsn), reason: e.to_string() })
}

/// An error and its causes, as `{:#}` says an anyhow chain (the `postgres` crate's Display is
/// only the kind: "db error", "error connecting to server").
fn with_causes(e: &dyn std::error::Error) -> String {
    let mut out = e.to_string();
    let mut cause = e.source();
    while let Some(c) = cause {
        let s = c.to_string();
        if !out.ends_with(&s) {
            out.push_str(": ");
            out.push_str(&s);
        }
        cause = c.source();
    }
    out
}

/// What a failed `postgres` login was: an answer of the server (SQLSTATE, authentication) is a
/// refusal, a reply that is not PostgreSQL's unexpected, no TCP connection unreachable.
fn pg_connect_error(dsn: &str, at: String, e: postgres::Error) -> ConnectError {
    const PG: &str = "PostgreSQL";
    let kind = e.to_string();
    let reason = with_causes(&e);
    if e.code().is_some() || kind == "authentication error" {
        ConnectError::Refused { dbms: PG, at, reason }
    } else if kind == "invalid configuration" && reason.ends_with("password missing") {
        let reason = format!("the server asks for a password and neither the DSN nor ${PASSWORD_ENV} has one");
        ConnectError::Refused { dbms: PG, at, reason }
    } else if kind == "invalid configuration" {
        ConnectError::Dsn(DsnError::Postgres { dsn: masked(dsn), reason })
    } else if kind == "unexpected message from server" || kind == "error parsing response from server" {
        ConnectError::Unexpected { dbms: PG, at, what: reason }
    } else if kind == "error communicating with the server" || kind == "connection closed" {
        ConnectError::Lost { dbms: PG, at, reason }
    } else {
        ConnectError::Unreachable { dbms: PG, at, reason }
    }
}

/// What a failed `mysql` login was (the crate's Display wraps each case in `Kind { ... }`).
fn mysql_connect_error(at: String, e: mysql::Error) -> ConnectError {
    const MY: &str = "MySQL/MariaDB";
    match e {
        mysql::Error::MySqlError(e) => ConnectError::Refused { dbms: MY, at, reason: e.to_string() },
        mysql::Error::DriverError(e @ (mysql::DriverError::ConnectTimeout | mysql::DriverError::CouldNotConnect(_))) => {
            ConnectError::Unreachable { dbms: MY, at, reason: e.to_string() }
        }
        mysql::Error::DriverError(e) => ConnectError::Unexpected { dbms: MY, at, what: e.to_string() },
        mysql::Error::CodecError(e) => ConnectError::Unexpected { dbms: MY, at, what: e.to_string() },
        mysql::Error::IoError(e) => ConnectError::Unreachable { dbms: MY, at, reason: e.to_string() },
        e => ConnectError::Unreachable { dbms: MY, at, reason: e.to_string() },
    }
}

/// the environment variable carrying the password of a DSN that has none
pub const PASSWORD_ENV: &str = "TIERSCOPE_DB_PASSWORD";

impl Conn {
    /// Connect to `dsn`; a DSN without a password takes $TIERSCOPE_DB_PASSWORD when it is set
    /// (`PASSWORD_ENV`: how tierscope passes the lab's password, which a command line would show
    /// to every local user).
    pub fn connect(dsn: &str) -> Result<Conn, ConnectError> {
        let env_password = std::env::var(PASSWORD_ENV).ok().filter(|p| !p.is_empty());
        let at = format!("{:?}", masked(dsn));
        match Dbms::of_dsn(dsn) {
            Dbms::Postgres => {
                let mut config = pg_config(dsn)?;
                if config.get_password().is_none() {
                    if let Some(p) = &env_password {
                        config.password(p);
                    }
                }
                let client = config.connect(postgres::NoTls).map_err(|e| pg_connect_error(dsn, at, e))?;
                Ok(Conn::Pg { client: Box::new(client), stmts: Vec::new() })
            }
            Dbms::Mysql => {
                let opts = mysql_opts(dsn)?;
                // the client closes statements its LRU cache evicts: keep room for all of ours; and
                // an UPDATE's affected rows are the rows it found (CLIENT_FOUND_ROWS), as in
                // PostgreSQL, not only those whose value changed: rewriting a field with the value
                // it had is not "no row found"
                let has_password = opts.get_pass().is_some();
                let mut opts = mysql::OptsBuilder::from_opts(opts);
                if !has_password {
                    opts = opts.pass(env_password);
                }
                let opts = opts.stmt_cache_size(Some(256)).additional_capabilities(mysql::consts::CapabilityFlags::CLIENT_FOUND_ROWS);
                let conn = mysql::Conn::new(opts).map_err(|e| mysql_connect_error(at, e))?;
                Ok(Conn::My { conn: Box::new(conn), stmts: Vec::new() })
            }
        }
    }

    /// Like [`Conn::connect`], but PostgreSQL through [`PgWire`] (one write and usually one read
    /// per statement, rows walked in place) when it can log in; else as `connect`.
    pub fn connect_fast(dsn: &str) -> Result<Conn, ConnectError> {
        if Dbms::of_dsn(dsn) == Dbms::Postgres {
            let env_password = std::env::var(PASSWORD_ENV).ok().filter(|p| !p.is_empty());
            if let Some(w) = PgWire::connect(dsn, env_password.as_deref())? {
                return Ok(Conn::Wire(Box::new(w)));
            }
        }
        Conn::connect(dsn)
    }

    pub fn dbms(&self) -> Dbms {
        match self {
            Conn::Pg { .. } | Conn::Wire(_) => Dbms::Postgres,
            Conn::My { .. } => Dbms::Mysql,
        }
    }

    /// Prepare `sql` (with `?` placeholders) once; run it later by the returned index.
    pub fn prepare(&mut self, sql: &str) -> Result<Stmt> {
        match self {
            Conn::Pg { client, stmts } => {
                let s = client.prepare(&dollar_params(sql)).with_context(|| format!("preparing {sql}"))?;
                stmts.push(s);
                Ok(stmts.len() - 1)
            }
            Conn::Wire(w) => w.prepare(&dollar_params(sql)),
            Conn::My { conn, stmts } => {
                use mysql::prelude::Queryable;
                let s = conn.prep(sql).with_context(|| format!("preparing {sql}"))?;
                stmts.push(s);
                Ok(stmts.len() - 1)
            }
        }
    }

    /// Run a prepared statement and return its rows.
    pub fn query(&mut self, stmt: Stmt, params: &[Val]) -> Result<Vec<Vec<Val>>> {
        match self {
            Conn::Pg { client, stmts } => {
                let refs: Vec<&(dyn postgres::types::ToSql + Sync)> = params.iter().map(|p| p as &(dyn postgres::types::ToSql + Sync)).collect();
                let rows = client.query(&stmts[stmt], &refs)?;
                rows.iter().map(pg_row).collect()
            }
            Conn::Wire(w) => {
                let mut rows = Vec::new();
                with_text_params(params, |p| w.run(stmt, p, |body| collect_row(body, &mut rows)))?;
                Ok(rows)
            }
            Conn::My { conn, stmts } => {
                use mysql::prelude::Queryable;
                let rows: Vec<mysql::Row> = conn.exec(&stmts[stmt], my_params(params))?;
                Ok(rows.into_iter().map(|r| r.unwrap().into_iter().map(my_val).collect()).collect())
            }
        }
    }

    /// Run a prepared statement and return how many rows it brought back, without keeping them
    /// (through [`PgWire`] each row's columns are walked and checked in place, not copied).
    pub fn query_count(&mut self, stmt: Stmt, params: &[Val]) -> Result<u64> {
        match self {
            Conn::Wire(w) => Ok(with_text_params(params, |p| {
                w.run(stmt, p, |body| {
                    pgwire::check_row(body)?;
                    Ok(())
                })
            })?
            .rows),
            _ => Ok(self.query(stmt, params)?.len() as u64),
        }
    }

    /// [`Conn::query_count`] with text parameters: through [`PgWire`] they go out as they are,
    /// without a [`Val`] or any allocation per call (YCSB's hot path); other clients get `Val`s.
    pub fn query_count_text(&mut self, stmt: Stmt, params: &[&str]) -> Result<u64> {
        match self {
            Conn::Wire(w) if params.len() <= MAX_TEXT_PARAMS => {
                let mut p: [pgwire::Param; MAX_TEXT_PARAMS] = [None; MAX_TEXT_PARAMS];
                for (slot, v) in p.iter_mut().zip(params) {
                    *slot = Some(v.as_bytes());
                }
                Ok(w.run(stmt, &p[..params.len()], |body| {
                    pgwire::check_row(body)?;
                    Ok(())
                })?
                .rows)
            }
            _ => self.query_count(stmt, &params.iter().map(|v| Val::S(v.to_string())).collect::<Vec<_>>()),
        }
    }

    /// [`Conn::execute`] with text parameters (no allocation per call through [`PgWire`]).
    pub fn execute_text(&mut self, stmt: Stmt, params: &[&str]) -> Result<u64> {
        match self {
            Conn::Wire(w) if params.len() <= MAX_TEXT_PARAMS => {
                let mut p: [pgwire::Param; MAX_TEXT_PARAMS] = [None; MAX_TEXT_PARAMS];
                for (slot, v) in p.iter_mut().zip(params) {
                    *slot = Some(v.as_bytes());
                }
                Ok(w.run(stmt, &p[..params.len()], |_| Ok(()))?.affected)
            }
            _ => self.execute(stmt, &params.iter().map(|v| Val::S(v.to_string())).collect::<Vec<_>>()),
        }
    }

    /// Run a prepared statement; the number of rows it changed.
    pub fn execute(&mut self, stmt: Stmt, params: &[Val]) -> Result<u64> {
        match self {
            Conn::Pg { client, stmts } => {
                let refs: Vec<&(dyn postgres::types::ToSql + Sync)> = params.iter().map(|p| p as &(dyn postgres::types::ToSql + Sync)).collect();
                Ok(client.execute(&stmts[stmt], &refs)?)
            }
            Conn::Wire(w) => Ok(with_text_params(params, |p| w.run(stmt, p, |_| Ok(())))?.affected),
            Conn::My { conn, stmts } => {
                use mysql::prelude::Queryable;
                conn.exec_drop(&stmts[stmt], my_params(params))?;
                Ok(conn.affected_rows())
            }
        }
    }

    /// Run SQL text as it is (no parameters, no rows back): DDL, BEGIN/COMMIT, bulk inserts.
    pub fn batch(&mut self, sql: &str) -> Result<()> {
        match self {
            Conn::Pg { client, .. } => Ok(client.batch_execute(sql)?),
            Conn::Wire(w) => {
                w.simple(sql, |_| Ok(()))?;
                Ok(())
            }
            Conn::My { conn, .. } => {
                use mysql::prelude::Queryable;
                Ok(conn.query_drop(sql)?)
            }
        }
    }

    /// Run SQL text and return its rows (catalog queries at start-up; not on the hot path).
    pub fn simple_rows(&mut self, sql: &str) -> Result<Vec<Vec<Val>>> {
        match self {
            Conn::Pg { client, .. } => {
                let rows = client.query(sql, &[])?;
                rows.iter().map(pg_row).collect()
            }
            Conn::Wire(w) => {
                let mut rows = Vec::new();
                w.simple(sql, |body| collect_row(body, &mut rows))?;
                Ok(rows)
            }
            Conn::My { conn, .. } => {
                use mysql::prelude::Queryable;
                let rows: Vec<mysql::Row> = conn.query(sql)?;
                Ok(rows.into_iter().map(|r| r.unwrap().into_iter().map(my_val).collect()).collect())
            }
        }
    }

    pub fn begin(&mut self) -> Result<()> {
        self.batch("BEGIN")
    }
    pub fn commit(&mut self) -> Result<()> {
        self.batch("COMMIT")
    }
    pub fn rollback(&mut self) -> Result<()> {
        self.batch("ROLLBACK")
    }

    /// The tables of the current database/schema, lower-cased.
    pub fn tables(&mut self) -> Result<Vec<String>> {
        let sql = match self.dbms() {
            Dbms::Postgres => "SELECT table_name::text FROM information_schema.tables WHERE table_schema = current_schema()",
            Dbms::Mysql => "SELECT CAST(table_name AS CHAR) FROM information_schema.tables WHERE table_schema = DATABASE()",
        };
        Ok(self
            .simple_rows(sql)?
            .into_iter()
            .filter_map(|r| match r.into_iter().next() {
                Some(Val::S(s)) => Some(s.to_lowercase()),
                _ => None,
            })
            .collect())
    }

    /// Whether the connection can still be used.
    pub fn is_closed(&self) -> bool {
        match self {
            Conn::Pg { client, .. } => client.is_closed(),
            Conn::Wire(w) => w.is_closed(),
            Conn::My { .. } => false,
        }
    }
}

/// What kind of failure an error from `Conn` is.
pub fn classify(err: &anyhow::Error) -> Failure {
    for cause in err.chain() {
        if let Some(e) = cause.downcast_ref::<postgres::Error>() {
            if let Some(code) = e.code() {
                let c = code.code();
                return if c == "40001" || c == "40P01" { Failure::Conflict } else { Failure::Other };
            }
            return if e.is_closed() { Failure::Broken } else { Failure::Other };
        }
        if let Some(e) = cause.downcast_ref::<WireError>() {
            return match e {
                WireError::Server { code, .. } if code == "40001" || code == "40P01" => Failure::Conflict,
                WireError::Server { .. } | WireError::Protocol(_) => Failure::Other,
                WireError::Closed(_) => Failure::Broken,
            };
        }
        if let Some(e) = cause.downcast_ref::<mysql::Error>() {
            return match e {
                // 1213 deadlock, 1205 lock wait timeout
                mysql::Error::MySqlError(me) if me.code == 1213 || me.code == 1205 => Failure::Conflict,
                mysql::Error::MySqlError(_) => Failure::Other,
                mysql::Error::IoError(_) | mysql::Error::DriverError(_) => Failure::Broken,
                _ => Failure::Other,
            };
        }
    }
    Failure::Other
}

fn pg_row(row: &postgres::Row) -> Result<Vec<Val>> {
    use postgres::types::Type;
    let mut out = Vec::with_capacity(row.len());
    for (i, col) in row.columns().iter().enumerate() {
        let t = col.type_();
        let v = if *t == Type::INT4 {
            row.try_get::<_, Option<i32>>(i)?.map_or(Val::Null, |v| Val::I(v as i64))
        } else if *t == Type::INT8 {
            row.try_get::<_, Option<i64>>(i)?.map_or(Val::Null, Val::I)
        } else if *t == Type::INT2 {
            row.try_get::<_, Option<i16>>(i)?.map_or(Val::Null, |v| Val::I(v as i64))
        } else if *t == Type::FLOAT8 {
            row.try_get::<_, Option<f64>>(i)?.map_or(Val::Null, Val::F)
        } else if *t == Type::FLOAT4 {
            row.try_get::<_, Option<f32>>(i)?.map_or(Val::Null, |v| Val::F(v as f64))
        } else if *t == Type::TIMESTAMP || *t == Type::TIMESTAMPTZ {
            row.try_get::<_, Option<std::time::SystemTime>>(i)?
                .map_or(Val::Null, |v| Val::I(v.duration_since(std::time::UNIX_EPOCH).map(|d| d.as_micros() as i64).unwrap_or(0)))
        } else {
            row.try_get::<_, Option<String>>(i).with_context(|| format!("column {} of type {t}", col.name()))?.map_or(Val::Null, Val::S)
        };
        out.push(v);
    }
    Ok(out)
}

/// `params` as text (PostgreSQL's text format: the server parses them as the parameters' types).
fn with_text_params<R>(params: &[Val], f: impl FnOnce(&[pgwire::Param]) -> R) -> R {
    let numbers: Vec<String> = params
        .iter()
        .filter_map(|p| match p {
            Val::I(v) => Some(v.to_string()),
            Val::F(v) => Some(v.to_string()),
            _ => None,
        })
        .collect();
    let mut numbers = numbers.iter();
    let text: Vec<pgwire::Param> = params
        .iter()
        .map(|p| match p {
            Val::Null => None,
            Val::S(s) => Some(s.as_bytes()),
            Val::I(_) | Val::F(_) => numbers.next().map(|n| n.as_bytes()),
        })
        .collect();
    f(&text)
}

/// A DataRow's text columns as values (NULL as `Val::Null`, the rest as `Val::S`).
fn collect_row(body: &[u8], rows: &mut Vec<Vec<Val>>) -> Result<(), WireError> {
    rows.push(pgwire::columns(body)?.map(|c| c.map_or(Val::Null, |b| Val::S(String::from_utf8_lossy(b).into_owned()))).collect());
    Ok(())
}

fn my_params(params: &[Val]) -> mysql::Params {
    if params.is_empty() {
        return mysql::Params::Empty;
    }
    mysql::Params::Positional(
        params
            .iter()
            .map(|p| match p {
                Val::Null => mysql::Value::NULL,
                Val::I(v) => mysql::Value::Int(*v),
                Val::F(v) => mysql::Value::Double(*v),
                Val::S(s) => mysql::Value::Bytes(s.as_bytes().to_vec()),
            })
            .collect(),
    )
}

fn my_val(v: mysql::Value) -> Val {
    match v {
        mysql::Value::NULL => Val::Null,
        mysql::Value::Int(i) => Val::I(i),
        mysql::Value::UInt(u) => Val::I(u as i64),
        mysql::Value::Float(f) => Val::F(f as f64),
        mysql::Value::Double(f) => Val::F(f),
        mysql::Value::Bytes(b) => Val::S(String::from_utf8_lossy(&b).into_owned()),
        other => Val::S(format!("{other:?}")),
    }
}

impl postgres::types::ToSql for Val {
    fn to_sql(
        &self,
        ty: &postgres::types::Type,
        out: &mut bytes::BytesMut,
    ) -> Result<postgres::types::IsNull, Box<dyn std::error::Error + Sync + Send>> {
        use postgres::types::Type;
        match self {
            Val::Null => Ok(postgres::types::IsNull::Yes),
            Val::I(v) => {
                if *ty == Type::INT4 {
                    (*v as i32).to_sql(ty, out)
                } else if *ty == Type::INT8 {
                    v.to_sql(ty, out)
                } else if *ty == Type::INT2 {
                    (*v as i16).to_sql(ty, out)
                } else if *ty == Type::FLOAT8 {
                    (*v as f64).to_sql(ty, out)
                } else if *ty == Type::FLOAT4 {
                    (*v as f32).to_sql(ty, out)
                } else {
                    v.to_string().to_sql(ty, out)
                }
            }
            Val::F(v) => {
                if *ty == Type::FLOAT4 {
                    (*v as f32).to_sql(ty, out)
                } else if *ty == Type::FLOAT8 {
                    v.to_sql(ty, out)
                } else {
                    Err(format!("cannot bind a number to a {ty} parameter").into())
                }
            }
            Val::S(s) => s.as_str().to_sql(ty, out),
        }
    }

    fn accepts(_ty: &postgres::types::Type) -> bool {
        true
    }

    postgres::types::to_sql_checked!();
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    #[test]
    fn placeholders_become_numbered() {
        assert_eq!(dollar_params("SELECT a FROM t WHERE k = ? AND j > ?"), "SELECT a FROM t WHERE k = $1 AND j > $2");
    }

    #[test]
    fn dsn_picks_the_dbms() {
        assert_eq!(Dbms::of_dsn("host=127.0.0.1 port=5432 user=postgres"), Dbms::Postgres);
        assert_eq!(Dbms::of_dsn("postgresql://u@h/db"), Dbms::Postgres);
        assert_eq!(Dbms::of_dsn("mysql://u:p@127.0.0.1:3306/db"), Dbms::Mysql);
        assert_eq!(Dbms::of_dsn("mariadb://u:p@127.0.0.1:3306/db"), Dbms::Mysql);
    }

    use crate::oltp::error::{ConnectError, DsnError};
    use std::io::{Read, Write};
    use std::net::TcpListener;

    /// A port nothing listens on (bound, then released).
    fn closed_port() -> u16 {
        TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
    }

    /// A one-connection server on 127.0.0.1 that reads the client's first message, answers
    /// `reply` and closes its side, then waits for the client to go.
    pub(crate) fn fake_server(reply: Vec<u8>) -> u16 {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = l.local_addr().unwrap().port();
        std::thread::spawn(move || {
            if let Ok((mut s, _)) = l.accept() {
                s.set_read_timeout(Some(std::time::Duration::from_secs(10))).unwrap();
                let mut buf = [0u8; 4096];
                let _ = s.read(&mut buf);
                let _ = s.write_all(&reply);
                let _ = s.shutdown(std::net::Shutdown::Write);
                while matches!(s.read(&mut buf), Ok(n) if n > 0) {}
            }
        });
        port
    }

    /// A PostgreSQL ErrorResponse refusing user x's password.
    pub(crate) fn auth_refusal() -> Vec<u8> {
        let mut body = Vec::new();
        for (f, v) in [(b'S', "FATAL"), (b'V', "FATAL"), (b'C', "28P01"), (b'M', "password authentication failed for user \"x\"")] {
            body.push(f);
            body.extend_from_slice(v.as_bytes());
            body.push(0);
        }
        body.push(0);
        crate::middleware::wire::frame(b'E', &body)
    }

    #[test]
    fn a_dsn_that_does_not_parse_is_a_dsn_error() {
        let e = Conn::connect("host=127.0.0.1 port=notaport user=x password=secret").err().expect("a bad DSN");
        assert!(
            matches!(&e, ConnectError::Dsn(DsnError::Postgres { dsn, .. }) if dsn == "host=127.0.0.1 port=notaport user=x password=***"),
            "{e:?}"
        );
        let text = e.to_string();
        assert!(text.starts_with("DSN \"host=127.0.0.1 port=notaport user=x password=***\": invalid connection string"), "{text}");
        assert!(text.contains("expected a libpq string") && !text.contains("secret"), "{text}");

        let e = Conn::connect("mysql://u:secret@127.0.0.1:notaport/db").err().expect("a bad DSN");
        assert!(matches!(&e, ConnectError::Dsn(DsnError::Mysql { dsn, .. }) if dsn == "mysql://u:***@127.0.0.1:notaport/db"), "{e:?}");
        let text = e.to_string();
        assert!(text.starts_with("DSN \"mysql://u:***@127.0.0.1:notaport/db\": "), "{text}");
        assert!(text.ends_with("(expected mysql://user:password@host:port/db)") && !text.contains("secret"), "{text}");
    }

    #[test]
    fn nothing_listening_is_unreachable() {
        let port = closed_port();
        let dsn = format!("host=127.0.0.1 port={port} user=x dbname=x");
        let e = Conn::connect(&dsn).err().expect("nothing listens");
        assert!(matches!(&e, ConnectError::Unreachable { dbms: "PostgreSQL", .. }), "{e:?}");
        // tests/test_oltp.py looks for these words
        assert!(e.to_string().starts_with(&format!("connecting to PostgreSQL at {dsn:?}: error connecting to server")), "{e}");

        let e = Conn::connect_fast(&dsn).err().expect("nothing listens");
        assert!(matches!(&e, ConnectError::Unreachable { dbms: "PostgreSQL", at, .. } if *at == format!("127.0.0.1:{port}")), "{e:?}");
        assert!(e.to_string().starts_with(&format!("connecting to PostgreSQL at 127.0.0.1:{port}: ")), "{e}");

        let e = Conn::connect(&format!("mysql://u@127.0.0.1:{port}/db")).err().expect("nothing listens");
        assert!(matches!(&e, ConnectError::Unreachable { dbms: "MySQL/MariaDB", .. }), "{e:?}");
        assert!(e.to_string().starts_with(&format!("connecting to MySQL/MariaDB at \"mysql://u@127.0.0.1:{port}/db\": ")), "{e}");
    }

    #[test]
    fn a_refused_login_is_refused() {
        let port = fake_server(auth_refusal());
        let dsn = format!("host=127.0.0.1 port={port} user=x dbname=x");
        let e = Conn::connect(&dsn).err().expect("refused");
        assert!(matches!(&e, ConnectError::Refused { dbms: "PostgreSQL", .. }), "{e:?}");
        let text = e.to_string();
        assert!(text.starts_with(&format!("connecting to PostgreSQL at {dsn:?}: the server refused the login: db error: ")), "{text}");
        assert!(text.contains("password authentication failed for user \"x\""), "{text}");
    }

    #[test]
    fn another_service_on_the_port_is_unexpected() {
        let port = fake_server(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n".to_vec());
        let dsn = format!("host=127.0.0.1 port={port} user=x dbname=x");
        let e = Conn::connect(&dsn).err().expect("not PostgreSQL");
        assert!(matches!(&e, ConnectError::Unexpected { dbms: "PostgreSQL", .. } | ConnectError::Lost { dbms: "PostgreSQL", .. }), "{e:?}");
        assert!(e.to_string().starts_with(&format!("connecting to PostgreSQL at {dsn:?}: ")), "{e}");
    }

    #[test]
    fn values_convert() {
        assert_eq!(Val::S("12.00".into()).i64().unwrap(), 12);
        assert_eq!(Val::I(3).f64().unwrap(), 3.0);
        assert!(Val::Null.i64().is_err());
    }
}
