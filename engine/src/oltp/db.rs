//! One small client interface over PostgreSQL (`postgres` crate, extended protocol) and
//! MySQL/MariaDB (`mysql` crate, binary protocol): connect from a DSN, prepare statements once,
//! run them with positional values, and read rows as [`Val`]s.
//!
//! Statements are written once with `?` placeholders; for PostgreSQL they become `$1, $2, ...`.
//! Values are converted to the parameter types the server reports at prepare time, so the same
//! `Val::I(5)` binds to an `INTEGER`, a `BIGINT` or a `DOUBLE PRECISION` column.

use anyhow::{anyhow, bail, Context, Result};

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

/// the environment variable carrying the password of a DSN that has none
pub const PASSWORD_ENV: &str = "TIERSCOPE_DB_PASSWORD";

impl Conn {
    /// Connect to `dsn`; a DSN without a password takes $TIERSCOPE_DB_PASSWORD when it is set
    /// (`PASSWORD_ENV`: how tierscope passes the lab's password, which a command line would show
    /// to every local user).
    pub fn connect(dsn: &str) -> Result<Conn> {
        let env_password = std::env::var(PASSWORD_ENV).ok().filter(|p| !p.is_empty());
        match Dbms::of_dsn(dsn) {
            Dbms::Postgres => {
                let mut config: postgres::Config = dsn.parse().with_context(|| format!("DSN {dsn:?}"))?;
                if config.get_password().is_none() {
                    if let Some(p) = &env_password {
                        config.password(p);
                    }
                }
                let client = config.connect(postgres::NoTls).with_context(|| format!("connecting to PostgreSQL at {dsn:?}"))?;
                Ok(Conn::Pg { client: Box::new(client), stmts: Vec::new() })
            }
            Dbms::Mysql => {
                let url = dsn.trim().replacen("mariadb://", "mysql://", 1);
                let opts = mysql::Opts::from_url(&url).map_err(|e| anyhow!("DSN {dsn:?}: {e}"))?;
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
                let conn = mysql::Conn::new(opts).with_context(|| format!("connecting to MySQL/MariaDB at {dsn:?}"))?;
                Ok(Conn::My { conn: Box::new(conn), stmts: Vec::new() })
            }
        }
    }

    /// Like [`Conn::connect`], but PostgreSQL through [`PgWire`] (one write and usually one read
    /// per statement, rows walked in place) when it can log in; else as `connect`.
    pub fn connect_fast(dsn: &str) -> Result<Conn> {
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
mod tests {
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

    #[test]
    fn values_convert() {
        assert_eq!(Val::S("12.00".into()).i64().unwrap(), 12);
        assert_eq!(Val::I(3).f64().unwrap(), 3.0);
        assert!(Val::Null.i64().is_err());
    }
}
