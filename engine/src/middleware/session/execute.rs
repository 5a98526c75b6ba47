//! One unit (or the part of it up to a Flush) on one backend connection: the bytes sent, the
//! answers read by the reply plan, what the client must see kept in a sink (a read's written to
//! the client as it comes), and what the backend answered.

use tokio::io::AsyncWriteExt;

use super::outgoing::Outgoing;
use crate::middleware::answer;
use crate::middleware::pool::Conn;
use crate::middleware::replies::ReplyPlan;
use crate::middleware::wire;

/// What one backend answered to a unit: its status is ReadyForQuery's byte (`I` when idle).
pub(super) type Exec = answer::Exec<u8>;
pub(super) use crate::middleware::answer::Sink;

/// Send a unit (or the part of it up to a Flush, continuing `plan`) on one connection and read the
/// answers due; the answers the client must see go to `sink`.
pub(super) async fn execute(conn: &mut Conn, out: &Outgoing, sink: &mut Sink<'_>, plan: &mut ReplyPlan) -> Exec {
    let mut x = Exec { ok: true, status: b'I', ..Default::default() };
    plan.due_now(&mut sink.held);
    let result: Result<(), String> = async {
        conn.stream.write_all(&out.data).await.map_err(|e| e.to_string())?;
        let mut after = Vec::new();
        while !plan.done() {
            let avail = conn.buf.len() - conn.pos;
            if avail >= 5 {
                let n = wire::header_length(&conn.buf, conn.pos).map_err(|e| e.0)?;
                if avail >= 5 + n {
                    let kind = conn.buf[conn.pos];
                    let passed = plan.reply(kind, &mut after).map_err(|e| e.0)?;
                    let msg = &conn.buf[conn.pos..conn.pos + 5 + n];
                    match kind {
                        wire::ERROR => {
                            x.ok = false;
                            if x.error.is_none() {
                                x.error = Some(wire::error_text(&msg[5..]));
                            }
                        }
                        wire::COMMAND_COMPLETE => x.tags.push(wire::cstring(&msg[5..], 0).map(|t| t.0).unwrap_or_default()),
                        wire::READY => {
                            x.status = msg.get(5).copied().unwrap_or(b'I');
                            conn.status = x.status;
                        }
                        _ => {}
                    }
                    if passed {
                        sink.held.extend_from_slice(msg);
                    }
                    if !after.is_empty() {
                        sink.held.append(&mut after);
                    }
                    conn.pos += 5 + n;
                    continue;
                }
            }
            sink.maybe_flush().await;
            conn.more().await.map_err(|e| format!("{e}"))?;
        }
        Ok(())
    }
    .await;
    if let Err(err) = result {
        x.ok = false;
        x.broken = true;
        x.error = Some(format!("connection failed: {err}"));
        conn.close();
    }
    x
}

pub(super) fn panicked() -> Exec {
    Exec { ok: false, error: Some("the task running the unit failed".into()), status: b'I', broken: true, ..Default::default() }
}
