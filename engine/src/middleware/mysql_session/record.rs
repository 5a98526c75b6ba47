//! A write unit's record in the recovery log: the middleware's packets around the client's
//! command and `SET insert_id = <the AUTO_INCREMENT value it took>`, found in the answer.

use std::sync::Arc;

use crate::middleware::mysql_wire as my;
use crate::middleware::recovery;

/// A write unit's record to append to the recovery log (`broadcast`, under the write lock).
pub(super) struct Logging {
    pub(super) log: Arc<recovery::Log>,
    pub(super) seq: u64,
    pub(super) pre: Vec<u8>,
    pub(super) post: Vec<u8>,
    pub(super) command: Vec<u8>,
}

/// The first AUTO_INCREMENT value a unit's answer reports (the first OK with a last insert id
/// other than 0, its results followed through), 0 when none.
pub(super) fn first_insert_id(replies: &[u8]) -> u64 {
    let mut packets = Vec::new();
    let mut at = 0;
    while at + 4 <= replies.len() {
        let n = my::header(replies, at).0;
        let Some(p) = replies.get(at + 4..at + 4 + n) else { break };
        packets.push(p);
        at += 4 + n;
    }
    let mut i = 0;
    while let Some(p) = packets.get(i) {
        match p.first() {
            Some(0x00) if p.len() >= 7 => {
                let Ok((_, id, status)) = my::parse_ok(p) else { return 0 };
                if id != 0 {
                    return id;
                }
                if status & my::STATUS_MORE_RESULTS == 0 {
                    return 0;
                }
                i += 1;
            }
            Some(0xFF) | None => return 0,
            _ => {
                // a result set: skip to the EOF after its rows
                let Ok((columns, _)) = my::lenenc_int(p, 0) else { return 0 };
                i += 1 + columns as usize + 1;
                loop {
                    let Some(q) = packets.get(i) else { return 0 };
                    i += 1;
                    if q.first() == Some(&0xFE) && q.len() < 9 {
                        if my::u16_at(q, 3).unwrap_or(0) & my::STATUS_MORE_RESULTS == 0 {
                            return 0;
                        }
                        break;
                    }
                    if q.first() == Some(&0xFF) {
                        return 0;
                    }
                }
            }
        }
    }
    0
}

/// Append a unit's record, with `SET insert_id = <the value it took>` first when it took one (a
/// replay then gives its rows the same AUTO_INCREMENT values whatever the stale backend's counter
/// says: values taken by a transaction it was running when it went down are lost there); fsync'd
/// when the unit leaves no transaction open.
pub(super) async fn log_unit(lg: &Logging, ok: bool, replies: &[u8], status: u16) -> Result<(), String> {
    let id = first_insert_id(replies);
    let mut pre = Vec::new();
    if id != 0 {
        my::packet_into(&mut pre, 0, format!("\x03SET insert_id = {id}").as_bytes());
    }
    pre.extend_from_slice(&lg.pre);
    let rec = recovery::my_record(ok, &pre, &lg.post, &lg.command);
    recovery::append(lg.log.clone(), lg.seq, Arc::new(rec), my::idle(status)).await
}
