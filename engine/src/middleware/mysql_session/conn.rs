//! One authenticated MySQL-protocol session on a backend (mysql_native_password): the login, the
//! packets read, statements prepared on it (up to `STMT_CACHE`, the oldest closed beyond), and the
//! middleware's own statements run on it.

use std::collections::{HashMap, VecDeque};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::OwnedSemaphorePermit;

use crate::middleware::mysql_wire::{self as my, MyError};
use crate::middleware::pool::{BackendError, RECV_SIZE};

/// statements kept prepared per backend connection at most (the oldest is closed beyond)
pub const STMT_CACHE: usize = 256;

/// One authenticated MySQL-protocol session on a backend (mysql_native_password), with the
/// statements prepared on it (by their SQL).
pub struct MyConn {
    pub(super) stream: TcpStream,
    pub(super) buf: Vec<u8>,
    pub(super) pos: usize,
    /// the server status flags of the last OK/EOF
    pub(super) status: u16,
    pub(super) broken: bool,
    pub(super) reused: bool,
    pub(super) version: String,
    /// SQL -> the backend's statement id, and the order they were prepared in
    pub(super) stmts: HashMap<Vec<u8>, u32>,
    pub(super) order: VecDeque<Vec<u8>>,
    pub(super) permit: Option<OwnedSemaphorePermit>,
}

/// The answer to a COM_STMT_PREPARE: its packets (sequence id, payload), the statement id (None
/// when it failed) and the error text.
pub(super) struct Prepared {
    pub(super) packets: Vec<(u8, Vec<u8>)>,
    pub(super) sid: Option<u32>,
    pub(super) error: Option<String>,
}

pub(super) fn io_err(e: std::io::Error) -> BackendError {
    BackendError(e.to_string())
}

pub(super) fn proto_err(e: MyError) -> BackendError {
    BackendError(e.to_string())
}

impl MyConn {
    pub(super) async fn open(host: &str, port: u16, user: &str, password: &str, database: &str, timeout: Duration) -> Result<MyConn, BackendError> {
        let stream = match tokio::time::timeout(timeout, TcpStream::connect((host, port))).await {
            Ok(Ok(s)) => s,
            Ok(Err(e)) => return Err(BackendError(format!("cannot connect to {host}:{port}: {e}"))),
            Err(_) => return Err(BackendError(format!("cannot connect to {host}:{port}: timed out"))),
        };
        let _ = stream.set_nodelay(true);
        let mut conn = MyConn {
            stream,
            buf: Vec::with_capacity(RECV_SIZE),
            pos: 0,
            status: my::STATUS_AUTOCOMMIT,
            broken: false,
            reused: false,
            version: String::new(),
            stmts: HashMap::new(),
            order: VecDeque::new(),
            permit: None,
        };
        match tokio::time::timeout(timeout, conn.login(user, password, database)).await {
            Ok(Ok(())) => Ok(conn),
            Ok(Err(e)) => Err(BackendError(format!("{host}:{port}: login failed: {e}"))),
            Err(_) => Err(BackendError(format!("{host}:{port}: login failed: timed out"))),
        }
    }

    pub(super) async fn login(&mut self, user: &str, password: &str, database: &str) -> Result<(), BackendError> {
        let (seq, payload) = self.read_packet().await?;
        if payload.first() == Some(&0xFF) {
            return Err(BackendError(my::err_text(&payload)));
        }
        let hs = my::parse_handshake(&payload).map_err(proto_err)?;
        self.version = hs.version.clone();
        let caps = my::BACKEND_CAPS & (hs.caps | my::LONG_PASSWORD);
        for need in [my::PROTOCOL_41, my::SECURE_CONNECTION] {
            if caps & need == 0 {
                return Err(BackendError(format!("the backend ({}) lacks capability 0x{need:x}", hs.version)));
            }
        }
        let auth = my::scramble_native(password, &hs.salt);
        let resp = my::handshake_response(caps, user, &auth, Some(database), my::NATIVE_PASSWORD);
        self.stream.write_all(&my::packet(seq.wrapping_add(1), &resp)).await.map_err(io_err)?;
        loop {
            let (seq, payload) = self.read_packet().await?;
            match payload.first() {
                Some(0x00) => {
                    self.status = my::parse_ok(&payload).map_err(proto_err)?.2;
                    return Ok(());
                }
                Some(0xFF) => return Err(BackendError(my::err_text(&payload))),
                Some(0xFE) => {
                    // AuthSwitchRequest
                    let (plugin, pos) = my::cstring(&payload, 1);
                    if plugin != my::NATIVE_PASSWORD.as_bytes() {
                        return Err(BackendError(format!(
                            "the backend asks for authentication plugin '{}'; the middleware logs in with {} only",
                            String::from_utf8_lossy(plugin),
                            my::NATIVE_PASSWORD
                        )));
                    }
                    let salt = payload.get(pos..(pos + 20).min(payload.len())).unwrap_or(&[]).to_vec();
                    let answer = my::scramble_native(password, &salt);
                    self.stream.write_all(&my::packet(seq.wrapping_add(1), &answer)).await.map_err(io_err)?;
                }
                other => return Err(BackendError(format!("unexpected packet 0x{:02x} during login", other.copied().unwrap_or(0)))),
            }
        }
    }

