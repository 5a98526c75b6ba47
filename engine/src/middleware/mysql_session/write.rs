//! Writes: a connection on every enabled backend under the write lock (or the open
//! transaction's), the unit broadcast and the client answered by the wait policy (its record
//! appended to the recovery log first), then the settling: backends that failed where another
//! succeeded disabled, and the connections and the lock kept for a transaction the unit left open.

use std::sync::Arc;
use std::time::Instant;

use futures_util::stream::{FuturesUnordered, StreamExt};
use tokio::sync::{oneshot, OwnedMutexGuard};
use tokio::task::JoinSet;

use super::client::{Fail, SResult, Session};
use super::cluster::Cluster;
use super::conn::MyConn;
use super::execute::{execute, Exec, Sink};
use super::outgoing::{Outgoing, Unit};
use super::record::{log_unit, Logging};
use crate::middleware::answer;
use crate::middleware::log;
use crate::middleware::mysql_wire as my;
use crate::middleware::recovery;
use crate::middleware::sql;

/// An explicit transaction: its connections (one per backend still in it) and the write lock.
pub(super) struct Txn {
    pub(super) conns: Vec<(usize, MyConn)>,
    pub(super) guard: OwnedMutexGuard<()>,
}

/// One backend's complete answer to a write unit.
pub(super) type Res = answer::Res<MyConn, u16>;

/// The answer a write unit gives the client.
pub(super) struct Answer {
    pub(super) replies: Vec<u8>,
    pub(super) ok: bool,
    pub(super) status: u16,
    /// the unit could not be appended to the recovery log (the client must not be answered)
    pub(super) log_error: Option<String>,
}

impl Session {
    /// A connection on every enabled backend with the write lock held (or the transaction's
    /// pinned connections), and whether they are the transaction's.
    pub(super) async fn lease_for_write(&mut self) -> SResult<(Vec<(usize, MyConn)>, OwnedMutexGuard<()>, bool)> {
        // the previous write holds the write lock until every backend ran it: wait for it here (the
        // lock would wait as long), so a transaction it opened on a slower backend (status flags
        // that differed) becomes this session's instead of keeping the lock forever
        if let Some(h) = self.last_write.take() {
            if let Ok(Some(txn)) = h.await {
                self.txn = Some(txn);
            }
        }
        if let Some(txn) = self.txn.take() {
            return Ok((txn.conns, txn.guard, true));
        }
        let t0 = Instant::now();
        let guard = self.m.write_lock.clone().lock_owned().await;
        let waited = t0.elapsed().as_secs_f64();
        self.m.count(|c| c.write_lock_wait_s += waited);
        let targets = self.m.enabled();
        if targets.is_empty() {
            return Err(Fail::NoBackend("no database backend is enabled".into()));
        }
        let mut set = JoinSet::new();
        for &b in &targets {
            let c = self.c.clone();
            set.spawn(async move { (b, c.pools[b].acquire().await) });
        }
        let mut conns = Vec::new();
        while let Some(j) = set.join_next().await {
            match j {
                Ok((b, Ok(conn))) => conns.push((b, conn)),
                Ok((b, Err(err))) => self.c.disable_unreachable(b, &format!("write failed: cannot get a connection: {err}")),
                Err(_) => {}
            }
        }
        if conns.is_empty() {
            return Err(Fail::NoBackend("no database backend could be reached for a write".into()));
        }
        conns.sort_by_key(|c| c.0);
        Ok((conns, guard, false))
    }

    pub(super) async fn write(&mut self, unit: &Unit, text: &str) -> SResult<()> {
        let (conns, guard, pinned) = self.lease_for_write().await?;
        let mut out = self.outgoing(unit, text, Some(sql::now_micros()));
        let begins = self.pending_begin.take().map(|begin| {
            // the BEGIN answered earlier goes first, its answer hidden
            out.pre = [my::packet(0, &begin), std::mem::take(&mut out.pre)].concat();
            out.passed.insert(0, false);
        });
        // the recovery log: a number and the record, appended under the write lock (the log's
        // order is the units'); fsync'd before the client is answered when no transaction is open
        // (by `broadcast`, once the answer is known: the AUTO_INCREMENT value it took goes in the
        // record); fsync'd before the client is answered when no transaction is open
        let logging = self.m.recovery.clone().map(|log| {
            let seq = log.take_seq();
            out.seq = Some(seq);
            out.opens = begins.is_some() || recovery::my_opens_transaction(text);
            let command = match unit {
                Unit::Query(p) => p.clone(),
                Unit::Execute(sql, body) => recovery::my_execute_command(sql, body),
            };
            Logging { log, seq, pre: out.pre.clone(), post: out.post.clone(), command }
        });
        let out = Arc::new(out);
        self.m.count(|c| c.writes += 1);
        let (tx, rx) = oneshot::channel();
        self.m.inflight_add(1);
        let handle = tokio::spawn(broadcast(self.c.clone(), conns, guard, out, tx, logging));
        let Ok(answer) = rx.await else {
            return Err(Fail::End(Some("a write failed unexpectedly".into())));
        };
        if let Some(e) = answer.log_error {
            log(&e);
            return Err(Fail::End(Some(e)));
        }
        self.io.out.extend_from_slice(&answer.replies);
        if !answer.ok {
            self.m.count(|c| c.errors_to_clients += 1);
        }
        if !my::idle(answer.status) || pinned {
            // a transaction: its connections and the lock stay with it. The client gets its answer
            // now and sends its next statement while the slower backends finish this one
            let sent = self.flush().await;
            self.txn = handle.await.ok().flatten();
            sent?;
        } else {
            self.last_write = Some(handle);
        }
        Ok(())
    }
}

