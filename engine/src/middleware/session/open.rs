//! Units the client flushes before Sync (pipeline mode): what comes later in the unit is unknown,
//! so it runs like a write, on every backend under the write lock, part by part, answered by the
//! same backend throughout; its record goes to the recovery log whole, at its end.

use std::sync::Arc;

use tokio::task::JoinSet;

use super::client::{Fail, SResult, Session};
use super::execute::{execute, panicked, Exec, Sink};
use super::outgoing::Outgoing;
use super::position::with_position;
use super::write::{settle, Hold, Res};
use crate::middleware::log;
use crate::middleware::pool::Conn;
use crate::middleware::recovery;
use crate::middleware::replies::ReplyPlan;
use crate::middleware::sql::{self, Micros};
use crate::middleware::wire::{Message, Parse};

/// A unit of work under way across several client flushes (pipeline mode).
pub(super) struct OpenUnit {
    pub(super) slots: Vec<OpenSlot>,
    pub(super) guard: Hold,
    /// its number in the recovery log, whether its position is still to be recorded (by its
    /// first part), its bytes so far
    pub(super) seq: Option<(u64, bool)>,
    pub(super) logged: Vec<u8>,
    pub(super) macros_at: Micros,
    pub(super) slot: Option<Arc<Parse>>,
    pub(super) answering: Option<usize>,
}

pub(super) struct OpenSlot {
    pub(super) b: usize,
    pub(super) conn: Option<Conn>,
    pub(super) plan: ReplyPlan,
    pub(super) acc: Exec,
}

/// One backend's part of a step: backend, connection (None if its task failed), plan, result, replies.
pub(super) type StepResult = (usize, Option<Conn>, ReplyPlan, Exec, Vec<u8>);

/// Run `out` on every leased connection at once (each with its own plan); the results in lease order.
pub(super) async fn run_all(lease: Vec<(usize, Conn, ReplyPlan)>, out: Arc<Outgoing>) -> Vec<StepResult> {
    let mut set = JoinSet::new();
    let n = lease.len();
    let idx: Vec<usize> = lease.iter().map(|l| l.0).collect();
    for (pos, (b, mut conn, mut plan)) in lease.into_iter().enumerate() {
        let out = out.clone();
        set.spawn(async move {
            let mut sink = Sink::collect();
            let x = execute(&mut conn, &out, &mut sink, &mut plan).await;
            if out.resets {
                conn.stmts.clear();
            }
            (pos, b, conn, plan, x, sink.held)
        });
    }
    let mut res: Vec<Option<StepResult>> = (0..n).map(|_| None).collect();
    while let Some(j) = set.join_next().await {
        if let Ok((pos, b, conn, plan, x, held)) = j {
            res[pos] = Some((b, Some(conn), plan, x, held));
        }
    }
    res.into_iter().enumerate().map(|(pos, r)| r.unwrap_or_else(|| (idx[pos], None, ReplyPlan::default(), panicked(), Vec::new()))).collect()
}

impl Session {
    pub(super) fn abandon_open(&mut self, ou: OpenUnit) {
        for s in ou.slots {
            if let Some(mut c) = s.conn {
                c.close();
                self.m.backends[s.b].pool.release(c);
            }
        }
        self.txn = None;
        // connections closed: whatever transaction they had is rolled back, on replay too
        self.m.log_rollback();
        drop(ou.guard);
    }

    /// A client that sends Flush and waits for replies before Sync: what comes later in the unit is
    /// unknown, so the unit runs like a write, on every backend under the write lock, answered by
    /// the first backend after all have replied to each part.
    pub(super) async fn open_begin(&mut self) -> SResult<()> {
        // what comes later is unknown: under the row scheduler the unit holds the database
        let lease = self.lease_for_write(None, 0).await?;
        let idx: Vec<usize> = lease.conns.iter().map(|c| c.0).collect();
        self.m.writes_begin(&idx);
        self.m.count(|c| {
            c.writes += 1;
            c.flushed_units += 1;
        });
        let seq = self.m.recovery.as_ref().map(|log| (log.take_seq(), !lease.conns.iter().any(|(_, c)| c.status == b'E')));
        let slots = lease
            .conns
            .into_iter()
            .map(|(b, conn)| OpenSlot { b, conn: Some(conn), plan: ReplyPlan::default(), acc: Exec { ok: true, status: b'I', ..Default::default() } })
            .collect();
        // under the row scheduler, the units its transaction kept go first in its record
        let logged = if seq.is_some() { std::mem::take(&mut self.unlogged) } else { Vec::new() };
        self.open = Some(OpenUnit { slots, guard: lease.guard, seq, logged, macros_at: sql::now_micros(), slot: None, answering: None });
        Ok(())
    }

