//! A small synchronous PostgreSQL client for the drivers' hot path: one blocking socket, named
//! prepared statements (extended protocol, as `pgbench -M prepared` / libpq's
//! `PQexecPrepared`), text parameters and text results.
//!
//! Why not the `postgres` crate there: it is `tokio-postgres` driven by a `block_on` per call, so
//! every statement crosses two channels and the runtime, and its rows are decoded into owned
//! values. Here one operation is one `write` (Bind + Execute + Sync built in a reused buffer) and
//! usually one `read` (the replies parsed in place from a reused buffer); rows are walked and
//! counted, a row's fields copied out only when a caller asks for them (`query`).
//!
//! It speaks what the lab's servers ask for: trust, cleartext password and SCRAM-SHA-256 (the
//! middleware's [`scram`](crate::middleware::scram) client), over TCP or a Unix socket, no TLS.
//! [`PgWire::connect`] answers `Ok(None)` for anything else (another authentication method,
//! `sslmode=require`, several hosts), and the caller falls back to the `postgres` crate.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::os::unix::net::UnixStream;

use anyhow::{Context, Result};

use super::db::pg_config;
use super::error::ConnectError;
use crate::middleware::{scram, wire};

/// BackendKeyData: the key to cancel this session's queries (sent once, during the login).
const BACKEND_KEY_DATA: u8 = b'K';
/// NegotiateProtocolVersion: the server's newest minor version, when older than asked.
const NEGOTIATE_PROTOCOL_VERSION: u8 = b'v';

/// An error the server reported (SQLSTATE `code`), or a connection that broke.
#[derive(Debug, thiserror::Error)]
pub enum WireError {
    #[error("{severity} {code}: {message}")]
    Server { severity: String, code: String, message: String },
    #[error("connection closed: {0}")]
    Closed(String),
    #[error("protocol: {0}")]
    Protocol(String),
}

enum Stream {
    Tcp(TcpStream),
    Unix(UnixStream),
}

impl Stream {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        match self {
            Stream::Tcp(s) => s.read(buf),
            Stream::Unix(s) => s.read(buf),
        }
    }
    fn write_all(&mut self, buf: &[u8]) -> std::io::Result<()> {
        match self {
            Stream::Tcp(s) => s.write_all(buf),
            Stream::Unix(s) => s.write_all(buf),
        }
    }
}

/// What one statement returned: its rows (counted) and the count of its command tag.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Outcome {
    pub rows: u64,
    pub affected: u64,
}

/// One parameter, as text (`None` is NULL).
pub type Param<'a> = Option<&'a [u8]>;

pub struct PgWire {
    stream: Stream,
    /// received bytes in `rbuf[rpos..rend]`
    rbuf: Vec<u8>,
    rpos: usize,
    rend: usize,
    wbuf: Vec<u8>,
    /// names of the prepared statements, by index
    names: Vec<String>,
    closed: bool,
}

const READ_CHUNK: usize = 64 * 1024;

