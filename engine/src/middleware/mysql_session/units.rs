//! What a command is and where it goes: the statements answered here (`USE` of the served
//! database, `SET NAMES utf8mb4`, `SELECT @@socket`), then a read to one backend, a write to all,
//! anything inside a transaction to all its backends.

use std::sync::{Arc, LazyLock};

use super::client::{Fail, SResult, Session};
use super::outgoing::Unit;
use crate::middleware::mysql_wire as my;
use crate::middleware::sql::{self, Kind};

pub(super) static USE: LazyLock<regex::Regex> =
    LazyLock::new(|| regex::Regex::new(r"(?i)^\s*USE\s+`?([A-Za-z0-9_$]+)`?\s*;?\s*$").expect("valid regex"));

pub(super) static SOCKET: LazyLock<regex::Regex> = LazyLock::new(|| regex::Regex::new(r"(?i)^\s*SELECT\s+@@socket\s*;?\s*$").expect("valid regex"));

pub(super) static SET_NAMES: LazyLock<regex::Regex> =
    LazyLock::new(|| regex::Regex::new(r"(?i)^\s*SET\s+NAMES\s+'?utf8mb4'?(\s+COLLATE\s+'?utf8mb4_general_ci'?)?\s*;?\s*$").expect("valid regex"));

impl Session {
    pub(super) async fn query(&mut self, payload: Vec<u8>) -> SResult<()> {
        self.m.count(|c| c.units += 1);
        let text = String::from_utf8_lossy(&payload[1..]).into_owned();
        if let Some(cap) = USE.captures(&text) {
            self.use_db(&cap[1]);
            return Ok(());
        }
        if SET_NAMES.is_match(&text) {
            self.reply(&my::ok(0, 0, self.status_flags()), 1);
            return Ok(());
        }
        if SOCKET.is_match(&text) {
            let answer = my::text_result("@@socket", &[""], self.status_flags());
            self.io.out.extend_from_slice(&answer);
            return Ok(());
        }
        if self.txn.is_none() && self.pending_begin.is_none() && sql::plain_begin(&text) {
            // answered here; sent with the next unit, under the write lock that unit takes
            self.pending_begin = Some(payload);
            self.reply(&my::ok(0, 0, self.status_flags()), 1);
            return Ok(());
        }
        let kind = sql::kind_of(&text);
        let label =
            (kind == Kind::Read && self.txn.is_none() && self.pending_begin.is_none() && self.m.tracks_labels()).then(|| self.m.label(&[&text]));
        self.route(Unit::Query(payload), &text, kind, label).await
    }

    /// Run a unit: inside a transaction on all its backends, else a read on one, a write on all.
    pub(super) async fn route(&mut self, unit: Unit, text: &str, kind: Kind, label: Option<Arc<str>>) -> SResult<()> {
        let r = if self.txn.is_some() || self.pending_begin.is_some() {
            self.m.count(|c| c.transaction_units += 1);
            self.write(&unit, text).await
        } else if kind == Kind::Read {
            self.read(&unit, label).await
        } else {
            self.write(&unit, text).await
        };
        match r {
            Err(Fail::NoBackend(e)) => {
                self.refuse(my::ER_UNKNOWN_ERROR, &e, "08S01");
                Ok(())
            }
            other => other,
        }
    }
}
