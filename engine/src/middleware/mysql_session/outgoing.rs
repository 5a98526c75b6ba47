//! The outgoing unit: the commands a unit becomes on a backend connection (a query, or a prepared
//! statement's execute) and, for a write calling time functions, the `SET timestamp`s around it
//! whose answers the client does not see.

use std::sync::Arc;

use super::client::Session;
use crate::middleware::mysql_wire as my;
use crate::middleware::sql::Micros;

/// A unit of work: a COM_QUERY payload, or a prepared statement's SQL and COM_STMT_EXECUTE's
/// payload after the statement id.
pub(super) enum Unit {
    Query(Vec<u8>),
    Execute(Arc<Vec<u8>>, Vec<u8>),
}

/// The commands one backend connection gets for a unit: `pre` + the query (or the execute, the
/// statement prepared first where it is not yet) + `post`, and per command whether the client sees
/// its answer.
pub(super) struct Outgoing {
    pub(super) query: Vec<u8>,
    pub(super) stmt: Option<(Arc<Vec<u8>>, Vec<u8>)>,
    pub(super) pre: Vec<u8>,
    pub(super) post: Vec<u8>,
    pub(super) passed: Vec<bool>,
    /// the unit's number in the recovery log: its position is recorded with it (`execute`)
    pub(super) seq: Option<u64>,
    /// it opens a transaction or sets autocommit (`recovery::my_opens_transaction`)
    pub(super) opens: bool,
}

impl Session {
    /// What to send each backend for `unit`; for a write (`macros_at`), between `SET timestamp`s
    /// when it calls time functions.
    pub(super) fn outgoing(&self, unit: &Unit, text: &str, macros_at: Option<Micros>) -> Outgoing {
        let mut out = match unit {
            Unit::Query(p) => {
                Outgoing { query: my::packet(0, p), stmt: None, pre: Vec::new(), post: Vec::new(), passed: vec![true], seq: None, opens: false }
            }
            Unit::Execute(sql, body) => Outgoing {
                query: Vec::new(),
                stmt: Some((sql.clone(), body.clone())),
                pre: Vec::new(),
                post: Vec::new(),
                passed: vec![true],
                seq: None,
                opens: false,
            },
        };
        if let Some(at) = macros_at {
            let n = my::time_functions(text);
            if n > 0 {
                self.m.count(|c| c.macros_rewritten += n as u64);
                let set = format!("\x03SET timestamp = {}.{:06}", at.div_euclid(1_000_000), at.rem_euclid(1_000_000));
                out.pre = my::packet(0, set.as_bytes());
                out.post = my::packet(0, b"\x03SET timestamp = DEFAULT");
                out.passed = vec![false, true, false];
            }
        }
        out
    }
}