impl PgWire {
    /// Connect and log in; `Ok(None)` when this client lacks what the DSN or the server needs.
    pub fn connect(dsn: &str, env_password: Option<&str>) -> Result<Option<PgWire>, ConnectError> {
        use postgres::config::{Host, SslMode};
        const PG: &str = "PostgreSQL";
        let config = pg_config(dsn)?;
        if config.get_ssl_mode() == SslMode::Require || config.get_hosts().len() > 1 || config.get_options().is_some() {
            return Ok(None);
        }
        let Some(user) = config.get_user() else { return Ok(None) };
        let port = config.get_ports().first().copied().unwrap_or(5432);
        let unreachable = |at: String, e: std::io::Error| ConnectError::Unreachable { dbms: PG, reason: e.to_string(), at };
        let (stream, at) = match (config.get_hostaddrs().first(), config.get_hosts().first()) {
            (Some(ip), _) => {
                let at = format!("{ip}:{port}");
                (Stream::Tcp(TcpStream::connect((*ip, port)).map_err(|e| unreachable(at.clone(), e))?), at)
            }
            (None, Some(Host::Tcp(h))) => {
                let at = format!("{h}:{port}");
                (Stream::Tcp(TcpStream::connect((h.as_str(), port)).map_err(|e| unreachable(at.clone(), e))?), at)
            }
            (None, Some(Host::Unix(dir))) => {
                let path = dir.join(format!(".s.PGSQL.{port}"));
                let at = path.display().to_string();
                (Stream::Unix(UnixStream::connect(&path).map_err(|e| unreachable(at.clone(), e))?), at)
            }
            (None, None) => return Ok(None),
        };
        if let Stream::Tcp(s) = &stream {
            s.set_nodelay(true).map_err(|e| unreachable(at.clone(), e))?;
        }
        let password = match config.get_password() {
            Some(p) => Some(String::from_utf8_lossy(p).into_owned()),
            None => env_password.map(str::to_string),
        };
        let mut c = PgWire { stream, rbuf: vec![0; READ_CHUNK], rpos: 0, rend: 0, wbuf: Vec::with_capacity(4096), names: Vec::new(), closed: false };
        let dbname = config.get_dbname().unwrap_or(user);
        let mut params = vec![("user", user), ("database", dbname), ("client_encoding", "UTF8")];
        if let Some(app) = config.get_application_name() {
            params.push(("application_name", app));
        }
        // what went wrong during the login, as the user reads it
        let login = |e: WireError| match e {
            WireError::Server { .. } => ConnectError::Refused { dbms: PG, at: at.clone(), reason: e.to_string() },
            WireError::Protocol(what) => ConnectError::Unexpected { dbms: PG, at: at.clone(), what },
            WireError::Closed(reason) => ConnectError::Lost { dbms: PG, at: at.clone(), reason },
        };
        let startup = wire::startup_message(&params);
        c.send(&startup).map_err(login)?;
        let mut sasl: Option<scram::Client> = None;
        loop {
            let (kind, body) = c.next_message().map_err(login)?;
            match kind {
                wire::AUTH => {
                    let code = body.get(..4).map(|b| u32::from_be_bytes([b[0], b[1], b[2], b[3]])).unwrap_or(u32::MAX);
                    let data = body.get(4..).unwrap_or(&[]).to_vec();
                    let reply = match (code, password.as_deref()) {
                        (0, _) => continue,
                        (wire::AUTH_CLEARTEXT, Some(p)) => {
                            let mut b = p.as_bytes().to_vec();
                            b.push(0);
                            wire::frame(wire::PASSWORD, &b)
                        }
                        (scram::SASL, Some(p)) if wire::sasl_mechanisms(&data).iter().any(|m| m == scram::MECHANISM) => {
                            let s = scram::Client::new(p);
                            let m = wire::sasl_initial(scram::MECHANISM, &s.first());
                            sasl = Some(s);
                            m
                        }
                        (scram::SASL_CONTINUE, _) if sasl.is_some() => {
                            let s = sasl.as_mut().expect("checked");
                            wire::frame(wire::PASSWORD, &s.finish(&data).map_err(|e| login(WireError::Protocol(format!("SCRAM: {e}"))))?)
                        }
                        (scram::SASL_FINAL, _) if sasl.is_some() => {
                            sasl.as_ref().expect("checked").verify(&data).map_err(|e| login(WireError::Protocol(format!("SCRAM: {e}"))))?;
                            continue;
                        }
                        // md5, GSS, SSPI, or a password we do not have: let the `postgres` crate try
                        _ => return Ok(None),
                    };
                    c.send(&reply).map_err(login)?;
                }
                wire::ERROR => return Err(login(server_error(body))),
                wire::READY => return Ok(Some(c)),
                // what a server sends between the login and ReadyForQuery: its parameters, the
                // cancel key, notices, a protocol-version negotiation
                wire::PARAMETER_STATUS | BACKEND_KEY_DATA | wire::NOTICE | NEGOTIATE_PROTOCOL_VERSION => {}
                other => {
                    c.closed = true;
                    return Err(login(WireError::Protocol(format!("message type {:?} before ReadyForQuery", other as char))));
                }
            }
        }
    }

    fn send(&mut self, bytes: &[u8]) -> Result<(), WireError> {
        self.stream.write_all(bytes).map_err(|e| self.broke(e))
    }

    fn broke(&mut self, e: std::io::Error) -> WireError {
        self.closed = true;
        WireError::Closed(e.to_string())
    }

