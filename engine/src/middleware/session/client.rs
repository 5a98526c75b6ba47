//! A client connection: the session's state, its message loop (units of work collected up to Sync
//! or a Query, a Flush opening a flushed unit), the reads and writes of client bytes, and its end
//! (a transaction or flushed unit left open rolled back by closing its connections).

use std::collections::HashMap;
use std::sync::Arc;

use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;
use tokio::task::JoinHandle;

use super::open::OpenUnit;
use super::write::Txn;
use crate::middleware::client_io::ClientIo;
use crate::middleware::wire::{self, Message, Parse, ProtocolError};
use crate::middleware::{log, Manager};

pub(super) use crate::middleware::client_io::{Fail, SResult};

impl From<ProtocolError> for Fail {
    fn from(e: ProtocolError) -> Fail {
        Fail::End(Some(e.0))
    }
}

pub struct Session {
    pub(super) m: Arc<Manager>,
    pub(super) id: u32,
    /// the client's socket, its unread bytes and the answers queued for it
    pub(super) io: ClientIo,
    pub(super) statements: HashMap<String, Arc<Parse>>,
    pub(super) unnamed: Option<Arc<Parse>>,
    /// pinned connections of an open transaction, the lock held
    pub(super) txn: Option<Txn>,
    pub(super) last_write: Option<JoinHandle<Option<Txn>>>,
    pub(super) open: Option<OpenUnit>,
    /// a plain BEGIN answered here and not sent yet: it goes to the backends with the
    /// transaction's first unit (one round trip fewer under the write lock)
    pub(super) pending_begin: Option<Message>,
    /// it ran SET or RESET: its settings (a search path, an isolation level) may not be the ones
    /// the row scheduler's facts hold, so its writes hold the whole database
    pub(super) unscoped: bool,
    /// with a recovery log under the row scheduler: the bytes of the open transaction's units that
    /// are not in the log yet (they go there as one record with the unit that commits it)
    pub(super) unlogged: Vec<u8>,
    /// the open transaction has units in the log already (a record each): leaving it open rolls
    /// it back in the log too
    pub(super) txn_logged: bool,
}

impl Session {
    pub fn new(m: Arc<Manager>, stream: TcpStream, id: u32) -> Session {
        Session {
            m,
            id,
            io: ClientIo::new(stream),
            statements: HashMap::new(),
            unnamed: None,
            txn: None,
            last_write: None,
            open: None,
            pending_begin: None,
            unscoped: false,
            unlogged: Vec::new(),
            txn_logged: false,
        }
    }

    pub async fn run(mut self) {
        self.m.count(|c| c.sessions += 1);
        match self.serve().await {
            Ok(()) | Err(Fail::End(None)) | Err(Fail::NoBackend(_)) => {}
            Err(Fail::End(Some(why))) => log(&format!("session {}: {why}", self.id)),
        }
        self.end().await;
    }

    pub(super) async fn serve(&mut self) -> SResult<()> {
        if !self.startup().await? {
            return Ok(());
        }
        let mut unit: Vec<Message> = Vec::new();
        loop {
            let msg = self.next_message().await?;
            match msg.kind {
                wire::TERMINATE => return Ok(()),
                wire::PARSE | wire::BIND | wire::DESCRIBE | wire::EXECUTE | wire::CLOSE => {
                    unit.push(msg); // nothing to answer yet: the unit goes on
                    continue;
                }
                wire::QUERY if self.open.is_none() => self.dispatch(vec![msg]).await?,
                wire::QUERY => {
                    unit.push(msg);
                    self.open_step(std::mem::take(&mut unit), true).await?;
                }
                wire::SYNC => {
                    unit.push(msg);
                    if self.open.is_some() {
                        self.open_step(std::mem::take(&mut unit), true).await?;
                    } else {
                        self.dispatch(std::mem::take(&mut unit)).await?;
                    }
                }
                wire::FLUSH if self.open.is_none() && unit.is_empty() => {} // nothing is waiting to be flushed
                wire::FLUSH => {
                    unit.push(msg);
                    if self.open.is_none() {
                        self.begin_now().await?;
                        match self.open_begin().await {
                            Ok(()) => {}
                            Err(Fail::NoBackend(e)) => {
                                self.io.out.extend_from_slice(&wire::error(&e, "08006", "ERROR"));
                                unit.clear();
                                self.flush().await?;
                                continue;
                            }
                            Err(e) => return Err(e),
                        }
                    }
                    self.open_step(std::mem::take(&mut unit), false).await?;
                }
                k => {
                    self.io.out.extend_from_slice(&wire::error(
                        &format!("message type b'{}' is not supported by the middleware", k as char),
                        "0A000",
                        "ERROR",
                    ));
                    self.io.out.extend_from_slice(&wire::ready(self.status()));
                }
            }
            self.flush().await?;
        }
    }

    pub(super) async fn flush(&mut self) -> SResult<()> {
        Ok(self.io.flush().await?)
    }

    /// At least `n` unread bytes in the client's buffer.
    pub(super) async fn fill(&mut self, n: usize) -> SResult<()> {
        Ok(self.io.fill(n).await?)
    }

    pub(super) async fn next_message(&mut self) -> SResult<Message> {
        self.fill(5).await?;
        let n = wire::header_length(&self.io.inbuf, self.io.inpos)?;
        self.fill(5 + n).await?;
        let p = self.io.inpos;
        let msg = Message { kind: self.io.inbuf[p], body: self.io.inbuf[p + 5..p + 5 + n].to_vec() };
        self.io.inpos += 5 + n;
        Ok(msg)
    }

    pub(super) fn status(&self) -> u8 {
        if self.txn.is_some() || self.pending_begin.is_some() {
            b'T'
        } else {
            b'I'
        }
    }

    pub(super) async fn end(&mut self) {
        if let Some(h) = self.last_write.take() {
            if let Ok(Some(txn)) = h.await {
                self.txn = Some(txn);
            }
        }
        if let Some(ou) = self.open.take() {
            // the client left in the middle of a flushed unit
            let idx: Vec<usize> = ou.slots.iter().map(|s| s.b).collect();
            self.abandon_open(ou);
            self.writes_over(&idx);
        } else if let Some(txn) = self.txn.take() {
            // the client left inside a transaction: roll it back by closing
            for (b, mut conn) in txn.lease {
                conn.close();
                self.m.backends[b].pool.release(conn);
            }
            if self.txn_logged {
                self.m.log_rollback();
            }
            drop(txn.guard);
        }
        let _ = self.io.wr.shutdown().await;
    }
}
