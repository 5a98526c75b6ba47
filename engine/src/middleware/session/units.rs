//! What a unit of work is and where it goes: read, write or COPY (and a read's label), routed to
//! one backend, to all, or to the open transaction; the units answered by the proxy itself
//! (preparing and closing named statements, DEALLOCATE of one it keeps).

use std::sync::{Arc, LazyLock};

use super::client::{Fail, SResult, Session};
use crate::middleware::scope::{self, Control, Scope};
use crate::middleware::sql::{self, Kind};
use crate::middleware::wire::{self, Message, Parse};

/// Whether a Query's body may be a DEALLOCATE (its text is decoded only then): the first
/// character after whitespace is not ASCII (Unicode whitespace may come first), or the text starts
/// with the word, as `Session::deallocate` checks after `trim_start`.
pub(super) fn may_deallocate(body: &[u8]) -> bool {
    let Some(start) = body.iter().position(|&c| !matches!(c, b'\t' | b'\n' | 0x0B | 0x0C | b'\r' | b' ')) else {
        return false;
    };
    body[start] >= 0x80 || body.get(start..start + 10).is_some_and(|w| w.eq_ignore_ascii_case(b"DEALLOCATE"))
}

/// Whether SQL text (bytes) may be a plain BEGIN, so that only then is it decoded and tokenized
/// (`sql::plain_begin` decides): after ASCII whitespace it starts with BEGIN or START (any case),
/// a comment, or a byte that is not ASCII (Unicode whitespace may come first).
pub(super) fn may_begin(text: &[u8]) -> bool {
    let Some(start) = text.iter().position(|&c| !matches!(c, b'\t' | b'\n' | 0x0B | 0x0C | b'\r' | b' ')) else {
        return false;
    };
    let word = |w: &[u8]| text.get(start..start + w.len()).is_some_and(|t| t.eq_ignore_ascii_case(w));
    text[start] >= 0x80 || word(b"BEGIN") || word(b"START") || word(b"--") || word(b"/*")
}