    /// The next whole message from the server (type, body), reading as needed.
    fn next_message(&mut self) -> Result<(u8, &[u8]), WireError> {
        loop {
            let avail = self.rend - self.rpos;
            if avail >= 5 {
                let p = self.rpos;
                let kind = self.rbuf[p];
                let len = u32::from_be_bytes([self.rbuf[p + 1], self.rbuf[p + 2], self.rbuf[p + 3], self.rbuf[p + 4]]) as usize;
                if !(4..=wire::MAX_MESSAGE).contains(&len) {
                    self.closed = true;
                    return Err(WireError::Protocol(format!("bad message length {len} for type {:?}", kind as char)));
                }
                if avail > len {
                    self.rpos = p + 1 + len;
                    return Ok((kind, &self.rbuf[p + 5..p + 1 + len]));
                }
                if self.rbuf.len() < len + 1 {
                    self.rbuf.resize(len + 1 + READ_CHUNK, 0);
                }
            }
            // make room at the end: move what is left of a partial message to the front
            if self.rpos > 0 {
                self.rbuf.copy_within(self.rpos..self.rend, 0);
                self.rend -= self.rpos;
                self.rpos = 0;
            }
            if self.rend == self.rbuf.len() {
                self.rbuf.resize(self.rbuf.len() + READ_CHUNK, 0);
            }
            let n = match self.stream.read(&mut self.rbuf[self.rend..]) {
                Ok(0) => {
                    self.closed = true;
                    return Err(WireError::Closed("the server closed the connection".into()));
                }
                Ok(n) => n,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(self.broke(e)),
            };
            self.rend += n;
        }
    }

    /// Prepare `sql` (with `$n` placeholders) as a named statement; run it later by the index.
    pub fn prepare(&mut self, sql: &str) -> Result<usize> {
        let name = format!("ts{}", self.names.len());
        self.wbuf.clear();
        let mut body = Vec::with_capacity(sql.len() + name.len() + 4);
        push_cstr(&mut body, &name);
        push_cstr(&mut body, sql);
        body.extend_from_slice(&0u16.to_be_bytes());
        let mut out = std::mem::take(&mut self.wbuf);
        wire::frame_into(&mut out, wire::PARSE, &body);
        wire::frame_into(&mut out, wire::SYNC, &[]);
        let r = self.send(&out);
        self.wbuf = out;
        r?;
        self.finish(|_| Ok(())).with_context(|| format!("preparing {sql}"))?;
        self.names.push(name);
        Ok(self.names.len() - 1)
    }

    /// Run prepared statement `stmt` with text parameters: one write, then its replies, each row
    /// handed to `on_row` (the row's body: column count, then per column a length and bytes).
    pub fn run(&mut self, stmt: usize, params: &[Param], on_row: impl FnMut(&[u8]) -> Result<(), WireError>) -> Result<Outcome, WireError> {
        let mut out = std::mem::take(&mut self.wbuf);
        out.clear();
        // Bind: unnamed portal, the statement, all parameters text, all results text
        let name = self.names.get(stmt).ok_or_else(|| WireError::Protocol(format!("no prepared statement {stmt}")))?;
        out.push(wire::BIND);
        let at = out.len();
        out.extend_from_slice(&[0; 4]);
        out.push(0);
        out.extend_from_slice(name.as_bytes());
        out.push(0);
        out.extend_from_slice(&0u16.to_be_bytes());
        out.extend_from_slice(&(params.len() as u16).to_be_bytes());
        for p in params {
            match p {
                Some(v) => {
                    out.extend_from_slice(&(v.len() as i32).to_be_bytes());
                    out.extend_from_slice(v);
                }
                None => out.extend_from_slice(&(-1i32).to_be_bytes()),
            }
        }
        out.extend_from_slice(&0u16.to_be_bytes());
        let len = (out.len() - at) as u32;
        out[at..at + 4].copy_from_slice(&len.to_be_bytes());
        // Execute the unnamed portal, all rows; Sync
        out.extend_from_slice(&[wire::EXECUTE, 0, 0, 0, 9, 0, 0, 0, 0, 0]);
        out.extend_from_slice(&[wire::SYNC, 0, 0, 0, 4]);
        let r = self.send(&out);
        self.wbuf = out;
        r?;
        self.finish(on_row)
    }

    /// Run SQL text with the simple protocol (no parameters); its rows go to `on_row`.
    pub fn simple(&mut self, sql: &str, on_row: impl FnMut(&[u8]) -> Result<(), WireError>) -> Result<Outcome, WireError> {
        let msg = wire::query(sql);
        self.send(&msg)?;
        self.finish(on_row)
    }

