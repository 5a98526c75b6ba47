//! The recovery position a write unit records on each backend (`--recovery-log`): the update of
//! the recovery table put in front of the unit's own messages, hidden from the client, so that it
//! commits or rolls back with the unit.

use super::outgoing::{Outgoing, Step};
use crate::middleware::recovery;
use crate::middleware::replies::Mode;
use crate::middleware::sql;
use crate::middleware::wire::{self, Parse};

/// Make a write unit record position `seq` in each backend's recovery table first, hidden from the
/// client, so that the position commits or rolls back with the unit's own statements: a Parse,
/// Bind, Execute and Close before the unit's messages (extended protocol), or `UPDATE ...;` before
/// a simple Query's text (its CommandComplete hidden). False (no position recorded) for a unit
/// running a statement PostgreSQL refuses in a transaction block, or an empty Query.
pub(super) fn with_position(out: &mut Outgoing, seq: u64) -> bool {
    let msgs = recovery::messages(&out.data);
    let Some(&(first, _, ref body)) = msgs.first() else {
        return false;
    };
    for (k, _, b) in &msgs {
        let text = match *k {
            wire::QUERY => wire::query_text(&out.data[b.clone()]).ok(),
            wire::PARSE => Parse::decode(&out.data[b.clone()]).ok().map(|p| p.sql),
            _ => None,
        };
        if text.is_some_and(|t| recovery::outside_transactions(&t)) {
            return false;
        }
    }
    let update = recovery::position_sql(seq);
    let Some(step) = out.plan.iter().position(|s| matches!(s, Step::Sent(..))) else {
        return false;
    };
    if first == wire::QUERY && msgs.len() == 1 {
        let Ok(text) = wire::query_text(&out.data[body.clone()]) else {
            return false;
        };
        if sql::tokens(&text).is_empty() {
            return false; // an empty query is answered EmptyQueryResponse, not a CommandComplete
        }
        out.data = wire::query(&format!("{update};\n{text}"));
        out.plan[step] = Step::Sent(wire::QUERY, Mode::PassButFirst, 0);
        return true;
    }
    if msgs.iter().any(|m| m.0 == wire::QUERY) {
        return false; // (a Query ending a flushed unit: not recorded)
    }
    const PORTAL: &str = "_tierscope_recovery";
    let mut pre = Vec::with_capacity(update.len() + 64);
    let mut body = Vec::new();
    body.push(0);
    body.extend_from_slice(update.as_bytes());
    body.extend_from_slice(&[0, 0, 0]);
    wire::frame_into(&mut pre, wire::PARSE, &body);
    body.clear();
    body.extend_from_slice(PORTAL.as_bytes());
    body.extend_from_slice(&[0, 0, 0, 0, 0, 0, 0, 0]);
    wire::frame_into(&mut pre, wire::BIND, &body);
    body.clear();
    body.extend_from_slice(PORTAL.as_bytes());
    body.extend_from_slice(&[0, 0, 0, 0, 0]);
    wire::frame_into(&mut pre, wire::EXECUTE, &body);
    body.clear();
    body.push(b'P');
    body.extend_from_slice(PORTAL.as_bytes());
    body.push(0);
    wire::frame_into(&mut pre, wire::CLOSE, &body);
    pre.extend_from_slice(&out.data);
    out.data = pre;
    let hidden = [
        Step::Sent(wire::PARSE, Mode::Hide, 0),
        Step::Sent(wire::BIND, Mode::Hide, 0),
        Step::Sent(wire::EXECUTE, Mode::Hide, 0),
        Step::Sent(wire::CLOSE, Mode::Hide, b'P'),
    ];
    out.plan.splice(step..step, hidden);
    true
}
