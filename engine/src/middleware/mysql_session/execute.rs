//! One unit on one backend connection: the statement prepared first where it is not yet, the
//! recovery position recorded with the unit (an UPDATE before it inside a transaction, else the
//! unit in the middleware's own BEGIN, then UPDATE + COMMIT or ROLLBACK), the answers followed and
//! those the client sees kept in a sink (a read's written to the client as they come).

use tokio::io::AsyncWriteExt;

use super::conn::MyConn;
use super::outgoing::Outgoing;
use crate::middleware::answer;
use crate::middleware::mysql_wire as my;
use crate::middleware::recovery;

/// What one backend answered to a unit: its status is the server's status flags.
pub(super) type Exec = answer::Exec<u16>;
pub(super) use crate::middleware::answer::Sink;

/// Send a unit's commands on one connection and follow their answers; the bytes the client must
/// see go to `sink` as they come.
pub(super) async fn execute(conn: &mut MyConn, out: &Outgoing, sink: &mut Sink<'_>) -> Exec {
    let result: Result<Exec, String> = async {
        let mut x = Exec { ok: true, ..Default::default() };
        let exec_packet;
        let query = match &out.stmt {
            Some((sql, body)) => {
                let sid = match conn.stmts.get(sql.as_slice()) {
                    Some(&sid) => sid,
                    None => {
                        // first time on this connection: prepare it here (one more round trip)
                        let p = conn.prepare(sql).await.map_err(|e| e.0)?;
                        match p.sid {
                            Some(sid) => sid,
                            None => {
                                x.ok = false;
                                x.error = p.error;
                                x.status = conn.status;
                                if let Some((_, err)) = p.packets.first() {
                                    my::packet_into(&mut sink.held, 1, err);
                                }
                                return Ok(x);
                            }
                        }
                    }
                };
                let mut cmd = Vec::with_capacity(body.len() + 5);
                cmd.push(my::COM_STMT_EXECUTE);
                cmd.extend_from_slice(&sid.to_le_bytes());
                cmd.extend_from_slice(body);
                exec_packet = my::packet(0, &cmd);
                &exec_packet
            }
            None => &out.query,
        };
        // the recovery log: the unit's position recorded with it. Inside a transaction (or with
        // autocommit off): the UPDATE first, committed or rolled back with the unit. Else the unit
        // runs in the middleware's own BEGIN, then UPDATE + COMMIT when it succeeded, ROLLBACK when
        // it failed (a unit opening a transaction itself: the UPDATE after it, inside it)
        let mut lead: Option<Vec<u8>> = None;
        let mut tail: Option<(u64, bool)> = None;
        if let Some(seq) = out.seq {
            if !my::idle(conn.status) {
                lead = Some(position_packet(seq));
            } else if out.opens {
                tail = Some((seq, false));
            } else {
                lead = Some(my::packet(0, b"\x03BEGIN"));
                tail = Some((seq, true));
            }
        }
        if out.pre.is_empty() && out.post.is_empty() && lead.is_none() {
            conn.stream.write_all(query).await.map_err(|e| e.to_string())?;
        } else {
            let data = [lead.as_deref().unwrap_or(&[]), out.pre.as_slice(), query, out.post.as_slice()].concat();
            conn.stream.write_all(&data).await.map_err(|e| e.to_string())?;
        }
        let passed_list: Vec<bool> = lead.iter().map(|_| false).chain(out.passed.iter().copied()).collect();
        for &passed in &passed_list {
            let mut r = my::Response::default();
            let mut run: Option<usize> = None; // where the bytes not yet passed on begin
            while !r.done {
                let avail = conn.buf.len() - conn.pos;
                if avail >= 4 {
                    let (n, _) = my::header(&conn.buf, conn.pos);
                    if avail >= 4 + n {
                        let p = conn.pos;
                        let first = if n > 0 { Some(conn.buf[p + 4]) } else { None };
                        r.feed(first, n, &conn.buf[p + 4..p + 4 + n]).map_err(|e| e.to_string())?;
                        if passed && run.is_none() {
                            run = Some(p);
                        }
                        conn.pos = p + 4 + n;
                        continue;
                    }
                }
                if let Some(s) = run.take() {
                    sink.held.extend_from_slice(&conn.buf[s..conn.pos]);
                    sink.maybe_flush().await;
                }
                conn.more().await.map_err(|e| e.to_string())?;
            }
            if let Some(s) = run.take() {
                sink.held.extend_from_slice(&conn.buf[s..conn.pos]);
            }
            if let Some(st) = r.status {
                conn.status = st;
            }
            if passed {
                x.ok = x.ok && r.ok;
                if x.error.is_none() {
                    x.error = r.error;
                }
                x.tags.append(&mut r.tags);
            } else if !r.ok {
                // the proxy's own command failed: the unit cannot be trusted
                return Err(format!("the middleware's own command failed: {}", r.error.unwrap_or_default()));
            }
        }
        if let Some((seq, wrapped)) = tail {
            let mut cmds: Vec<Vec<u8>> = Vec::new();
            if x.ok {
                cmds.push(position_packet(seq));
                if wrapped {
                    cmds.push(my::packet(0, b"\x03COMMIT"));
                }
            } else if wrapped {
                cmds.push(my::packet(0, b"\x03ROLLBACK"));
            }
            hidden(conn, &cmds).await?;
            if wrapped {
                clear_in_trans(&mut sink.held); // the client's OK was sent inside the middleware's BEGIN
            }
        }
        x.status = conn.status;
        Ok(x)
    }
    .await;
    match result {
        Ok(x) => x,
        Err(err) => {
            conn.close();
            Exec { ok: false, error: Some(format!("connection failed: {err}")), status: conn.status, broken: true, tags: Vec::new() }
        }
    }
}

/// The command recording position `seq` in a backend's recovery table.
pub(super) fn position_packet(seq: u64) -> Vec<u8> {
    let mut cmd = vec![my::COM_QUERY];
    cmd.extend_from_slice(recovery::position_sql(seq).as_bytes());
    my::packet(0, &cmd)
}

/// Send the middleware's own commands (packets) on a connection and read their answers (dropped;
/// one that fails fails the unit).
pub(super) async fn hidden(conn: &mut MyConn, cmds: &[Vec<u8>]) -> Result<(), String> {
    if cmds.is_empty() {
        return Ok(());
    }
    conn.stream.write_all(&cmds.concat()).await.map_err(|e| e.to_string())?;
    for _ in cmds {
        let mut r = my::Response::default();
        while !r.done {
            let (_, p) = conn.read_packet().await.map_err(|e| e.0)?;
            r.feed(p.first().copied(), p.len(), &p).map_err(|e| e.to_string())?;
        }
        if let Some(st) = r.status {
            conn.status = st;
        }
        if !r.ok {
            return Err(format!("the middleware's own command failed: {}", r.error.unwrap_or_default()));
        }
    }
    Ok(())
}

/// Clear SERVER_STATUS_IN_TRANS in an answer that is one OK packet.
pub(super) fn clear_in_trans(held: &mut [u8]) {
    if held.len() < 4 + 7 || held[4] != 0 || my::header(held, 0).0 + 4 != held.len() {
        return;
    }
    let Ok((_, at)) = my::lenenc_int(held, 5) else { return };
    let Ok((_, at)) = my::lenenc_int(held, at) else { return };
    if let Some(b) = held.get_mut(at) {
        *b &= !(my::STATUS_IN_TRANS as u8);
    }
}
