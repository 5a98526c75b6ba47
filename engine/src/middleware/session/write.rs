//! Writes: a connection on every enabled backend under the write lock (or, with `--scheduler
//! rows`, holding the unit's scope: its rows, or the database; or the open transaction's), the
//! unit broadcast and the client answered by the wait policy, its record in
//! the recovery log, then the settling: backends that failed where another succeeded disabled, and
//! the connections and the lock kept for a transaction the unit left open.

use std::sync::Arc;
use std::time::Instant;

use futures_util::future::{FutureExt, Shared};
use futures_util::stream::{FuturesUnordered, StreamExt};
use tokio::sync::{oneshot, OwnedMutexGuard};
use tokio::task::JoinSet;

use super::client::{Fail, SResult, Session};
use super::execute::{execute, panicked, Sink};
use super::outgoing::{Outgoing, Step};
use super::position::with_position;
use crate::middleware::answer;
use crate::middleware::pool::Conn;
use crate::middleware::recovery;
use crate::middleware::replies::{Mode, ReplyPlan};
use crate::middleware::rowlocks::Holder;
use crate::middleware::scope::{Control, Scope};
use crate::middleware::sql;
use crate::middleware::wire::{self, Message};
use crate::middleware::{log, Manager};

/// What keeps a write apart from the others until it ends: the one write lock, or its place in
/// the row scheduler's lock table (released when dropped).
pub enum Hold {
    Lock(#[allow(dead_code)] OwnedMutexGuard<()>),
    Rows(Holder),
}

/// An explicit transaction: its connections (one per backend still in it) and its hold.
pub struct Txn {
    pub(super) lease: Vec<(usize, Conn)>,
    pub(super) guard: Hold,
}

pub(super) struct Lease {
    pub(super) conns: Vec<(usize, Conn)>,
    pub(super) guard: Hold,
    pub(super) pinned: bool,
    /// the row scheduler chose this unit's wait to break a deadlock: the unit is not run
    pub(super) deadlocked: bool,
}

/// What the backends run instead of a unit whose wait was chosen to break a deadlock: an error
/// with PostgreSQL's code for one, which leaves the transaction failed on every backend (the
/// client's ROLLBACK ends it, and its rows are released then).
pub(super) const DEADLOCK_SQL: &str = "DO $$BEGIN RAISE EXCEPTION 'deadlock detected' USING ERRCODE = '40P01', \
DETAIL = 'tierscope middleware (--scheduler rows): this transaction waited for rows held by a transaction that waited for it', \
HINT = 'Roll back and retry the transaction.'; END$$";

/// The answer a write unit gives the client.
pub(super) struct Answer {
    pub(super) replies: Vec<u8>,
    pub(super) ok: bool,
    pub(super) status: u8,
}

/// How the recovery log takes a write unit.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Logging {
    /// no log
    Off,
    /// a sequence number and a record of its own (after the transaction's kept units): under
    /// the write lock, or holding the database, nothing else runs meanwhile
    Numbered,
    /// numbered as above, in `log_order`: a transaction holding rows committed (or an autocommit
    /// unit) while others run
    Ordered,
    /// kept by the session until the unit committing the transaction (holding rows)
    Kept,
    /// the transaction is rolled back (or was aborted): what was kept goes, nothing is logged
    Dropped,
}

/// How the recovery log takes a unit (`log`: there is one) under `hold`: `inside` a transaction
/// before it, `ending` it by its last statement, the transaction `aborted` on a backend.
pub(super) fn logging(log: bool, hold: &Hold, inside: bool, ending: Option<Control>, aborted: bool) -> Logging {
    match hold {
        _ if !log => Logging::Off,
        Hold::Rows(h) if !h.holds_database() => match (inside, ending) {
            (false, _) => Logging::Ordered,
            (true, Some(Control::Commit)) if !aborted => Logging::Ordered,
            (true, Some(_)) => Logging::Dropped,
            (true, None) => Logging::Kept,
        },
        _ => Logging::Numbered,
    }
}

