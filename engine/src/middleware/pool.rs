//! Connections to one database server (a backend) and their bounded pool.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use super::{scram, wire};

/// bytes asked for per read from a socket (at least)
pub const RECV_SIZE: usize = 65536;

/// A backend could not be reached or broke the protocol (not an SQL error).
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct BackendError(pub String);

/// One open, authenticated session on a backend, idle between units of work.
pub struct Conn {
    pub stream: TcpStream,
    /// bytes received and not consumed yet (from `pos`)
    pub buf: Vec<u8>,
    pub pos: usize,
    pub parameters: Vec<(String, String)>,
    /// transaction status from the last ReadyForQuery
    pub status: u8,
    pub broken: bool,
    /// taken from the idle list (not opened for this use)
    pub reused: bool,
    /// statements prepared on this connection by the proxy: text -> (parameter types, server name)
    pub stmts: HashMap<String, (Vec<u8>, String)>,
    stmt_seq: u64,
    /// the manager's statement epoch these were prepared in
    pub stmts_epoch: u64,
    permit: Option<OwnedSemaphorePermit>,
}

/// statements kept prepared on one backend connection at most
pub const STMTS_MAX: usize = 256;

impl Conn {
    async fn open(host: &str, port: u16, user: &str, password: &str, database: &str, timeout: Duration) -> Result<Conn, BackendError> {
        let stream = match tokio::time::timeout(timeout, TcpStream::connect((host, port))).await {
            Ok(Ok(s)) => s,
            Ok(Err(e)) => return Err(BackendError(format!("cannot connect to {host}:{port}: {e}"))),
            Err(_) => return Err(BackendError(format!("cannot connect to {host}:{port}: timed out"))),
        };
        let _ = stream.set_nodelay(true);
        let mut conn = Conn {
            stream,
            buf: Vec::with_capacity(RECV_SIZE),
            pos: 0,
            parameters: Vec::new(),
            status: b'I',
            broken: false,
            reused: false,
            stmts: HashMap::new(),
            stmt_seq: 0,
            stmts_epoch: 0,
            permit: None,
        };
        match tokio::time::timeout(timeout, conn.startup(user, password, database)).await {
            Ok(Ok(())) => Ok(conn),
            Ok(Err(e)) => Err(BackendError(format!("{host}:{port}: startup failed: {e}"))),
            Err(_) => Err(BackendError(format!("{host}:{port}: startup failed: timed out"))),
        }
    }

    /// Log in as `user` with `password` (scram-sha-256, what the lab's servers require; cleartext
    /// when a server asks for it) and read the session's parameters up to ReadyForQuery.
    async fn startup(&mut self, user: &str, password: &str, database: &str) -> Result<(), BackendError> {
        let msg = wire::startup_message(&[("user", user), ("database", database), ("client_encoding", "UTF8")]);
        self.stream.write_all(&msg).await.map_err(|e| BackendError(e.to_string()))?;
        let mut client: Option<scram::Client> = None;
        let scram_err = |e: scram::ScramError| BackendError(format!("SCRAM: {e}"));
        loop {
            let (kind, body) = self.read_message().await?;
            match kind {
                wire::AUTH => {
                    let code = body.get(..4).map(|b| u32::from_be_bytes([b[0], b[1], b[2], b[3]])).unwrap_or(u32::MAX);
                    let data = body.get(4..).unwrap_or(&[]);
                    let reply = match code {
                        0 => continue,
                        wire::AUTH_CLEARTEXT | scram::SASL if password.is_empty() => {
                            return Err(BackendError(format!("the backend asks for a password (method {code}) and the middleware has none")));
                        }
                        wire::AUTH_CLEARTEXT => {
                            let mut p = password.as_bytes().to_vec();
                            p.push(0);
                            wire::frame(wire::PASSWORD, &p)
                        }
                        scram::SASL => {
                            let offered = wire::sasl_mechanisms(data);
                            if !offered.iter().any(|m| m == scram::MECHANISM) {
                                return Err(BackendError(format!("the backend offers {offered:?}, not {}", scram::MECHANISM)));
                            }
                            let c = scram::Client::new(password);
                            let m = wire::sasl_initial(scram::MECHANISM, &c.first());
                            client = Some(c);
                            m
                        }
                        scram::SASL_CONTINUE if client.is_some() => {
                            let c = client.as_mut().expect("checked");
                            wire::frame(wire::PASSWORD, &c.finish(data).map_err(scram_err)?)
                        }
                        scram::SASL_FINAL if client.is_some() => {
                            client.as_ref().expect("checked").verify(data).map_err(scram_err)?;
                            continue;
                        }
                        _ => {
                            return Err(BackendError(format!(
                                "the backend asks for authentication method {code}, which the middleware lacks (it speaks scram-sha-256 and cleartext)"
                            )));
                        }
                    };
                    self.stream.write_all(&reply).await.map_err(|e| BackendError(e.to_string()))?;
                }
                wire::PARAMETER_STATUS => {
                    let (name, p) = wire::cstring(&body, 0).map_err(|e| BackendError(e.0))?;
                    let (value, _) = wire::cstring(&body, p).map_err(|e| BackendError(e.0))?;
                    self.parameters.push((name, value));
                }
                wire::ERROR => return Err(BackendError(wire::error_text(&body))),
                wire::READY => {
                    self.status = body.first().copied().unwrap_or(b'I');
                    return Ok(());
                }
                _ => {}
            }
        }
    }

