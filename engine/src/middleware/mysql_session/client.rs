//! A client connection speaking the MySQL protocol: the session's state, its command loop, the
//! packets read from and queued for the client, and its end (an open transaction rolled back by
//! closing its connections).

use std::collections::HashMap;
use std::sync::Arc;

use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;
use tokio::task::JoinHandle;

use super::cluster::Cluster;
use super::prepared::{PStmt, CURSORS_UNSUPPORTED};
use super::write::Txn;
use crate::middleware::client_io::ClientIo;
use crate::middleware::mysql_wire::{self as my, MyError};
use crate::middleware::{log, Manager};

/// the longest command a client may send (bytes)
pub(super) const MAX_COMMAND: usize = 1 << 30;

pub(super) use crate::middleware::client_io::{Fail, SResult};

impl From<MyError> for Fail {
    fn from(e: MyError) -> Fail {
        Fail::End(Some(e.to_string()))
    }
}

/// One client connection speaking the MySQL protocol.
pub(super) struct Session {
    pub(super) c: Arc<Cluster>,
    pub(super) m: Arc<Manager>,
    pub(super) id: u32,
    /// the client's socket, its unread bytes and the answers queued for it
    pub(super) io: ClientIo,
    /// prepared by the client, by the session's own ids
    pub(super) stmts: HashMap<u32, PStmt>,
    pub(super) next_stmt: u32,
    pub(super) txn: Option<Txn>,
    pub(super) last_write: Option<JoinHandle<Option<Txn>>>,
    /// a plain BEGIN answered here and not sent yet (its COM_QUERY payload): it goes to the
    /// backends in front of the transaction's first statement, its answer hidden
    pub(super) pending_begin: Option<Vec<u8>>,
}

impl Session {
    pub(super) fn new(c: Arc<Cluster>, stream: TcpStream, id: u32) -> Session {
        let m = c.m.clone();
        Session { c, m, id, io: ClientIo::new(stream), stmts: HashMap::new(), next_stmt: 1, txn: None, last_write: None, pending_begin: None }
    }

    pub(super) async fn run(mut self) {
        self.m.count(|c| c.sessions += 1);
        if let Err(Fail::End(Some(why))) = self.serve().await {
            log(&format!("session {}: {why}", self.id));
        }
        self.end().await;
    }

    pub(super) fn status_flags(&self) -> u16 {
        if self.txn.is_some() || self.pending_begin.is_some() {
            my::STATUS_IN_TRANS
        } else {
            my::STATUS_AUTOCOMMIT
        }
    }

    /// An answer of one packet (sequence id 1 unless said) queued for the client.
    pub(super) fn reply(&mut self, payload: &[u8], seq: u8) {
        my::packet_into(&mut self.io.out, seq, payload);
    }

    pub(super) fn refuse(&mut self, code: u16, message: &str, state: &str) {
        self.m.count(|c| c.errors_to_clients += 1);
        self.reply(&my::err(code, message, state), 1);
    }

    pub(super) async fn flush(&mut self) -> SResult<()> {
        Ok(self.io.flush().await?)
    }

    /// At least `n` unread bytes in the client's buffer.
    pub(super) async fn fill(&mut self, n: usize) -> SResult<()> {
        Ok(self.io.fill(n).await?)
    }

    /// The client's next (sequence id, payload), a split payload joined (at most `limit` bytes).
    pub(super) async fn read_packet(&mut self, limit: usize) -> SResult<(u8, Vec<u8>)> {
        let mut out = Vec::new();
        loop {
            self.fill(4).await?;
            let (n, seq) = my::header(&self.io.inbuf, self.io.inpos);
            if out.len() + n > limit {
                return Err(Fail::End(Some(format!("a command of more than {limit} bytes"))));
            }
            self.fill(4 + n).await?;
            out.extend_from_slice(&self.io.inbuf[self.io.inpos + 4..self.io.inpos + 4 + n]);
            self.io.inpos += 4 + n;
            if n < my::MAX_PAYLOAD {
                return Ok((seq, out));
            }
        }
    }

    pub(super) async fn serve(&mut self) -> SResult<()> {
        if !self.login().await? {
            return Ok(());
        }
        loop {
            let (_, payload) = self.read_packet(MAX_COMMAND).await?;
            let Some(&cmd) = payload.first() else {
                return Err(Fail::End(Some("an empty command packet".into())));
            };
            self.collect_last_write().await;
            match cmd {
                my::COM_QUERY => self.query(payload).await?,
                my::COM_QUIT => return Ok(()),
                my::COM_PING => self.reply(&my::ok(0, 0, self.status_flags()), 1),
                my::COM_INIT_DB => {
                    let name = String::from_utf8_lossy(&payload[1..]).into_owned();
                    self.use_db(&name);
                }
                my::COM_RESET_CONNECTION => {
                    self.reset().await;
                    self.reply(&my::ok(0, 0, self.status_flags()), 1);
                }
                my::COM_SET_OPTION => self.reply(&my::eof(self.status_flags()), 1), // the backends allow multiple statements anyway
                my::COM_STMT_PREPARE => self.stmt_prepare(payload[1..].to_vec()).await?,
                my::COM_STMT_EXECUTE => self.stmt_execute(&payload).await?,
                my::COM_STMT_CLOSE | my::COM_STMT_SEND_LONG_DATA | my::COM_STMT_RESET => self.stmt_other(cmd, &payload),
                my::COM_STMT_FETCH => self.refuse(my::ER_NOT_SUPPORTED_YET, CURSORS_UNSUPPORTED, "42000"),
                _ => self.refuse(my::ER_UNKNOWN_COM, &format!("command 0x{cmd:02x} is not supported by the middleware"), "08S01"),
            }
            self.flush().await?;
        }
    }

    /// A write answered before every backend ran it is over: its transaction, if any, is the session's.
    pub(super) async fn collect_last_write(&mut self) {
        if self.last_write.as_ref().is_some_and(|h| h.is_finished()) {
            if let Some(h) = self.last_write.take() {
                if let Ok(Some(txn)) = h.await {
                    self.txn = Some(txn);
                }
            }
        }
    }

    /// COM_RESET_CONNECTION (and the end): an open transaction is rolled back (its connections closed).
    pub(super) async fn reset(&mut self) {
        self.pending_begin = None; // never sent: nothing to roll back
        if let Some(h) = self.last_write.take() {
            if let Ok(Some(txn)) = h.await {
                self.txn = Some(txn);
            }
        }
        if let Some(txn) = self.txn.take() {
            for (b, mut conn) in txn.conns {
                conn.close();
                self.c.release(b, conn);
            }
            // connections closed: their transaction is rolled back, on a replay too
            self.m.log_rollback();
            drop(txn.guard);
        }
    }

    pub(super) async fn end(&mut self) {
        self.reset().await;
        let _ = self.io.wr.shutdown().await;
    }
}