/// One backend's complete answer to a unit of a write.
pub(super) type Res = answer::Res<Conn, u8>;

impl Session {
    /// A connection on every enabled backend with the write lock held (or the transaction's pinned
    /// connections). With the row scheduler: the connections first, then `scope` (None: the
    /// database; worked out at statement epoch `since`) added to what the transaction holds.
    pub(super) async fn lease_for_write(&mut self, scope: Option<&Scope>, since: u64) -> SResult<Lease> {
        if let Some(txn) = self.txn.take() {
            let mut lease = Lease { conns: txn.lease, guard: txn.guard, pinned: true, deadlocked: false };
            if let Hold::Rows(h) = &lease.guard {
                lease.deadlocked = self.hold(h, scope, since).await;
            }
            return Ok(lease);
        }
        // under the row scheduler the write lock only gates taking the connections: one session at a
        // time takes one on every backend, so two cannot each hold what the other waits for
        let (guard, gate) = match &self.m.scheduler {
            Some(s) => (Hold::Rows(s.begin()), Some(self.m.write_lock.clone().lock_owned().await)),
            None => {
                let t0 = Instant::now();
                let g = self.m.write_lock.clone().lock_owned().await;
                let waited = t0.elapsed().as_secs_f64();
                self.m.count(|c| c.write_lock_wait_s += waited);
                (Hold::Lock(g), None)
            }
        };
        let targets = self.m.enabled();
        if targets.is_empty() {
            return Err(Fail::NoBackend("no database backend is enabled".into()));
        }
        let mut conns = Vec::new();
        let mut set = JoinSet::new();
        for &b in &targets {
            // an idle connection at once (the usual case), else wait or open one, all at once
            match self.m.backends[b].pool.try_acquire_idle() {
                Some(c) => conns.push((b, c)),
                None => {
                    let m = self.m.clone();
                    set.spawn(async move { (b, m.backends[b].pool.acquire().await) });
                }
            }
        }
        while let Some(j) = set.join_next().await {
            match j {
                Ok((b, Ok(c))) => conns.push((b, c)),
                Ok((b, Err(err))) => self.m.disable_unreachable(b, &format!("write failed: cannot get a connection: {err}")),
                Err(_) => {}
            }
        }
        if conns.is_empty() {
            return Err(Fail::NoBackend("no database backend could be reached for a write".into()));
        }
        drop(gate);
        conns.sort_by_key(|c| c.0);
        let mut lease = Lease { conns, guard, pinned: false, deadlocked: false };
        if let Hold::Rows(h) = &lease.guard {
            lease.deadlocked = self.hold(h, scope, since).await;
        }
        Ok(lease)
    }

    /// Add `scope` (None: the database) to what `h` holds, counting the wait: whether the wait was
    /// chosen to break a deadlock. A scope worked out from table facts that went stale before it
    /// was granted (`since`: the statement epoch before it was worked out; a unit holding the
    /// database changed the catalog or a setting meanwhile) is not trusted: the database is added.
    async fn hold(&self, h: &Holder, scope: Option<&Scope>, since: u64) -> bool {
        let t0 = Instant::now();
        let mut r = h.acquire(scope.unwrap_or(&Scope::Database)).await;
        let moved = self.m.statement_epoch.load(std::sync::atomic::Ordering::Acquire) != since;
        if r.is_ok() && moved && !matches!(scope, None | Some(Scope::Database)) {
            if let Some(s) = &self.m.scheduler {
                s.count_stale();
            }
            r = h.acquire(&Scope::Database).await;
        }
        let waited = t0.elapsed().as_secs_f64();
        self.m.count(|c| c.write_lock_wait_s += waited);
        r.is_err()
    }

    pub(super) async fn write(&mut self, unit: &[Message]) -> SResult<()> {
        self.write_unit(unit, true).await
    }