    /// Read replies up to ReadyForQuery; the first ErrorResponse is the result.
    fn finish(&mut self, mut on_row: impl FnMut(&[u8]) -> Result<(), WireError>) -> Result<Outcome, WireError> {
        let mut out = Outcome::default();
        let mut failed: Option<WireError> = None;
        loop {
            let (kind, body) = self.next_message()?;
            match kind {
                wire::DATA_ROW if failed.is_none() => {
                    out.rows += 1;
                    if let Err(e) = on_row(body) {
                        failed = Some(e);
                    }
                }
                wire::COMMAND_COMPLETE => out.affected += tag_count(body),
                wire::ERROR if failed.is_none() => failed = Some(server_error(body)),
                wire::READY => {
                    return match failed {
                        Some(e) => Err(e),
                        None => Ok(out),
                    }
                }
                _ => {}
            }
        }
    }

    pub fn is_closed(&self) -> bool {
        self.closed
    }
}

impl Drop for PgWire {
    fn drop(&mut self) {
        if !self.closed {
            let _ = self.stream.write_all(&[wire::TERMINATE, 0, 0, 0, 4]);
        }
    }
}

fn push_cstr(out: &mut Vec<u8>, s: &str) {
    out.extend_from_slice(s.as_bytes());
    out.push(0);
}

fn server_error(body: &[u8]) -> WireError {
    let f = wire::error_fields(body);
    let get = |c: u8, d: &str| f.get(&c).cloned().unwrap_or_else(|| d.to_string());
    WireError::Server { severity: get(b'S', "ERROR"), code: get(b'C', ""), message: get(b'M', "") }
}

/// The row count at the end of a CommandComplete tag ("SELECT 3", "INSERT 0 1", "UPDATE 1").
fn tag_count(body: &[u8]) -> u64 {
    let tag = body.strip_suffix(&[0]).unwrap_or(body);
    match tag.iter().rposition(|b| *b == b' ') {
        Some(sp) => std::str::from_utf8(&tag[sp + 1..]).ok().and_then(|s| s.parse().ok()).unwrap_or(0),
        None => 0,
    }
}

/// The columns of a DataRow body, each `None` for NULL; checks the lengths add up.
pub fn columns(body: &[u8]) -> Result<impl Iterator<Item = Option<&[u8]>>, WireError> {
    let bad = || WireError::Protocol("malformed DataRow".into());
    let n = u16::from_be_bytes([*body.first().ok_or_else(bad)?, *body.get(1).ok_or_else(bad)?]) as usize;
    let mut spans = Vec::with_capacity(n);
    let mut p = 2;
    for _ in 0..n {
        let l = body.get(p..p + 4).ok_or_else(bad)?;
        let l = i32::from_be_bytes([l[0], l[1], l[2], l[3]]);
        p += 4;
        if l < 0 {
            spans.push(None);
        } else {
            let end = p + l as usize;
            if end > body.len() {
                return Err(bad());
            }
            spans.push(Some((p, end)));
            p = end;
        }
    }
    if p != body.len() {
        return Err(bad());
    }
    Ok(spans.into_iter().map(move |s| s.map(|(a, b)| &body[a..b])))
}