/// Run a write unit on every leased backend; answer the client by the wait policy (the first
/// backend to succeed, or all), then settle the unit. Returns the transaction, if one is open.
pub(super) async fn broadcast(
    c: Arc<Cluster>,
    conns: Vec<(usize, MyConn)>,
    guard: OwnedMutexGuard<()>,
    out: Arc<Outgoing>,
    tx: oneshot::Sender<Answer>,
    mut logging: Option<Logging>,
) -> Option<Txn> {
    let m = &c.m;
    let idx: Vec<usize> = conns.iter().map(|c| c.0).collect();
    m.writes_begin(&idx);
    let n = idx.len();
    let mut running = FuturesUnordered::new();
    for (pos, (b, mut conn)) in conns.into_iter().enumerate() {
        let out = &out;
        running.push(async move {
            let mut sink = Sink::collect();
            let x = execute(&mut conn, out, &mut sink).await;
            m.writes_end(b);
            if x.ok {
                m.write_finished(b); // reads waiting for this write on b may go; after a failure, settle first
            }
            (pos, Res { b, conn: Some(conn), replies: sink.held, x })
        });
    }
    let mut results: Vec<Option<Res>> = (0..n).map(|_| None).collect();
    let mut finished_here = vec![false; n];
    let mut chosen: Option<usize> = None;
    let mut tx = Some(tx);
    while let Some((pos, r)) = running.next().await {
        if r.x.ok {
            finished_here[pos] = true;
            if !m.wait_all && chosen.is_none() {
                chosen = Some(pos);
                let mut log_error = None;
                if let Some(lg) = logging.take() {
                    log_error = log_unit(&lg, true, &r.replies, r.x.status).await.err();
                }
                if let Some(tx) = tx.take() {
                    let _ = tx.send(Answer { replies: r.replies.clone(), ok: true, status: r.x.status, log_error });
                }
            }
        }
        results[pos] = Some(r);
    }
    drop(running);
    let results: Vec<Res> = results
        .into_iter()
        .enumerate()
        .map(|(pos, r)| {
            r.unwrap_or_else(|| Res { b: idx[pos], conn: None, replies: Vec::new(), x: Exec { ok: false, broken: true, ..Default::default() } })
        })
        .collect();
    // not answered yet (wait=all, or no backend succeeded): logged before the lock goes
    let mut log_error = None;
    if let Some(lg) = logging.take() {
        let ch = results.iter().position(|r| r.x.ok).or_else(|| results.iter().position(|r| !r.x.broken)).unwrap_or(0);
        log_error = log_unit(&lg, results[ch].x.ok, &results[ch].replies, results[ch].x.status).await.err();
    }
    let (ch, results, txn) = settle(&c, results, chosen, guard);
    for (pos, &b) in idx.iter().enumerate() {
        if !finished_here[pos] {
            m.write_finished(b);
        }
    }
    if let Some(tx) = tx.take() {
        let r = &results[ch];
        let _ = tx.send(Answer { replies: r.replies.clone(), ok: r.x.ok, status: r.x.status, log_error });
    }
    m.inflight_add(-1);
    txn
}

/// Settle a write unit (`answer::settle`): a transaction it left open keeps the connections and
/// the write lock.
pub(super) fn settle(c: &Cluster, results: Vec<Res>, chosen: Option<usize>, guard: OwnedMutexGuard<()>) -> (usize, Vec<Res>, Option<Txn>) {
    let (ch, results, conns) = answer::settle(&c.m, c, results, chosen, my::idle);
    (ch, results, conns.map(|conns| Txn { conns, guard }))
}
