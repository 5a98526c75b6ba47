//! Reads: one backend chosen by the read policy (after the writes started before it have run
//! there), a unit executing a named statement run as prepared on the connection (its prepared
//! variant), a stale pooled connection retried once, a failed backend disabled and the read
//! routed again.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Instant;

use super::client::{SResult, Session};
use super::execute::{execute, Sink};
use super::outgoing::{Outgoing, Step};
use crate::middleware::answer;
use crate::middleware::pool::{Conn, STMTS_MAX};
use crate::middleware::replies::{Mode, ReplyPlan};
use crate::middleware::wire::{self, Message, Parse};
use crate::middleware::Manager;

/// For a read that executes a named statement (Bind, Describe portal, Execute, Sync, as libpq's
/// PQexecPrepared sends): the unit for `conn` with the statement prepared there under a name of
/// the proxy's (prepared first when the connection does not have it yet), so the backend does
/// not parse and plan it again for every execution. None: the unit is of another shape.
pub(super) fn prepared_variant(
    m: &Manager,
    statements: &HashMap<String, Arc<Parse>>,
    unit: &[Message],
    conn: &mut Conn,
) -> Option<(Outgoing, Option<String>)> {
    let epoch = m.statement_epoch.load(std::sync::atomic::Ordering::Acquire);
    if conn.stmts_epoch != epoch {
        // DDL or settings ran since these were prepared: prepare again (the old ones stay unused)
        conn.stmts.clear();
        conn.stmts_epoch = epoch;
    }
    let mut data = Vec::with_capacity(unit.iter().map(|m| m.body.len() + 5).sum::<usize>() + 64);
    let mut plan = Vec::with_capacity(unit.len() + 1);
    let mut added = None;
    let mut bound = false;
    for msg in unit {
        match msg.kind {
            wire::BIND if !bound => {
                bound = true;
                let b = wire::Bind::decode(&msg.body).ok()?;
                if b.statement.is_empty() {
                    return None;
                }
                let p = statements.get(&b.statement)?;
                let name = match conn.stmts.get(&p.sql) {
                    Some((types, name)) if *types == p.types => name.clone(),
                    _ => {
                        if conn.stmts.len() >= STMTS_MAX {
                            return None;
                        }
                        let name = conn.next_statement_name();
                        p.encode_as(&name, None, &mut data);
                        plan.push(Step::Sent(wire::PARSE, Mode::Hide, 0));
                        conn.stmts.insert(p.sql.clone(), (p.types.clone(), name.clone()));
                        added = Some(p.sql.clone());
                        name
                    }
                };
                b.encode_for(&name, &mut data);
                plan.push(Step::Sent(wire::BIND, Mode::Pass, 0));
            }
            wire::DESCRIBE => {
                if msg.body.first() != Some(&b'P') {
                    return None;
                }
                msg.encode_into(&mut data);
                plan.push(Step::Sent(wire::DESCRIBE, Mode::Pass, b'P'));
            }
            wire::EXECUTE | wire::SYNC => {
                msg.encode_into(&mut data);
                plan.push(Step::Sent(msg.kind, Mode::Pass, 0));
            }
            _ => {
                if let Some(sql) = added {
                    conn.stmts.remove(&sql);
                }
                return None;
            }
        }
    }
    if !bound || unit.last().map(|m| m.kind) != Some(wire::SYNC) {
        if let Some(sql) = added {
            conn.stmts.remove(&sql);
        }
        return None;
    }
    Some((Outgoing { data, plan, unnamed: None, resets: false }, added))
}

impl Session {
    /// A unit that executes a named statement the session keeps, as `prepared_variant` takes it.
    pub(super) fn executes_named(&self, unit: &[Message]) -> bool {
        let Some((first, rest)) = unit.split_first() else {
            return false;
        };
        first.kind == wire::BIND
            && wire::Bind::decode(&first.body).is_ok_and(|b| !b.statement.is_empty() && self.statements.contains_key(&b.statement))
            && rest.last().is_some_and(|m| m.kind == wire::SYNC)
            && rest.iter().all(|m| m.kind == wire::EXECUTE || m.kind == wire::SYNC || (m.kind == wire::DESCRIBE && m.body.first() == Some(&b'P')))
    }

    pub(super) async fn read(&mut self, unit: &[Message], label: Option<Arc<str>>) -> SResult<()> {
        // a unit executing a named statement usually runs as prepared on the connection: the
        // general form (no side effects on the session for such a unit) only when needed
        let mut general = if self.executes_named(unit) { None } else { Some(self.outgoing(unit, None, None)?) };
        let m = self.m.clone();
        loop {
            let (b, started, token) = m.choose_read(label.as_ref())?;
            let backend = &m.backends[b];
            backend.wait_for_writes(started).await;
            if !backend.enabled() {
                // disabled by the write it waited for: choose again
                m.read_over(b, token);
                continue;
            }
            let mut conn = match backend.pool.acquire().await {
                Ok(c) => c,
                Err(err) => {
                    m.disable_unreachable(b, &format!("read failed: {err}"));
                    m.count(|c| c.read_retries += 1);
                    m.read_over(b, token);
                    continue;
                }
            };
            let variant = prepared_variant(&self.m, &self.statements, unit, &mut conn);
            if variant.is_none() && general.is_none() {
                match self.outgoing(unit, None, None) {
                    Ok(o) => general = Some(o),
                    Err(e) => {
                        backend.pool.release(conn);
                        m.read_over(b, token);
                        return Err(e);
                    }
                }
            }
            let out = general.as_ref();
            let mut sink = Sink::streaming(&mut self.io.wr);
            let t0 = Instant::now();
            let mut plan = ReplyPlan::default();
            let this = match (&variant, out) {
                (Some(v), _) => &v.0,
                (None, Some(o)) => o,
                (None, None) => unreachable!("the general form is built when no variant is"),
            };
            this.reply_plan(&mut plan);
            let mut x = execute(&mut conn, this, &mut sink, &mut plan).await;
            if let (false, Some((_, Some(sql)))) = (x.ok, &variant) {
                conn.stmts.remove(sql); // its Parse may have failed: prepare it again next time
            }
            let reused = conn.reused;
            backend.pool.release(conn);
            if !x.broken {
                m.read_done(b, t0.elapsed().as_secs_f64(), label.as_ref());
            }
            if x.broken && reused && !sink.saw {
                // an idle pooled connection may have gone stale: once more on a new one
                backend.pool.drop_idle();
                sink.held.clear();
                if let Ok(mut conn) = backend.pool.acquire().await {
                    // a new connection: the variant for it, or the general form
                    let again = prepared_variant(&self.m, &self.statements, unit, &mut conn);
                    let this = match (&again, out) {
                        (Some(v), _) => Some(&v.0),
                        (None, o) => o,
                    };
                    if let Some(this) = this {
                        let mut plan = ReplyPlan::default();
                        this.reply_plan(&mut plan);
                        x = execute(&mut conn, this, &mut sink, &mut plan).await;
                    }
                    if let (false, Some((_, Some(sql)))) = (x.ok, &again) {
                        conn.stmts.remove(sql);
                    }
                    backend.pool.release(conn);
                }
            }
            if answer::read_done(&m, m.as_ref(), b, token, x, &mut sink, &mut self.io.out)? {
                return Ok(());
            }
        }
    }
}
