//! The outgoing unit: the bytes a unit becomes on a backend connection (named statements run as
//! the unnamed one, loaded only when the backend's unnamed statement is another; a write's
//! macros rewritten) and the reply plan saying which answers the client sees.

use std::sync::Arc;

use super::client::{SResult, Session};
use crate::middleware::replies::{Mode, ReplyPlan};
use crate::middleware::sql::{self, Micros};
use crate::middleware::wire::{self, Message, Parse};

/// One step of the reply plan: a message sent (kind, mode, Describe target) or answered here.
pub(super) enum Step {
    Sent(u8, Mode, u8),
    Here(Vec<u8>),
}

/// What to send a backend for one unit and what to expect back.
pub struct Outgoing {
    pub(super) data: Vec<u8>,
    pub(super) plan: Vec<Step>,
    /// the Parse the backend's unnamed statement holds afterwards
    pub(super) unnamed: Option<Arc<Parse>>,
    /// it may drop statements the proxy prepared on the connection (DISCARD, DEALLOCATE)
    pub(super) resets: bool,
}

impl AsRef<[u8]> for Outgoing {
    fn as_ref(&self) -> &[u8] {
        &self.data
    }
}

impl Outgoing {
    pub(super) fn reply_plan(&self, p: &mut ReplyPlan) {
        for step in &self.plan {
            match step {
                Step::Sent(k, mode, target) => p.sent(*k, *mode, *target),
                Step::Here(answer) => p.answered_here(answer.clone()),
            }
        }
    }
}

/// Whether a statement text may make statements prepared before it wrong or gone: DDL, session
/// settings (a search_path), DISCARD and DEALLOCATE (the statements' first words).
pub(super) fn resets_statements(text: &str) -> bool {
    const RESETS: [&str; 7] = ["CREATE", "ALTER", "DROP", "SET", "RESET", "DISCARD", "DEALLOCATE"];
    let toks = sql::tokens(text);
    sql::statements(&toks).iter().any(|st| RESETS.contains(&st[0].text.as_str()))
}

pub(super) fn ptr_eq(a: &Option<Arc<Parse>>, b: &Arc<Parse>) -> bool {
    a.as_ref().is_some_and(|a| Arc::ptr_eq(a, b))
}

/// The statement's text with its macros rewritten (None: unchanged), counting the replacements.
pub(super) fn macro_text(p: &Parse, macros_at: Option<Micros>, rewritten: &mut usize) -> Option<String> {
    let (new, n) = sql::rewrite_macros(&p.sql, macros_at?);
    *rewritten += n;
    new
}

/// Send `p` as the unnamed statement unless the backend's unnamed statement already is `p`.
pub(super) struct Loader<'a> {
    pub(super) slot: Option<Arc<Parse>>,
    pub(super) macros_at: Option<Micros>,
    pub(super) rewritten: &'a mut usize,
    /// a statement run on the write path may invalidate prepared statements
    pub(super) resets: bool,
}

impl Loader<'_> {
    pub(super) fn load(&mut self, p: Option<Arc<Parse>>, data: &mut Vec<u8>, plan: &mut Vec<Step>) {
        if let Some(p) = p {
            self.resets = self.resets || (self.macros_at.is_some() && resets_statements(&p.sql));
            if !ptr_eq(&self.slot, &p) {
                let new = macro_text(&p, self.macros_at, self.rewritten);
                p.encode_as("", new.as_deref(), data);
                plan.push(Step::Sent(wire::PARSE, Mode::Hide, 0));
                self.slot = Some(p);
            }
        }
    }
}

