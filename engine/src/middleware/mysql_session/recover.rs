//! The recovery at start (`--recovery-log`): each backend's position read, a stale backend
//! brought to the head by replaying the log's units to it, each with its own position as when it
//! first ran, or refused.

use std::sync::Arc;

use serde_json::json;

use super::cluster::Cluster;
use super::execute::{execute, Sink};
use super::outgoing::Outgoing;
use crate::middleware::mysql_wire as my;
use crate::middleware::recovery;
use crate::middleware::{log, NoBackend};

impl Cluster {
    /// With a recovery log, before anything is served (the manager's `recover` for MariaDB): each
    /// enabled backend's position (its `tierscope_recovery` table, made when missing: position 0);
    /// a backend behind the head gets the missing units replayed from the log on one connection,
    /// each with its position as when it first ran, then the head as its position; one the log
    /// cannot bring there is refused: disabled with one message naming it and the positions. With
    /// every backend at the head, the log is emptied.
    pub(super) async fn recover(&self) -> Result<(), NoBackend> {
        let m = &self.m;
        let Some(rlog) = &m.recovery else { return Ok(()) };
        let n = self.pools.len();
        let mut pos: Vec<Option<u64>> = vec![None; n];
        let t = recovery::TABLE;
        for i in m.enabled() {
            let found: Result<u64, String> = async {
                let mut conn = self.pools[i].acquire().await.map_err(|e| e.0)?;
                let r = async {
                    conn.simple(&format!("CREATE TABLE IF NOT EXISTS {t} (seq bigint NOT NULL) ENGINE=InnoDB")).await?;
                    let rows = conn.simple(&format!("SELECT seq FROM {t}")).await?;
                    match rows.as_slice() {
                        [] => {
                            conn.simple(&format!("INSERT INTO {t} VALUES (0)")).await?;
                            Ok(0)
                        }
                        [Some(v)] if v.starts_with('-') => Err(format!(
                            "{t}.seq is {v}: a replay from the recovery log left it different from the others; copy another backend's database to it"
                        )),
                        [Some(v)] => v.parse::<u64>().map_err(|e| format!("{t}.seq {v:?}: {e}")),
                        _ => Err(format!("{t} holds {} rows, expected one", rows.len())),
                    }
                }
                .await;
                self.pools[i].release(conn);
                r
            }
            .await;
            match found {
                Ok(p) => pos[i] = Some(p),
                Err(e) => self.disable(i, &format!("recovery: cannot read its position: {e}")),
            }
        }
        let range = rlog.range();
        let head = recovery::head(&pos, range);
        let path = rlog.path.display().to_string();
        let positions: Vec<String> =
            m.backends.iter().zip(&pos).map(|(b, p)| format!("{} at {}", b.name, p.map_or("?".to_string(), |p| p.to_string()))).collect();
        let mut replayed = serde_json::Map::new();
        for (i, &p) in pos.iter().enumerate() {
            let Some(p) = p else { continue };
            let name = &m.backends[i].name;
            let (from, to) = match recovery::verdict(p, head, range, &path) {
                Ok(None) => continue,
                Ok(Some(r)) => r,
                Err(why) => {
                    let msg = format!(
                        "stale backend {name} REFUSED: its position is {p}, the head is {head} ({}); {why}: it cannot be brought to the head and is not used (copy another backend's database to it, then restart)",
                        positions.join(", ")
                    );
                    self.disable(i, &msg); // (logged there, once)
                    continue;
                }
            };
            let done: Result<usize, String> = async {
                let records = rlog.read(from, to).map_err(|e| format!("reading {path}: {e}"))?;
                let mut conn = self.pools[i].acquire().await.map_err(|e| e.0)?;
                let r = async {
                    let mut errors = 0;
                    for (seq, rec) in &records {
                        let (out, ok) = replayed_unit(rec, *seq).ok_or_else(|| format!("unit {seq}: not a MySQL-protocol record"))?;
                        let mut sink = Sink { held: Vec::new(), client: None, saw: false, client_failed: false };
                        let x = execute(&mut conn, &out, &mut sink).await;
                        if x.broken {
                            return Err(format!("unit {seq}: {}", x.error.unwrap_or_default()));
                        }
                        if x.ok != ok {
                            // its position did not move with it: the others' outcome is not this one's
                            return Err(match x.error {
                                Some(e) => format!("unit {seq} failed here ({e}) where it succeeded on the others"),
                                None => format!("unit {seq} succeeded here where it failed on the others"),
                            });
                        }
                        errors += !x.ok as usize;
                    }
                    if !my::idle(conn.status) {
                        conn.simple("ROLLBACK").await?; // a transaction the middleware never saw end
                    }
                    conn.simple(&recovery::position_sql(head)).await?;
                    Ok::<usize, String>(errors)
                }
                .await;
                conn.close(); // its session settings are the replay's
                self.pools[i].release(conn);
                r.map(|errors| {
                    log(&format!(
                        "backend {name} was behind: units {from}..{to} replayed from {path} ({errors} answered with an error, as they did on the others); now at {head}"
                    ));
                    records.len()
                })
            }
            .await;
            match done {
                Ok(k) => {
                    replayed.insert(name.clone(), json!({"from": p, "units": k}));
                }
                Err(e) => {
                    let msg = format!("stale backend {name} REFUSED: its position is {p}, the head is {head}; replaying from {path} failed: {e}");
                    self.disable(i, &msg);
                }
            }
        }
        m.conclude_recovery(rlog, head, range.is_some(), &pos, replayed, &positions)
    }
}

/// A unit read back from the recovery log, to replay as unit `seq`, and whether it succeeded.
pub(super) fn replayed_unit(rec: &[u8], seq: u64) -> Option<(Outgoing, bool)> {
    let recovery::MyRecord { ok, pre, post, command } = recovery::my_unrecord(rec)?;
    let count = |b: &[u8]| {
        let mut n = 0;
        let mut at = 0;
        while at + 4 <= b.len() {
            at += 4 + my::header(b, at).0;
            n += 1;
        }
        n
    };
    let (npre, npost) = (count(pre), count(post));
    let (query, stmt, text) = match command[0] {
        my::COM_QUERY => (my::packet(0, command), None, String::from_utf8_lossy(&command[1..]).into_owned()),
        my::COM_STMT_EXECUTE => {
            let (sql, body) = recovery::my_execute_parts(command)?;
            (Vec::new(), Some((Arc::new(sql.to_vec()), body.to_vec())), String::from_utf8_lossy(sql).into_owned())
        }
        _ => return None,
    };
    let passed = std::iter::repeat_n(false, npre).chain([true]).chain(std::iter::repeat_n(false, npost)).collect();
    let opens = recovery::my_opens_transaction(&text);
    Some((Outgoing { query, stmt, pre: pre.to_vec(), post: post.to_vec(), passed, seq: Some(seq), opens }, ok))
}