    /// A write unit; `answered`: its replies go to the client (false: a BEGIN the client had
    /// answered already, `begin_now`).
    pub(super) async fn write_unit(&mut self, unit: &[Message], answered: bool) -> SResult<()> {
        let since = self.m.statement_epoch.load(std::sync::atomic::Ordering::Acquire);
        let (scope, ending) = match &self.m.scheduler {
            Some(_) => {
                let (scope, ending) = self.unit_scope(unit).await?;
                (Some(scope), ending)
            }
            None => (None, None),
        };
        let inside = self.txn.is_some() || self.pending_begin.is_some();
        let lease = self.lease_for_write(scope.as_ref(), since).await?;
        let pinned = lease.pinned;
        let aborted = lease.conns.iter().any(|(_, c)| c.status == b'E');
        let logging = logging(self.m.recovery.is_some(), &lease.guard, inside, ending, aborted);
        let raise;
        let unit = if lease.deadlocked {
            raise = [Message { kind: wire::QUERY, body: wire::query(DEADLOCK_SQL)[5..].to_vec() }];
            &raise[..]
        } else {
            unit
        };
        let mut out = self.outgoing(unit, Some(sql::now_micros()), None)?;
        // the recovery log: a sequence number (in the order the backends run the numbered units),
        // the position recorded by the unit itself (not in an aborted transaction: its only way out
        // is a rollback), the record appended and fsync'd while the backends run it
        let order = match logging {
            Logging::Ordered => Some(self.m.log_order.clone().lock_owned().await),
            _ => None,
        };
        let numbered = matches!(logging, Logging::Numbered | Logging::Ordered);
        let durable = self.m.recovery.clone().filter(|_| numbered).map(|log| {
            let seq = log.take_seq();
            if !aborted {
                with_position(&mut out, seq);
            }
            (log, seq)
        });
        if let Some(begin) = self.pending_begin.take() {
            // the BEGIN answered earlier goes first, its answers hidden (the position, if any, is
            // then recorded inside the transaction)
            let mut data = Vec::with_capacity(begin.body.len() + 5 + out.data.len());
            begin.encode_into(&mut data);
            data.extend_from_slice(&out.data);
            out.data = data;
            out.plan.insert(0, Step::Sent(wire::QUERY, Mode::Hide, 0));
        }
        let out = Arc::new(out);
        let durable = durable.map(|(log, seq)| {
            if self.unlogged.is_empty() {
                logged(log, seq, out.clone())
            } else {
                // the transaction's units kept so far, then this one: one record
                let mut record = std::mem::take(&mut self.unlogged);
                record.extend_from_slice(&out.data);
                logged(log, seq, Arc::new(record))
            }
        });
        match logging {
            Logging::Kept => self.unlogged.extend_from_slice(&out.data),
            Logging::Dropped => self.unlogged.clear(),
            _ => {}
        }
        if out.resets {
            self.m.statement_epoch.fetch_add(1, std::sync::atomic::Ordering::AcqRel);
        }
        self.m.count(|c| c.writes += 1);
        let (tx, rx) = oneshot::channel();
        self.m.inflight_add(1);
        let handle = tokio::spawn(broadcast(self.m.clone(), lease, out, tx, durable.clone(), order));
        let Ok(answer) = rx.await else {
            return Err(Fail::End(Some("a write failed unexpectedly".into())));
        };
        if let Some(d) = durable {
            // answered only once its record is written, and on disk when it leaves no
            // transaction open (the records of the transaction's units before it with it)
            let mut r = d.await;
            if let (Ok(()), b'I', Some(rlog)) = (&r, answer.status, self.m.recovery.clone()) {
                r = recovery::sync(rlog).await;
            }
            if let Err(e) = r {
                log(&e);
                return Err(Fail::End(Some(e)));
            }
        }
        if answer.status == b'I' {
            if matches!(logging, Logging::Kept) {
                log(&format!(
                    "session {}: a transaction ended by a statement the middleware did not see as its end; its units since the last one logged are not in the recovery log",
                    self.id
                ));
            }
            self.unlogged.clear();
            self.txn_logged = false;
        } else if numbered {
            self.txn_logged = true;
        }
        if answered {
            self.io.out.extend_from_slice(&answer.replies);
            if !answer.ok {
                self.m.count(|c| c.errors_to_clients += 1);
            }
        }
        if answer.status != b'I' || pinned {
            // a transaction: its connections and the lock stay with it. The client gets its answer
            // now and sends its next statement while the slower backends finish this one
            let sent = if answered { self.flush().await } else { Ok(()) };
            self.txn = handle.await.ok().flatten();
            sent?;
        } else {
            self.last_write = Some(handle);
        }
        Ok(())
    }

