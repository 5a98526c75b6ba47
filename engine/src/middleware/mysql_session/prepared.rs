//! Prepared statements: COM_STMT_PREPARE on one backend (chosen like a read) answered with the
//! session's own statement id; COM_STMT_EXECUTE a unit like a query, the parameter types the
//! client bound last sent with every execute; COM_STMT_CLOSE, COM_STMT_RESET; cursors and
//! COM_STMT_SEND_LONG_DATA refused.

use std::sync::Arc;

use super::client::{Fail, SResult, Session};
use super::outgoing::Unit;
use crate::middleware::mysql_wire as my;
use crate::middleware::sql::{self, Kind};

pub(super) const CURSORS_UNSUPPORTED: &str =
    "server-side cursors (COM_STMT_EXECUTE with a cursor flag, COM_STMT_FETCH) are not supported by the tierscope middleware";

pub(super) const LONG_DATA_UNSUPPORTED: &str = "COM_STMT_SEND_LONG_DATA is not supported by the tierscope middleware";

/// A statement a client prepared (its id is the session's own).
pub(super) struct PStmt {
    pub(super) sql: Arc<Vec<u8>>,
    pub(super) text: String,
    pub(super) params: u16,
    pub(super) kind: Kind,
    /// the parameter types the client bound last (sent again with every execute)
    pub(super) types: Option<Vec<u8>>,
    /// COM_STMT_SEND_LONG_DATA came (not supported)
    pub(super) long_data: bool,
}

impl Session {
    /// Prepare on one backend (chosen like a read; inside a transaction on its first connection)
    /// and answer with the session's own statement id.
    pub(super) async fn stmt_prepare(&mut self, sql: Vec<u8>) -> SResult<()> {
        self.m.count(|c| c.named_statements += 1);
        let (m, c) = (self.m.clone(), self.c.clone());
        let prepared = if let Some(txn) = self.txn.as_mut() {
            let Some((_, conn)) = txn.conns.first_mut() else {
                return Err(Fail::End(Some("a transaction without connections".into())));
            };
            conn.prepare(&sql).await.map_err(|e| Fail::End(Some(format!("prepare failed: {e}"))))?
        } else {
            loop {
                let (b, _, token) = match m.choose_read(None) {
                    Ok(x) => x,
                    Err(e) => {
                        self.refuse(my::ER_UNKNOWN_ERROR, &e.0, "08S01");
                        return Ok(());
                    }
                };
                let mut conn = match c.pools[b].acquire().await {
                    Ok(conn) => conn,
                    Err(err) => {
                        m.read_over(b, token);
                        c.disable(b, &format!("prepare failed: {err}"));
                        continue;
                    }
                };
                let r = conn.prepare(&sql).await;
                if r.is_err() {
                    conn.close();
                }
                c.release(b, conn);
                m.read_over(b, token);
                match r {
                    Ok(p) => break p,
                    Err(err) => c.disable(b, &format!("prepare failed: {err}")),
                }
            }
        };
        let Some(_) = prepared.sid else {
            self.m.count(|c| c.errors_to_clients += 1);
            for (q, p) in &prepared.packets {
                my::packet_into(&mut self.io.out, *q, p);
            }
            return Ok(());
        };
        let cid = self.next_stmt;
        self.next_stmt = self.next_stmt.wrapping_add(1);
        let first = &prepared.packets[0].1;
        let params = my::u16_at(first, 7)?;
        let text = String::from_utf8_lossy(&sql).into_owned();
        let kind = sql::kind_of(&text);
        self.stmts.insert(cid, PStmt { sql: Arc::new(sql), text, params, kind, types: None, long_data: false });
        for (i, (q, p)) in prepared.packets.iter().enumerate() {
            if i == 0 {
                let mut ok = p.clone();
                ok[1..5].copy_from_slice(&cid.to_le_bytes());
                my::packet_into(&mut self.io.out, *q, &ok);
            } else {
                my::packet_into(&mut self.io.out, *q, p);
            }
        }
        Ok(())
    }

    pub(super) async fn stmt_execute(&mut self, payload: &[u8]) -> SResult<()> {
        let cid = if payload.len() >= 10 { my::u32_at(payload, 1).ok() } else { None };
        let problem = match cid.and_then(|id| self.stmts.get(&id)) {
            None => {
                let id = cid.map_or("-1".to_string(), |i| i.to_string());
                Some((my::ER_UNKNOWN_STMT_HANDLER, format!("Unknown prepared statement handler ({id}) given to mysqld_stmt_execute"), "HY000"))
            }
            Some(_) if payload[5] != 0 => Some((my::ER_NOT_SUPPORTED_YET, CURSORS_UNSUPPORTED.to_string(), "42000")),
            Some(st) if st.long_data => Some((my::ER_NOT_SUPPORTED_YET, LONG_DATA_UNSUPPORTED.to_string(), "42000")),
            Some(_) => None,
        };
        if let Some((code, message, state)) = problem {
            self.refuse(code, &message, state);
            return Ok(());
        }
        let Some(st) = cid.and_then(|id| self.stmts.get_mut(&id)) else {
            return Ok(());
        };
        let mut body = payload[5..].to_vec(); // flags, iteration count, then the parameters
        if st.params > 0 {
            let n = st.params as usize;
            let at = 5 + n.div_ceil(8); // the new-params-bound flag
            if body.get(at) == Some(&1) {
                st.types = body.get(at + 1..(at + 1 + 2 * n).min(body.len())).map(<[u8]>::to_vec);
            } else if let Some(types) = &st.types {
                // this backend connection may not have seen the types: send them again
                if at < body.len() {
                    let mut b = body[..at].to_vec();
                    b.push(1);
                    b.extend_from_slice(types);
                    b.extend_from_slice(&body[at + 1..]);
                    body = b;
                }
            }
        }
        let (sql, text, kind) = (st.sql.clone(), st.text.clone(), st.kind);
        self.m.count(|c| c.units += 1);
        let label = (kind == Kind::Read && self.txn.is_none() && self.m.tracks_labels()).then(|| self.m.label(&[&text]));
        self.route(Unit::Execute(sql, body), &text, kind, label).await
    }

    /// COM_STMT_CLOSE and COM_STMT_SEND_LONG_DATA (no answer), COM_STMT_RESET (OK).
    pub(super) fn stmt_other(&mut self, cmd: u8, payload: &[u8]) {
        let cid = if payload.len() >= 5 { my::u32_at(payload, 1).ok() } else { None };
        match cmd {
            my::COM_STMT_CLOSE => {
                if let Some(id) = cid {
                    self.stmts.remove(&id); // the backends keep it prepared for the next client of that text
                }
            }
            my::COM_STMT_SEND_LONG_DATA => {
                if let Some(st) = cid.and_then(|id| self.stmts.get_mut(&id)) {
                    st.long_data = true;
                }
            }
            _ => {
                if let Some(st) = cid.and_then(|id| self.stmts.get_mut(&id)) {
                    st.long_data = false;
                    let ok = my::ok(0, 0, self.status_flags());
                    self.reply(&ok, 1);
                } else {
                    let id = cid.map_or("-1".to_string(), |i| i.to_string());
                    self.refuse(
                        my::ER_UNKNOWN_STMT_HANDLER,
                        &format!("Unknown prepared statement handler ({id}) given to mysqld_stmt_reset"),
                        "HY000",
                    );
                }
            }
        }
    }
}