pub(super) static DEALLOCATE: LazyLock<regex::Regex> =
    LazyLock::new(|| regex::Regex::new(r#"(?i)^\s*DEALLOCATE\s+(?:PREPARE\s+)?(ALL|"?[A-Za-z0-9_$]+"?)\s*;?\s*$"#).expect("valid regex"));

impl Session {
    pub(super) async fn dispatch(&mut self, unit: Vec<Message>) -> SResult<()> {
        if self.last_write.as_ref().is_some_and(|h| h.is_finished()) {
            if let Some(h) = self.last_write.take() {
                if let Ok(Some(txn)) = h.await {
                    self.txn = Some(txn);
                }
            }
        }
        self.m.count(|c| c.units += 1);
        if self.txn.is_none() && self.pending_begin.is_none() {
            if let Some(begin) = deferred_begin(&unit)? {
                // answered here; sent with the next unit (as a simple Query, its answers hidden),
                // under the write lock that unit takes
                self.io.out.extend_from_slice(&begin.answer);
                self.pending_begin = Some(Message { kind: wire::QUERY, body: begin.query });
                if let Some(p) = begin.parse {
                    self.unnamed = Some(p); // the client's unnamed statement is the BEGIN now
                }
                return Ok(());
            }
        }
        if unit[0].kind == wire::QUERY && may_deallocate(&unit[0].body) && self.deallocate(&wire::query_text(&unit[0].body)?) {
            return Ok(());
        }
        if self.local_only(&unit)? {
            return Ok(());
        }
        // labels only for a read outside a transaction (decided in the same pass as the kind)
        let want_label = self.txn.is_none() && self.pending_begin.is_none() && self.m.tracks_labels();
        let (kind, label) = self.unit_kind_label(&unit, want_label)?;
        if kind == Kind::Copy {
            self.m.count(|c| c.errors_to_clients += 1);
            self.io.out.extend_from_slice(&wire::error(
                "COPY is not supported by the middleware (run it on every database server directly)",
                "0A000",
                "ERROR",
            ));
            self.io.out.extend_from_slice(&wire::ready(self.status()));
            return Ok(());
        }
        let r = if self.txn.is_some() || self.pending_begin.is_some() {
            // inside a transaction every unit runs on all its backends
            self.m.count(|c| c.transaction_units += 1);
            self.write(&unit).await
        } else if kind == Kind::Read {
            self.read(&unit, label).await
        } else {
            self.write(&unit).await
        };
        match r {
            Err(Fail::NoBackend(e)) => {
                self.m.count(|c| c.errors_to_clients += 1);
                self.io.out.extend_from_slice(&wire::error(&e, "08006", "ERROR"));
                self.io.out.extend_from_slice(&wire::ready(self.status()));
                Ok(())
            }
            other => other,
        }
    }

    /// Send a BEGIN answered earlier on its own (before a unit that does not take the write path),
    /// its answer dropped: the client had it.
    pub(super) async fn begin_now(&mut self) -> SResult<()> {
        let Some(begin) = self.pending_begin.take() else {
            return Ok(());
        };
        self.write_unit(&[begin], false).await
    }

    /// A unit that only prepares or closes named statements (PQsendPrepare) is answered here: the
    /// proxy keeps named statements itself, no backend is involved.
    pub(super) fn local_only(&mut self, unit: &[Message]) -> SResult<bool> {
        enum What {
            Prepare(Arc<Parse>),
            Close(String),
        }
        let mut answers = Vec::new();
        for msg in unit {
            match msg.kind {
                wire::PARSE => {
                    let p = Parse::decode(&msg.body)?;
                    if p.name.is_empty() {
                        return Ok(false);
                    }
                    answers.push(What::Prepare(Arc::new(p)));
                }
                wire::CLOSE => {
                    let t = wire::Target::decode(&msg.body)?;
                    if t.what != b'S' || t.name.is_empty() {
                        return Ok(false);
                    }
                    answers.push(What::Close(t.name));
                }
                wire::SYNC | wire::FLUSH => {}
                _ => return Ok(false),
            }
        }
        for a in answers {
            match a {
                What::Prepare(p) => {
                    self.statements.insert(p.name.clone(), p);
                    self.m.count(|c| c.named_statements += 1);
                    self.io.out.extend_from_slice(&wire::frame(wire::PARSE_COMPLETE, b""));
                }
                What::Close(name) => {
                    self.statements.remove(&name);
                    self.io.out.extend_from_slice(&wire::frame(wire::CLOSE_COMPLETE, b""));
                }
            }
        }
        self.io.out.extend_from_slice(&wire::ready(self.status()));
        Ok(true)
    }

    /// DEALLOCATE of a statement the proxy keeps is answered here.
    pub(super) fn deallocate(&mut self, text: &str) -> bool {
        let t = text.trim_start().as_bytes();
        if t.len() < 10 || !t[..10].eq_ignore_ascii_case(b"DEALLOCATE") {
            return false; // (the regex's own start, checked cheaply)
        }
        let Some(c) = DEALLOCATE.captures(text) else {
            return false;
        };
        let name = c[1].trim_matches('"').to_string();
        let tag = if name.eq_ignore_ascii_case("ALL") {
            self.statements.clear();
            "DEALLOCATE ALL"
        } else {
            if self.statements.remove(&name).is_none() {
                self.io.out.extend_from_slice(&wire::error(&format!("prepared statement \"{name}\" does not exist"), "26000", "ERROR"));
                self.io.out.extend_from_slice(&wire::ready(self.status()));
                return true;
            }
            "DEALLOCATE"
        };
        self.io.out.extend_from_slice(&wire::command_complete(tag));
        self.io.out.extend_from_slice(&wire::ready(self.status()));
        true
    }

    /// What a unit runs, from one pass over its messages: Copy if any SQL it runs is COPY, else
    /// Write if any is a write, else Read (statements named in Bind count too); with `want_label`,
    /// the label of a Read unit as well (the labels of the SQL it runs, statements named in Bind
    /// included, as the Python middleware's `texts`; None when it runs none).
    pub(super) fn unit_kind_label(&self, unit: &[Message], want_label: bool) -> SResult<(Kind, Option<Arc<str>>)> {
        /// a statement's text: decoded from a Query, or held by a Parse
        enum Text {
            Query(String),
            Stmt(Arc<Parse>),
        }
        let mut kind = Kind::Read;
        let mut texts: Vec<Text> = Vec::new();
        let mut unnamed = self.unnamed.clone();
        let mut add = |k: Kind, t: Text| {
            kind = match (kind, k) {
                (Kind::Copy, _) | (_, Kind::Copy) => Kind::Copy,
                (Kind::Write, _) | (_, Kind::Write) => Kind::Write,
                _ => Kind::Read,
            };
            if want_label {
                texts.push(t);
            }
        };
        for msg in unit {
            match msg.kind {
                wire::QUERY => {
                    let text = wire::query_text(&msg.body)?;
                    add(sql::kind_of(&text), Text::Query(text));
                }
                wire::PARSE => {
                    let p = Arc::new(Parse::decode(&msg.body)?);
                    if p.name.is_empty() {
                        unnamed = Some(p.clone());
                    }
                    add(p.kind(), Text::Stmt(p));
                }
                wire::BIND => {
                    let b = wire::Bind::decode(&msg.body)?;
                    let p = if b.statement.is_empty() { unnamed.as_ref() } else { self.statements.get(&b.statement) };
                    if let Some(p) = p {
                        add(p.kind(), Text::Stmt(p.clone())); // classified once per statement object
                    }
                }
                _ => {}
            }
        }
        if kind != Kind::Read || texts.is_empty() {
            return Ok((kind, None));
        }
        let refs: Vec<&str> = texts
            .iter()
            .map(|t| match t {
                Text::Query(s) => s.as_str(),
                Text::Stmt(p) => p.sql.as_str(),
            })
            .collect();
        Ok((kind, Some(self.m.label(&refs))))
    }
}

impl Session {
    /// What the row scheduler must hold for a unit (`scope`): the join of its statements' scopes,
    /// each with the parameters of the Bind that runs it. The database when the facts are not
    /// current inside a transaction, or the session ran SET or RESET. Also how the unit ends its
    /// transaction: its last statement's COMMIT or ROLLBACK (a unit that holds the database may
    /// say None). With a recovery log, a unit that begins a transaction, or runs anything after
    /// its COMMIT or ROLLBACK, holds the database: the log keeps a transaction's units together
    /// only from its first unit to the one ending it.
    pub(super) async fn unit_scope(&mut self, unit: &[Message]) -> SResult<(Scope, Option<Control>)> {
        let m = self.m.clone();
        let Some(s) = m.scheduler.as_ref() else { return Ok((Scope::Database, None)) };
        let mut scope = Scope::Shared;
        let mut parsed: Vec<Arc<Parse>> = Vec::new();
        let mut unnamed = self.unnamed.clone();
        // the last statement's control, and whether one began or ended a transaction before another
        let (mut last, mut inside) = (None, false);
        for msg in unit {
            let (next, control) = match msg.kind {
                wire::QUERY => {
                    let text = wire::query_text(&msg.body)?;
                    self.unscoped |= sets(&text);
                    let (sc, c) = Shaped::Text(text).resolve(&[], s, &m, self).await;
                    (scope.join(sc), c)
                }
                wire::PARSE => {
                    let p = Arc::new(Parse::decode(&msg.body)?);
                    self.unscoped |= sets(&p.sql);
                    if p.name.is_empty() {
                        unnamed = Some(p);
                    } else {
                        parsed.push(p);
                    }
                    continue;
                }
                wire::BIND => {
                    let b = wire::Bind::decode(&msg.body)?;
                    let p = if b.statement.is_empty() {
                        unnamed.clone()
                    } else {
                        parsed.iter().rev().find(|p| p.name == b.statement).or_else(|| self.statements.get(&b.statement)).cloned()
                    };
                    match p {
                        Some(p) => match scope::bind_params(b.rest, &p.types) {
                            Some(params) => {
                                let (sc, c) = Shaped::Stmt(p.clone()).resolve(&params, s, &m, self).await;
                                (scope.join(sc), c)
                            }
                            None => (Scope::Database, None), // parameters that do not parse
                        },
                        None => (Scope::Database, None), // an unknown statement (the backend says so)
                    }
                }
                _ => continue,
            };
            scope = next;
            inside |= matches!(last, Some(Control::Commit | Control::Rollback)) || control == Some(Control::Begin);
            last = control;
            if scope == Scope::Database {
                break;
            }
        }
        if inside && m.recovery.is_some() {
            scope = Scope::Database;
        }
        s.count(&scope);
        Ok((scope, last.filter(|c| matches!(c, Control::Commit | Control::Rollback))))
    }
}

/// A statement text that changes a session's settings: any of its statements starting with SET or
/// RESET (SET LOCAL too; tokenized only when the word is in it at all).
pub(super) fn sets(text: &str) -> bool {
    if !text.as_bytes().windows(3).any(|w| w.eq_ignore_ascii_case(b"SET")) {
        return false;
    }
    let toks = sql::tokens(text);
    sql::statements(&toks).iter().any(|st| matches!(st[0].text.as_str(), "SET" | "RESET"))
}

/// A statement of a unit: a Query's text, or a Parse (its shape read once).
enum Shaped {
    Text(String),
    Stmt(Arc<Parse>),
}

impl Shaped {
    async fn resolve(
        &self,
        params: &[Option<std::borrow::Cow<'_, str>>],
        s: &crate::middleware::scheduler::Scheduler,
        m: &crate::middleware::Manager,
        session: &Session,
    ) -> (Scope, Option<Control>) {
        let owned;
        let shape = match self {
            Shaped::Text(t) => {
                owned = scope::shape(t);
                &owned
            }
            Shaped::Stmt(p) => p.shape(),
        };
        match shape {
            scope::Shape::Read => return (Scope::Shared, None),
            scope::Shape::Control(c) => return (Scope::Shared, Some(*c)),
            scope::Shape::Database => return (Scope::Database, None),
            _ if session.unscoped => return (Scope::Database, None),
            _ => {}
        }
        // facts read again only by a transaction that holds nothing yet (under the database)
        let facts = if session.txn.is_some() { s.current_facts(m) } else { s.facts(m).await };
        match facts {
            Some(f) => (scope::resolve(shape, params, &f), None),
            None => (Scope::Database, None),
        }
    }
}

/// A plain BEGIN the session answers itself: the answer, the body of the simple Query that sends it
/// later, and (extended protocol) the Parse that is the client's unnamed statement afterwards.
pub(super) struct DeferredBegin {
    pub(super) answer: Vec<u8>,
    pub(super) query: Vec<u8>,
    pub(super) parse: Option<Arc<Parse>>,
}

/// A unit that is a plain BEGIN (`sql::plain_begin`), alone: a simple Query, or (extended
/// protocol, as `pgbench -M extended` sends it) Parse of the unnamed statement with no parameter
/// types, Bind of the unnamed portal with no parameters, an optional Describe of that portal,
/// Execute, Sync. None for anything else.
pub(super) fn deferred_begin(unit: &[Message]) -> SResult<Option<DeferredBegin>> {
    let mut answer = Vec::new();
    if let [q] = unit {
        if q.kind != wire::QUERY || !may_begin(&q.body) || !sql::plain_begin(&wire::query_text(&q.body)?) {
            return Ok(None);
        }
        answer.extend_from_slice(&wire::command_complete("BEGIN"));
        answer.extend_from_slice(&wire::ready(b'T'));
        return Ok(Some(DeferredBegin { answer, query: q.body.clone(), parse: None }));
    }
    let kinds: Vec<u8> = unit.iter().map(|m| m.kind).collect();
    let described = match kinds.as_slice() {
        [wire::PARSE, wire::BIND, wire::EXECUTE, wire::SYNC] => false,
        [wire::PARSE, wire::BIND, wire::DESCRIBE, wire::EXECUTE, wire::SYNC] => true,
        _ => return Ok(None),
    };
    // the statement's text follows its name (an unnamed statement's is empty: one NUL)
    if unit[0].body.first() != Some(&0) || !may_begin(&unit[0].body[1..]) {
        return Ok(None);
    }
    let p = Parse::decode(&unit[0].body)?;
    if !p.name.is_empty() || p.types.iter().any(|&b| b != 0) || !sql::plain_begin(&p.sql) {
        return Ok(None);
    }
    let b = wire::Bind::decode(&unit[1].body)?;
    if !b.portal.is_empty() || !b.statement.is_empty() || !no_parameters(b.rest) {
        return Ok(None);
    }
    if described {
        let t = wire::Target::decode(&unit[2].body)?;
        if t.what != b'P' || !t.name.is_empty() {
            return Ok(None);
        }
    }
    if !wire::cstring(&unit[unit.len() - 2].body, 0)?.0.is_empty() {
        return Ok(None); // Execute of another portal
    }
    answer.extend_from_slice(&wire::frame(wire::PARSE_COMPLETE, b""));
    answer.extend_from_slice(&wire::frame(wire::BIND_COMPLETE, b""));
    if described {
        answer.extend_from_slice(&wire::frame(wire::NO_DATA, b""));
    }
    answer.extend_from_slice(&wire::command_complete("BEGIN"));
    answer.extend_from_slice(&wire::ready(b'T'));
    let mut query = p.sql.clone().into_bytes();
    query.push(0);
    Ok(Some(DeferredBegin { answer, query, parse: Some(Arc::new(p)) }))
}

/// A Bind's rest (after portal and statement) binds no parameter: its parameter format codes, then
/// a parameter count of zero.
fn no_parameters(rest: &[u8]) -> bool {
    let u16_at = |i: usize| rest.get(i..i + 2).map(|b| u16::from_be_bytes([b[0], b[1]]) as usize);
    let Some(formats) = u16_at(0) else { return false };
    u16_at(2 + 2 * formats) == Some(0)
}