impl Session {
    /// The bytes for a backend connection and the reply plan (the same for every backend). `slot`
    /// is the Parse the backend's unnamed statement holds before (None: unknown).
    pub(super) fn outgoing(&mut self, unit: &[Message], macros_at: Option<Micros>, slot: Option<Arc<Parse>>) -> SResult<Outgoing> {
        let mut data = Vec::with_capacity(unit.iter().map(|m| m.body.len() + 5).sum::<usize>() + 64);
        let mut plan = Vec::with_capacity(unit.len() + 1);
        let mut rewritten = 0usize;
        let mut named = 0u64;
        let mut resets = false;
        let mut ld = Loader { slot, macros_at, rewritten: &mut rewritten, resets: false };
        for msg in unit {
            match msg.kind {
                wire::QUERY => {
                    resets = resets || (macros_at.is_some() && resets_statements(&String::from_utf8_lossy(&msg.body)));
                    match macros_at {
                        None => msg.encode_into(&mut data),
                        Some(at) => {
                            let (new, n) = sql::rewrite_macros(&wire::query_text(&msg.body)?, at);
                            *ld.rewritten += n;
                            match new {
                                Some(q) => data.extend_from_slice(&wire::query(&q)),
                                None => msg.encode_into(&mut data),
                            }
                        }
                    }
                    plan.push(Step::Sent(wire::QUERY, Mode::Pass, 0));
                }
                wire::PARSE => {
                    let p = Arc::new(Parse::decode(&msg.body)?);
                    if !p.name.is_empty() {
                        self.statements.insert(p.name.clone(), p);
                        named += 1;
                        plan.push(Step::Here(wire::frame(wire::PARSE_COMPLETE, b"")));
                    } else {
                        resets = resets || (macros_at.is_some() && resets_statements(&p.sql));
                        self.unnamed = Some(p.clone());
                        match macro_text(&p, macros_at, ld.rewritten) {
                            None => msg.encode_into(&mut data),
                            Some(new) => p.encode_as("", Some(&new), &mut data),
                        }
                        plan.push(Step::Sent(wire::PARSE, Mode::Pass, 0));
                        ld.slot = Some(p);
                    }
                }
                wire::BIND => {
                    let b = wire::Bind::decode(&msg.body)?;
                    let target = if b.statement.is_empty() { self.unnamed.clone() } else { self.statements.get(&b.statement).cloned() };
                    if !b.statement.is_empty() && target.is_none() {
                        msg.encode_into(&mut data); // the backend reports the unknown name
                    } else {
                        ld.load(target, &mut data, &mut plan);
                        if b.statement.is_empty() {
                            msg.encode_into(&mut data);
                        } else {
                            b.encode_for("", &mut data);
                        }
                    }
                    plan.push(Step::Sent(wire::BIND, Mode::Pass, 0));
                }
                k @ (wire::DESCRIBE | wire::CLOSE) => {
                    let t = wire::Target::decode(&msg.body)?;
                    if t.what == b'S' && !t.name.is_empty() {
                        let p = self.statements.get(&t.name).cloned();
                        if k == wire::CLOSE {
                            self.statements.remove(&t.name);
                            plan.push(Step::Here(wire::frame(wire::CLOSE_COMPLETE, b"")));
                            continue;
                        }
                        match p {
                            None => msg.encode_into(&mut data),
                            Some(p) => {
                                ld.load(Some(p), &mut data, &mut plan);
                                wire::Target { what: b'S', name: String::new() }.encode(wire::DESCRIBE, &mut data);
                            }
                        }
                        plan.push(Step::Sent(k, Mode::Pass, b'S'));
                        continue;
                    }
                    if t.what == b'S' && k == wire::DESCRIBE {
                        ld.load(self.unnamed.clone(), &mut data, &mut plan);
                    }
                    msg.encode_into(&mut data);
                    plan.push(Step::Sent(k, Mode::Pass, t.what));
                }
                k => {
                    // Execute, Flush, Sync
                    msg.encode_into(&mut data);
                    if k != wire::FLUSH {
                        plan.push(Step::Sent(k, Mode::Pass, 0));
                    }
                }
            }
        }
        let slot = ld.slot;
        let resets = resets || ld.resets;
        if rewritten > 0 || named > 0 {
            self.m.count(|c| {
                c.macros_rewritten += rewritten as u64;
                c.named_statements += named;
            });
        }
        Ok(Outgoing { data, plan, unnamed: slot, resets })
    }
}
