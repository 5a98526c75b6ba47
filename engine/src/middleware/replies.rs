//! Which backend reply answers which request message (a port of
//! `python/tierscope/middleware/replies.py`).
//!
//! The proxy sends a backend the client's messages, sometimes with messages of its own in between
//! (a Parse that recreates a statement the client prepared earlier on another connection) and
//! sometimes without some of the client's (a Parse of a statement the proxy keeps itself). The
//! PostgreSQL reply to each message is fixed by the protocol, so a queue of what was sent tells,
//! for every reply, whether to pass it to the client, hide it, or add an answer of the proxy's own.

use std::collections::VecDeque;

use super::wire::{self, ProtocolError};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    Pass,
    Hide,
    Synth,
    /// a Query whose text begins with a statement of the proxy's (the recovery log's position):
    /// its first CommandComplete is hidden, the rest passed
    PassButFirst,
}

#[derive(Clone, Debug)]
struct Expect {
    kind: u8, // the request message type (DESCRIBE with target b'S'/b'P')
    mode: Mode,
    target: u8,
    synth: Vec<u8>,
    seen_param_desc: bool,
    /// PassButFirst: the first CommandComplete went by (hidden)
    first_hidden: bool,
}

/// The replies still due for the messages sent in one unit of work.
#[derive(Clone, Debug, Default)]
pub struct ReplyPlan {
    queue: VecDeque<Expect>,
    pub errors: usize,
    skipping: bool, // an error came and no Sync has been sent since: the server ignores all
}

fn is_final(req: u8, kind: u8) -> bool {
    match req {
        wire::PARSE => kind == wire::PARSE_COMPLETE,
        wire::BIND => kind == wire::BIND_COMPLETE,
        wire::CLOSE => kind == wire::CLOSE_COMPLETE,
        wire::EXECUTE => matches!(kind, wire::COMMAND_COMPLETE | wire::EMPTY_QUERY | wire::PORTAL_SUSPENDED),
        wire::SYNC | wire::QUERY => kind == wire::READY,
        _ => false,
    }
}

fn is_interim(req: u8, kind: u8) -> bool {
    match req {
        wire::EXECUTE => matches!(kind, wire::DATA_ROW | wire::ROW_DESCRIPTION),
        wire::QUERY => matches!(kind, wire::ROW_DESCRIPTION | wire::DATA_ROW | wire::COMMAND_COMPLETE | wire::EMPTY_QUERY),
        _ => false,
    }
}

impl ReplyPlan {
    pub fn sent(&mut self, kind: u8, mode: Mode, target: u8) {
        if kind == wire::FLUSH {
            return;
        }
        if self.skipping {
            if kind != wire::SYNC && kind != wire::QUERY {
                return;
            }
            self.skipping = false;
        }
        self.queue.push_back(Expect { kind, mode, target, synth: Vec::new(), seen_param_desc: false, first_hidden: false });
    }

    /// A message the proxy answers itself (it was not sent); `answer` is encoded.
    pub fn answered_here(&mut self, answer: Vec<u8>) {
        if !self.skipping {
            self.queue.push_back(Expect { kind: 0, mode: Mode::Synth, target: 0, synth: answer, seen_param_desc: false, first_hidden: false });
        }
    }

    /// Answers of the proxy's own that are next in line (before any backend reply), appended to `out`.
    pub fn due_now(&mut self, out: &mut Vec<u8>) {
        while self.queue.front().is_some_and(|e| e.mode == Mode::Synth) {
            let e = self.queue.pop_front().expect("front exists");
            out.extend_from_slice(&e.synth);
        }
    }