    /// Whatever the backend sent next, appended to `buf` (consumed bytes dropped first).
    pub(super) async fn more(&mut self) -> std::io::Result<()> {
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

    /// The next (sequence id, payload), a split payload joined.
    pub(super) async fn read_packet(&mut self) -> Result<(u8, Vec<u8>), BackendError> {
        let mut out = Vec::new();
        loop {
            while self.buf.len() - self.pos < 4 {
                self.more().await.map_err(io_err)?;
            }
            let (n, seq) = my::header(&self.buf, self.pos);
            while self.buf.len() - self.pos < 4 + n {
                self.more().await.map_err(io_err)?;
            }
            out.extend_from_slice(&self.buf[self.pos + 4..self.pos + 4 + n]);
            self.pos += 4 + n;
            if n < my::MAX_PAYLOAD {
                return Ok((seq, out));
            }
        }
    }

    /// COM_STMT_PREPARE `sql` here (the oldest statement closed first when STMT_CACHE are).
    pub(super) async fn prepare(&mut self, sql: &[u8]) -> Result<Prepared, BackendError> {
        let mut out = Vec::with_capacity(sql.len() + 16);
        if self.order.len() >= STMT_CACHE {
            if let Some(old) = self.order.pop_front() {
                if let Some(id) = self.stmts.remove(&old) {
                    let mut close = vec![my::COM_STMT_CLOSE];
                    close.extend_from_slice(&id.to_le_bytes());
                    my::packet_into(&mut out, 0, &close); // no answer
                }
            }
        }
        let mut cmd = Vec::with_capacity(sql.len() + 1);
        cmd.push(my::COM_STMT_PREPARE);
        cmd.extend_from_slice(sql);
        my::packet_into(&mut out, 0, &cmd);
        self.stream.write_all(&out).await.map_err(io_err)?;
        let (seq, first) = self.read_packet().await?;
        if first.first() == Some(&0xFF) {
            let error = Some(my::err_text(&first));
            return Ok(Prepared { packets: vec![(seq, first)], sid: None, error });
        }
        if first.first() != Some(&0) || first.len() < 12 {
            return Err(BackendError(format!("unexpected answer to COM_STMT_PREPARE: 0x{:02x}", first.first().copied().unwrap_or(0))));
        }
        let sid = my::u32_at(&first, 1).map_err(proto_err)?;
        let columns = my::u16_at(&first, 5).map_err(proto_err)? as usize;
        let params = my::u16_at(&first, 7).map_err(proto_err)? as usize;
        let mut packets = vec![(seq, first)];
        for n in [params, columns] {
            for _ in 0..if n > 0 { n + 1 } else { 0 } {
                packets.push(self.read_packet().await?); // the definitions, then an EOF
            }
        }
        self.stmts.insert(sql.to_vec(), sid);
        self.order.push_back(sql.to_vec());
        Ok(Prepared { packets, sid: Some(sid), error: None })
    }

    pub(super) fn close(&mut self) {
        self.broken = true;
    }

    /// Run one statement of the middleware's own: the first column of its rows, or the error.
    pub(super) async fn simple(&mut self, text: &str) -> Result<Vec<Option<String>>, String> {
        let mut cmd = vec![my::COM_QUERY];
        cmd.extend_from_slice(text.as_bytes());
        self.stream.write_all(&my::packet(0, &cmd)).await.map_err(|e| e.to_string())?;
        let (_, first) = self.read_packet().await.map_err(|e| e.0)?;
        match first.first() {
            Some(0xFF) => return Err(my::err_text(&first)),
            Some(0x00) => {
                self.status = my::parse_ok(&first).map_err(|e| e.to_string())?.2;
                return Ok(Vec::new());
            }
            _ => {}
        }
        let columns = my::lenenc_int(&first, 0).map_err(|e| e.to_string())?.0;
        for _ in 0..=columns {
            self.read_packet().await.map_err(|e| e.0)?; // the definitions, then an EOF
        }
        let mut rows = Vec::new();
        loop {
            let (_, p) = self.read_packet().await.map_err(|e| e.0)?;
            match p.first() {
                Some(0xFE) if p.len() < 9 => {
                    self.status = my::u16_at(&p, 3).unwrap_or(self.status);
                    return Ok(rows);
                }
                Some(0xFF) => return Err(my::err_text(&p)),
                Some(0xFB) => rows.push(None),
                _ => {
                    let (n, at) = my::lenenc_int(&p, 0).map_err(|e| e.to_string())?;
                    rows.push(p.get(at..at + n as usize).map(|v| String::from_utf8_lossy(v).into_owned()));
                }
            }
        }
    }
}

/// Close a connection politely (COM_QUIT, when the socket takes it at once).
pub(super) fn quit(conn: MyConn) {
    let _ = conn.stream.try_write(&my::packet(0, &[my::COM_QUIT]));
}
