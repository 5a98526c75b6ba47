//! The recovery at start (`--recovery-log`) over the MariaDB pools: the protocol's part of
//! `middleware::recover` (its statements, one unit read back from the log and replayed with its
//! own position as when it first ran, its outcome checked against the others', the tables'
//! AUTO_INCREMENT counters compared with an up-to-date backend's after the replay).

use std::sync::Arc;

use super::cluster::Cluster;
use super::conn::MyConn;
use super::execute::{execute, Sink};
use super::outgoing::Outgoing;
use crate::middleware::mysql_wire as my;
use crate::middleware::recover::{self, Backends};
use crate::middleware::recovery;
use crate::middleware::NoBackend;

impl Cluster {
    /// With a recovery log, before anything is served (the manager's `recover` for MariaDB): each
    /// enabled backend's position (its `tierscope_recovery` table, made when missing: position 0);
    /// a backend behind the head gets the missing units replayed from the log on one connection,
    /// each with its position as when it first ran, then the head as its position; one the log
    /// cannot bring there is refused: disabled with one message naming it and the positions. With
    /// every backend at the head, the log is emptied.
    pub(super) async fn recover(&self) -> Result<(), NoBackend> {
        recover::recover(&self.m, self).await
    }
}

impl Backends for Cluster {
    type Conn = MyConn;
    const TABLE_OPTIONS: &'static str = " ENGINE=InnoDB";
    const COUNTERS: Option<(&'static str, &'static str)> = Some((
        "AUTO_INCREMENT counters",
        "values taken there and not on the others, or the reverse (rows inserted behind the middleware's back, a transaction it ran alone): the next INSERT would give a row another id there",
    ));

    async fn acquire(&self, i: usize) -> Result<MyConn, String> {
        self.pools[i].acquire().await.map_err(|e| e.0)
    }

    fn release(&self, i: usize, conn: MyConn) {
        Cluster::release(self, i, conn);
    }

    fn disable(&self, i: usize, reason: &str) {
        Cluster::disable(self, i, reason);
    }

    fn disable_unreachable(&self, i: usize, reason: &str) {
        Cluster::disable_unreachable(self, i, reason);
    }

    async fn query(conn: &mut MyConn, text: &str) -> Result<Vec<Option<String>>, String> {
        conn.simple(text).await
    }

    fn close(conn: &mut MyConn) {
        conn.close();
    }

    fn in_transaction(conn: &MyConn) -> bool {
        !my::idle(conn.status)
    }

    async fn replay(conn: &mut MyConn, seq: u64, rec: &[u8]) -> Result<bool, String> {
        let (out, ok) = replayed_unit(rec, seq).ok_or_else(|| format!("unit {seq}: not a MySQL-protocol record"))?;
        let mut sink = Sink::collect();
        let x = execute(conn, &out, &mut sink).await;
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
        Ok(!x.ok)
    }

    /// The tables' AUTO_INCREMENT counters: a replay gives its rows the others' values (`SET
    /// insert_id`), but values a transaction took on this backend alone are not given back, and
    /// the next INSERT would then give a row another id here than on the others.
    async fn counters(conn: &mut MyConn) -> Result<Vec<(String, String)>, String> {
        conn.simple(recovery::MY_AUTO_INCREMENTS).await.map(recovery::name_values)
    }
}

/// A unit read back from the recovery log, to replay as unit `seq`, and whether it succeeded.
pub(super) fn replayed_unit(rec: &[u8], seq: u64) -> Option<(Outgoing, bool)> {
    let recovery::MyRecord { ok, pre, post, command } = recovery::my_unrecord(rec)?;
    let (npre, npost) = (payloads(pre).count(), payloads(post).count());
    let (query, stmt, text) = match command[0] {
        my::COM_QUERY => (my::packet(0, command), None, String::from_utf8_lossy(&command[1..]).into_owned()),
        my::COM_STMT_EXECUTE => {
            let (sql, body) = recovery::my_execute_parts(command)?;
            (Vec::new(), Some((Arc::new(sql.to_vec()), body.to_vec())), String::from_utf8_lossy(sql).into_owned())
        }
        _ => return None,
    };
    let passed = std::iter::repeat_n(false, npre).chain([true]).chain(std::iter::repeat_n(false, npost)).collect();
    // a unit that carried the client's BEGIN in front of it (answered by the middleware) opens too
    let begun = payloads(pre).any(|p| p.first() == Some(&my::COM_QUERY) && recovery::my_opens_transaction(&String::from_utf8_lossy(&p[1..])));
    let opens = begun || recovery::my_opens_transaction(&text);
    Some((Outgoing { query, stmt, pre: pre.to_vec(), post: post.to_vec(), passed, seq: Some(seq), opens }, ok))
}

/// The payloads of the packets in `b` (a record's `pre` or `post` commands).
fn payloads(b: &[u8]) -> impl Iterator<Item = &[u8]> {
    let mut at = 0;
    std::iter::from_fn(move || {
        if at + 4 > b.len() {
            return None;
        }
        let n = my::header(b, at).0;
        let p = &b[at + 4..(at + 4 + n).min(b.len())];
        at += 4 + n;
        Some(p)
    })
}