    /// A backend reply arrived: pass it on? The proxy's answers due right after it go to `after`.
    pub fn reply(&mut self, kind: u8, after: &mut Vec<u8>) -> Result<bool, ProtocolError> {
        if wire::is_async(kind) {
            return Ok(true);
        }
        if kind == wire::ERROR {
            self.errors += 1;
            // the client must learn that its unit failed, even when the proxy's own message did
            while self.queue.front().is_some_and(|e| e.kind != wire::SYNC && e.kind != wire::QUERY) {
                self.queue.pop_front();
            }
            if self.queue.is_empty() {
                // the Sync ending the skip has not been sent yet (a Flush came first)
                self.skipping = true;
            }
            return Ok(true);
        }
        let Some(head) = self.queue.front_mut() else {
            return Err(ProtocolError(format!("backend sent {:?} with nothing outstanding", kind as char)));
        };
        let pass = matches!(head.mode, Mode::Pass | Mode::PassButFirst);
        if head.kind == wire::DESCRIBE {
            if head.target == b'S' && kind == wire::PARAMETER_DESCRIPTION && !head.seen_param_desc {
                head.seen_param_desc = true;
                return Ok(pass);
            }
            if kind == wire::ROW_DESCRIPTION || kind == wire::NO_DATA {
                self.queue.pop_front();
                self.due_now(after);
                return Ok(pass);
            }
            return Err(ProtocolError(format!("backend sent {:?} in reply to Describe", kind as char)));
        }
        if is_interim(head.kind, kind) {
            if head.mode == Mode::PassButFirst && kind == wire::COMMAND_COMPLETE && !head.first_hidden {
                head.first_hidden = true;
                return Ok(false);
            }
            return Ok(pass);
        }
        if is_final(head.kind, kind) {
            self.queue.pop_front();
            self.due_now(after);
            return Ok(pass);
        }
        Err(ProtocolError(format!("backend sent {:?} in reply to {:?}", kind as char, head.kind as char)))
    }

    pub fn done(&self) -> bool {
        self.queue.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hides_the_proxys_messages_and_adds_its_own_answers() {
        let mut p = ReplyPlan::default();
        p.answered_here(b"KEPT".to_vec());
        p.sent(wire::PARSE, Mode::Hide, 0);
        p.sent(wire::BIND, Mode::Pass, 0);
        p.sent(wire::DESCRIBE, Mode::Pass, b'P');
        p.sent(wire::EXECUTE, Mode::Pass, 0);
        p.sent(wire::SYNC, Mode::Pass, 0);
        let mut early = Vec::new();
        p.due_now(&mut early);
        assert_eq!(early, b"KEPT");
        let mut after = Vec::new();
        let seen: Vec<bool> = [
            wire::PARSE_COMPLETE,
            wire::BIND_COMPLETE,
            wire::ROW_DESCRIPTION,
            wire::DATA_ROW,
            wire::NOTICE,
            wire::DATA_ROW,
            wire::COMMAND_COMPLETE,
            wire::READY,
        ]
        .iter()
        .map(|&k| p.reply(k, &mut after).unwrap())
        .collect();
        assert_eq!(seen, [false, true, true, true, true, true, true, true]);
        assert!(p.done() && after.is_empty());
    }

    #[test]
    fn a_query_with_the_proxys_statement_first_hides_its_first_command_complete() {
        let mut p = ReplyPlan::default();
        p.sent(wire::QUERY, Mode::PassButFirst, 0);
        let mut after = Vec::new();
        let seen: Vec<bool> =
            [wire::COMMAND_COMPLETE, wire::ROW_DESCRIPTION, wire::DATA_ROW, wire::COMMAND_COMPLETE, wire::COMMAND_COMPLETE, wire::READY]
                .iter()
                .map(|&k| p.reply(k, &mut after).unwrap())
                .collect();
        assert_eq!(seen, [false, true, true, true, true, true]);
        assert!(p.done());
    }

    #[test]
    fn after_an_error_expects_only_ready() {
        let mut p = ReplyPlan::default();
        for k in [wire::PARSE, wire::BIND, wire::EXECUTE] {
            p.sent(k, Mode::Pass, 0);
        }
        p.answered_here(b"CLOSE-COMPLETE".to_vec());
        p.sent(wire::SYNC, Mode::Pass, 0);
        let mut after = Vec::new();
        assert!(p.reply(wire::ERROR, &mut after).unwrap());
        assert!(!p.done());
        assert!(p.reply(wire::READY, &mut after).unwrap());
        assert!(p.done() && after.is_empty());
        assert!(p.reply(wire::DATA_ROW, &mut after).is_err());
    }

    #[test]
    fn an_error_before_the_sync_is_sent_skips_until_it_is() {
        let mut p = ReplyPlan::default();
        p.sent(wire::BIND, Mode::Pass, 0);
        p.sent(wire::EXECUTE, Mode::Pass, 0);
        let mut after = Vec::new();
        assert!(p.reply(wire::ERROR, &mut after).unwrap());
        assert!(p.done());
        p.sent(wire::BIND, Mode::Pass, 0); // ignored by the server
        p.sent(wire::SYNC, Mode::Pass, 0);
        assert!(p.reply(wire::READY, &mut after).unwrap() && p.done());
    }
}