/// Walk a DataRow without copying: its column count, after checking that the lengths add up.
pub fn check_row(body: &[u8]) -> Result<usize, WireError> {
    let bad = || WireError::Protocol("malformed DataRow".into());
    let n = u16::from_be_bytes([*body.first().ok_or_else(bad)?, *body.get(1).ok_or_else(bad)?]) as usize;
    let mut p = 2;
    for _ in 0..n {
        let l = body.get(p..p + 4).ok_or_else(bad)?;
        let l = i32::from_be_bytes([l[0], l[1], l[2], l[3]]);
        p += 4;
        if l > 0 {
            p += l as usize;
        }
    }
    if p != body.len() {
        return Err(bad());
    }
    Ok(n)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(cols: &[Option<&[u8]>]) -> Vec<u8> {
        let mut b = (cols.len() as u16).to_be_bytes().to_vec();
        for c in cols {
            match c {
                Some(v) => {
                    b.extend_from_slice(&(v.len() as i32).to_be_bytes());
                    b.extend_from_slice(v);
                }
                None => b.extend_from_slice(&(-1i32).to_be_bytes()),
            }
        }
        b
    }

    #[test]
    fn data_rows_are_walked() {
        let b = row(&[Some(b"user1"), None, Some(b"")]);
        assert_eq!(check_row(&b).unwrap(), 3);
        let cols: Vec<Option<&[u8]>> = columns(&b).unwrap().collect();
        assert_eq!(cols, vec![Some(&b"user1"[..]), None, Some(&b""[..])]);
        assert!(check_row(&b[..b.len() - 1]).is_err());
        assert!(columns(&b[..7]).is_err());
    }

    use crate::oltp::db::tests::{auth_refusal, fake_server};
    use crate::oltp::error::{ConnectError, DsnError};

    fn login(reply: Vec<u8>) -> (String, Result<Option<PgWire>, ConnectError>) {
        let port = fake_server(reply);
        (format!("127.0.0.1:{port}"), PgWire::connect(&format!("host=127.0.0.1 port={port} user=x dbname=x"), Some("pw")))
    }

    #[test]
    fn a_bad_dsn_is_a_dsn_error() {
        let e = PgWire::connect("host=127.0.0.1 port=", None).err().expect("a bad DSN");
        assert!(matches!(&e, ConnectError::Dsn(DsnError::Postgres { dsn, .. }) if dsn == "host=127.0.0.1 port="), "{e:?}");
        assert!(e.to_string().starts_with("DSN \"host=127.0.0.1 port=\": invalid connection string"), "{e}");
    }

    #[test]
    fn a_refused_login_names_the_servers_error() {
        let (at, r) = login(auth_refusal());
        let e = r.err().expect("refused");
        assert!(matches!(&e, ConnectError::Refused { dbms: "PostgreSQL", at: a, .. } if *a == at), "{e:?}");
        assert_eq!(
            e.to_string(),
            format!("connecting to PostgreSQL at {at}: the server refused the login: FATAL 28P01: password authentication failed for user \"x\"")
        );
    }

    #[test]
    fn a_server_that_is_not_postgresql_is_unexpected() {
        // an HTTP server: "TTP/" read as a message length of 1.4 GB
        let (at, r) = login(b"HTTP/1.1 400 Bad Request\r\n\r\n".to_vec());
        let e = r.err().expect("not PostgreSQL");
        assert!(matches!(&e, ConnectError::Unexpected { what, .. } if what.starts_with("bad message length")), "{e:?}");
        assert!(
            e.to_string().starts_with(&format!("connecting to PostgreSQL at {at}: unexpected answer during the login: bad message length")),
            "{e}"
        );
        assert!(e.to_string().ends_with("(expected PostgreSQL's login exchange)"), "{e}");

        // well framed, but a data row before the login is over
        let mut reply = wire::frame(wire::AUTH, &0u32.to_be_bytes());
        reply.extend(wire::frame(wire::DATA_ROW, &0u16.to_be_bytes()));
        let (at, r) = login(reply);
        let e = r.err().expect("out of place");
        assert!(matches!(&e, ConnectError::Unexpected { what, .. } if what == "message type 'D' before ReadyForQuery"), "{e:?}");
        assert!(e.to_string().starts_with(&format!("connecting to PostgreSQL at {at}: unexpected answer during the login: message type 'D'")), "{e}");

        // the server closes the connection in the middle of the login
        let (at, r) = login(wire::frame(wire::AUTH, &0u32.to_be_bytes()));
        let e = r.err().expect("closed");
        assert!(matches!(&e, ConnectError::Lost { .. }), "{e:?}");
        assert!(e.to_string().starts_with(&format!("connecting to PostgreSQL at {at}: the connection broke during the login: ")), "{e}");
    }

    #[test]
    fn a_login_the_client_can_do_succeeds() {
        let mut reply = wire::frame(wire::AUTH, &0u32.to_be_bytes());
        reply.extend(wire::frame(wire::PARAMETER_STATUS, b"server_version\x0016.0\0"));
        reply.extend(wire::frame(BACKEND_KEY_DATA, &[0, 0, 0, 1, 0, 0, 0, 2]));
        reply.extend(wire::frame(wire::READY, b"I"));
        let (_, r) = login(reply);
        assert!(matches!(r, Ok(Some(_))));
        // md5: not this client's; the caller falls back to the `postgres` crate
        let mut md5 = 5u32.to_be_bytes().to_vec();
        md5.extend_from_slice(b"salt");
        let (_, r) = login(wire::frame(wire::AUTH, &md5));
        assert!(matches!(r, Ok(None)));
    }

    #[test]
    fn command_tags_count() {
        assert_eq!(tag_count(b"SELECT 3\0"), 3);
        assert_eq!(tag_count(b"INSERT 0 1\0"), 1);
        assert_eq!(tag_count(b"UPDATE 0\0"), 0);
        assert_eq!(tag_count(b"BEGIN\0"), 0);
    }
}