    pub(super) fn writes_over(&self, idx: &[usize]) {
        for &b in idx {
            self.m.writes_end(b);
            self.m.write_finished(b);
        }
    }
}

/// A unit's record in the recovery log: Ok once it is written (the session fsyncs it).
pub(super) type Durable = Shared<futures_util::future::BoxFuture<'static, Result<(), String>>>;

/// Append `data` to the recovery log as unit `seq` (a task of its own, started now).
pub(super) fn logged<D: AsRef<[u8]> + Send + Sync + 'static>(log: Arc<recovery::Log>, seq: u64, data: Arc<D>) -> Durable {
    let task = tokio::spawn(recovery::append(log, seq, data, false));
    async move { task.await.unwrap_or_else(|e| Err(format!("recovery log: {e}"))) }.boxed().shared()
}

/// Run a write unit on every leased backend; answer the client by the wait policy (the first
/// backend to succeed, or all), then settle the unit. Returns the transaction, if one is open.
pub(super) async fn broadcast(
    m: Arc<Manager>,
    lease: Lease,
    out: Arc<Outgoing>,
    tx: oneshot::Sender<Answer>,
    durable: Option<Durable>,
    order: Option<OwnedMutexGuard<()>>,
) -> Option<Txn> {
    let idx: Vec<usize> = lease.conns.iter().map(|c| c.0).collect();
    m.writes_begin(&idx);
    let n = idx.len();
    // the backends' executions as futures of this task (no task per backend)
    let mut running = FuturesUnordered::new();
    for (pos, (b, mut conn)) in lease.conns.into_iter().enumerate() {
        let (m, out) = (&m, &out);
        running.push(async move {
            let mut sink = Sink::collect();
            let mut plan = ReplyPlan::default();
            out.reply_plan(&mut plan);
            let x = execute(&mut conn, out, &mut sink, &mut plan).await;
            if out.resets {
                conn.stmts.clear();
            }
            m.writes_end(b);
            if x.ok {
                // reads waiting for this write on b may go; after a failure, settle first
                m.write_finished(b);
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
                // the first to succeed answers the client
                chosen = Some(pos);
                if let Some(tx) = tx.take() {
                    let _ = tx.send(Answer { replies: r.replies.clone(), ok: true, status: r.x.status });
                }
            }
        }
        results[pos] = Some(r);
    }
    drop(running);
    let results: Vec<Res> = results
        .into_iter()
        .enumerate()
        .map(|(pos, r)| r.unwrap_or_else(|| Res { b: idx[pos], conn: None, replies: Vec::new(), x: panicked() }))
        .collect();
    if let Some(d) = durable {
        // the write lock is held until the record is appended: the log's order is the units'
        let _ = d.await;
    }
    let (c, results, txn) = settle(&m, results, chosen, lease.guard);
    drop(order); // every backend ran it, its record is written: the next numbered unit may go
    for (pos, &b) in idx.iter().enumerate() {
        if !finished_here[pos] {
            m.write_finished(b);
        }
    }
    if let Some(tx) = tx.take() {
        let r = &results[c];
        let _ = tx.send(Answer { replies: r.replies.clone(), ok: r.x.ok, status: r.x.status });
    }
    m.inflight_add(-1);
    txn
}

/// Settle a write unit (`answer::settle`): a transaction it left open keeps the connections and
/// its hold.
pub(super) fn settle(m: &Manager, results: Vec<Res>, chosen: Option<usize>, guard: Hold) -> (usize, Vec<Res>, Option<Txn>) {
    let (c, results, lease) = answer::settle(m, m, results, chosen, |status| status == b'I');
    (c, results, lease.map(|lease| Txn { lease, guard }))
}