    /// The next message (type, body).
    pub async fn read_message(&mut self) -> Result<(u8, Vec<u8>), BackendError> {
        loop {
            let avail = self.buf.len() - self.pos;
            if avail >= 5 {
                let n = wire::header_length(&self.buf, self.pos).map_err(|e| BackendError(e.0))?;
                if avail >= 5 + n {
                    let kind = self.buf[self.pos];
                    let body = self.buf[self.pos + 5..self.pos + 5 + n].to_vec();
                    self.pos += 5 + n;
                    return Ok((kind, body));
                }
            }
            self.more().await.map_err(|e| BackendError(e.to_string()))?;
        }
    }

    /// Whatever the backend sent next, appended to `buf` (consumed bytes dropped first).
    pub async fn more(&mut self) -> std::io::Result<()> {
        if self.pos > 0 {
            self.buf.drain(..self.pos);
            self.pos = 0;
        }
        if self.buf.capacity() - self.buf.len() < RECV_SIZE / 4 {
            self.buf.reserve(RECV_SIZE);
        }
        let n = self.stream.read_buf(&mut self.buf).await?;
        if n == 0 {
            return Err(std::io::Error::new(std::io::ErrorKind::UnexpectedEof, "the backend closed the connection"));
        }
        Ok(())
    }

    /// A new server-side statement name on this connection (never reused).
    pub fn next_statement_name(&mut self) -> String {
        self.stmt_seq += 1;
        format!("_tierscope_{}", self.stmt_seq)
    }

    /// Mark it broken: the pool closes it instead of keeping it.
    pub fn close(&mut self) {
        self.broken = true;
    }
}

/// At most `size` connections to one backend; `acquire` waits for a free one.
pub struct Pool {
    pub host: String,
    pub port: u16,
    pub user: String,
    password: String,
    pub database: String,
    pub size: usize,
    idle: Mutex<Vec<Conn>>,
    slots: Arc<Semaphore>,
    pub opened: AtomicU64,
}

impl Pool {
    pub fn new(host: &str, port: u16, user: &str, password: &str, database: &str, size: usize) -> Pool {
        Pool {
            host: host.to_string(),
            port,
            user: user.to_string(),
            password: password.to_string(),
            database: database.to_string(),
            size,
            idle: Mutex::new(Vec::new()),
            slots: Arc::new(Semaphore::new(size)),
            opened: AtomicU64::new(0),
        }
    }

    pub async fn acquire(&self) -> Result<Conn, BackendError> {
        let permit = self.slots.clone().acquire_owned().await.map_err(|_| BackendError("the pool is closed".into()))?;
        let idle = self.idle.lock().expect("pool lock").pop();
        let mut conn = match idle {
            Some(mut c) => {
                c.reused = true;
                c
            }
            None => {
                let c = Conn::open(&self.host, self.port, &self.user, &self.password, &self.database, Duration::from_secs(10)).await?;
                self.opened.fetch_add(1, Ordering::Relaxed);
                c
            }
        };
        conn.permit = Some(permit);
        Ok(conn)
    }

    /// An idle connection at once, when one is idle and a slot is free (no waiting, no opening).
    pub fn try_acquire_idle(&self) -> Option<Conn> {
        let permit = self.slots.clone().try_acquire_owned().ok()?;
        let mut conn = self.idle.lock().expect("pool lock").pop()?;
        conn.reused = true;
        conn.permit = Some(permit);
        Some(conn)
    }

    pub fn release(&self, mut conn: Conn) {
        let permit = conn.permit.take();
        if !conn.broken && conn.status == b'I' && conn.pos == conn.buf.len() {
            conn.buf.clear();
            conn.pos = 0;
            self.idle.lock().expect("pool lock").push(conn);
        } else {
            terminate(conn);
        }
        drop(permit);
    }

    /// Close every idle connection (after one turned out broken, or the backend was disabled).
    pub fn drop_idle(&self) {
        let idle: Vec<Conn> = std::mem::take(&mut *self.idle.lock().expect("pool lock"));
        for c in idle {
            terminate(c);
        }
    }
}

/// Close a connection politely (Terminate, when the socket takes it at once).
fn terminate(conn: Conn) {
    let _ = conn.stream.try_write(&wire::frame(wire::TERMINATE, b""));
}