    pub(super) async fn open_step(&mut self, msgs: Vec<Message>, last: bool) -> SResult<()> {
        let Some(mut ou) = self.open.take() else {
            return Err(Fail::End(Some("no open unit".into())));
        };
        let idx: Vec<usize> = ou.slots.iter().map(|s| s.b).collect();
        let out = match self.outgoing(&msgs, Some(ou.macros_at), ou.slot.clone()) {
            Ok(mut o) => {
                if let Some((seq, true)) = ou.seq {
                    with_position(&mut o, seq); // first, as in a unit sent at once
                    ou.seq = Some((seq, false));
                }
                if ou.seq.is_some() {
                    ou.logged.extend_from_slice(&o.data);
                }
                Arc::new(o)
            }
            Err(e) => {
                self.abandon_open(ou);
                self.writes_over(&idx);
                return Err(e);
            }
        };
        ou.slot = out.unnamed.clone();
        if out.resets {
            self.m.statement_epoch.fetch_add(1, std::sync::atomic::Ordering::AcqRel);
        }
        let mut lease = Vec::new();
        let mut positions = Vec::new();
        for (pos, s) in ou.slots.iter_mut().enumerate() {
            if !s.acc.broken {
                if let Some(conn) = s.conn.take() {
                    out.reply_plan(&mut s.plan);
                    lease.push((s.b, conn, std::mem::take(&mut s.plan)));
                    positions.push(pos);
                }
            }
        }
        let steps = run_all(lease, out).await;
        let mut answering: Option<(usize, Vec<u8>)> = None;
        for (pos, (_, conn, plan, x, held)) in positions.into_iter().zip(steps) {
            let s = &mut ou.slots[pos];
            s.conn = conn;
            s.plan = plan;
            s.acc.ok = s.acc.ok && x.ok;
            if s.acc.error.is_none() {
                s.acc.error = x.error.clone();
            }
            s.acc.broken = s.acc.broken || x.broken;
            s.acc.status = x.status;
            s.acc.tags.extend(x.tags.iter().cloned());
            if answering.is_none() && !x.broken {
                answering = Some((s.b, held));
            }
        }
        let Some((answer_b, replies)) = answering.filter(|(b, _)| ou.answering.is_none_or(|a| a == *b)) else {
            self.abandon_open(ou);
            self.writes_over(&idx);
            return Err(Fail::End(Some("the backend answering a flushed unit failed mid-unit".into())));
        };
        ou.answering = Some(answer_b);
        self.io.out.extend_from_slice(&replies);
        if !last {
            self.open = Some(ou);
            return Ok(());
        }
        let mut log_failed = None;
        if let (Some((seq, _)), Some(rlog)) = (ou.seq, self.m.recovery.clone()) {
            // the whole unit, one record, on disk before the lock goes and the client is answered
            if let Err(e) = recovery::append(rlog, seq, Arc::new(std::mem::take(&mut ou.logged)), true).await {
                log(&e);
                log_failed = Some(e);
            }
        }
        let chosen_pos = ou.slots.iter().position(|s| s.b == answer_b);
        let results: Vec<Res> = ou.slots.into_iter().map(|s| Res { b: s.b, conn: s.conn, replies: Vec::new(), x: s.acc }).collect();
        let (chosen, results, txn) = settle(&self.m, results, chosen_pos, ou.guard);
        self.txn = txn;
        self.txn_logged = self.txn.is_some() && self.m.recovery.is_some();
        self.writes_over(&idx);
        if let Some(e) = log_failed {
            return Err(Fail::End(Some(e)));
        }
        if !results[chosen].x.ok {
            self.m.count(|c| c.errors_to_clients += 1);
        }
        Ok(())
    }
}
