//! The recovery at start (`--recovery-log`), either protocol, before anything is served: each
//! enabled backend's position (its recovery table, made when missing: position 0); the head (the
//! log's last unit or the highest position); a backend behind the head gets the missing units
//! replayed from the log on one connection, then the head as its position, after its counters
//! are checked against an up-to-date backend's; one the log cannot bring there (the units are gone
//! from it, or the log is behind the backends) is refused: disabled with one message naming it and
//! the positions. Then `Manager::conclude_recovery`: with every backend at the head, the log is
//! emptied.
//!
//! What differs between the protocols is a `Backends`: the connections, a statement of the
//! middleware's own, one unit replayed, the counters compared (PostgreSQL: the sequences; MySQL:
//! the tables' AUTO_INCREMENT counters). The
//! PostgreSQL one is the manager's own pools (here); MySQL's is `mysql_session::Cluster`.

use serde_json::{json, Value};

use super::pool::Conn;
use super::{log, recovery, Manager, NoBackend};

/// The backends of one protocol, as the recovery at start uses them.
pub(crate) trait Backends {
    type Conn;
    /// what follows the recovery table's column in its CREATE TABLE
    const TABLE_OPTIONS: &'static str;
    /// the counters a replay must leave as they are on an up-to-date backend, as the refusal names
    /// them, and what their differing means (None: no counters are checked)
    const COUNTERS: Option<(&'static str, &'static str)>;

    async fn acquire(&self, i: usize) -> Result<Self::Conn, String>;
    fn release(&self, i: usize, conn: Self::Conn);
    fn disable(&self, i: usize, reason: &str);
    /// Disable backend `i` because it stopped answering (it may rejoin: `rejoin`).
    fn disable_unreachable(&self, i: usize, reason: &str);
    /// Run one statement of the middleware's own: the first column of its rows, or the error.
    async fn query(conn: &mut Self::Conn, text: &str) -> Result<Vec<Option<String>>, String>;
    /// Close the connection when it is given back (its session settings are the replay's).
    fn close(conn: &mut Self::Conn);
    /// The connection is inside a transaction.
    fn in_transaction(conn: &Self::Conn) -> bool;
    /// Replay unit `seq` of the log (its record `rec`) on `conn`: whether it answered with an
    /// error (as it did on the others).
    async fn replay(conn: &mut Self::Conn, seq: u64, rec: &[u8]) -> Result<bool, String>;
    /// The counters `COUNTERS` names, (name, state) in name order.
    async fn counters(conn: &mut Self::Conn) -> Result<Vec<(String, String)>, String>;
}

/// A backend's position: its recovery table's one row, the table made (at 0) when missing.
async fn position<B: Backends>(conn: &mut B::Conn) -> Result<u64, String> {
    let t = recovery::TABLE;
    B::query(conn, &format!("CREATE TABLE IF NOT EXISTS {t} (seq bigint NOT NULL){}", B::TABLE_OPTIONS)).await?;
    let rows = B::query(conn, &format!("SELECT seq FROM {t}")).await?;
    match rows.as_slice() {
        [] => {
            B::query(conn, &format!("INSERT INTO {t} VALUES (0)")).await?;
            Ok(0)
        }
        [Some(v)] if v.starts_with('-') => {
            Err(format!("{t}.seq is {v}: a replay from the recovery log left it different from the others; copy another backend's database to it"))
        }
        [Some(v)] => v.parse::<u64>().map_err(|e| format!("{t}.seq {v:?}: {e}")),
        _ => Err(format!("{t} holds {} rows, expected one", rows.len())),
    }
}

/// The recovery at start over `bs`, the backends of the manager `m` (nothing without a log).
pub(crate) async fn recover<B: Backends>(m: &Manager, bs: &B) -> Result<(), NoBackend> {
    let Some(rlog) = &m.recovery else { return Ok(()) };
    let n = m.backends.len();
    let mut pos: Vec<Option<u64>> = vec![None; n];
    for i in m.enabled() {
        let found: Result<u64, String> = async {
            let mut conn = bs.acquire(i).await?;
            let r = position::<B>(&mut conn).await;
            bs.release(i, conn);
            r
        }
        .await;
        match found {
            Ok(p) => pos[i] = Some(p),
            Err(e) => bs.disable(i, &format!("recovery: cannot read its position: {e}")),
        }
    }
    let range = rlog.range();
    let head = recovery::head(&pos, range);
    let path = rlog.path.display().to_string();
    let positions: Vec<String> =
        m.backends.iter().zip(&pos).map(|(b, p)| format!("{} at {}", b.name, p.map_or("?".to_string(), |p| p.to_string()))).collect();
    let mut replayed = serde_json::Map::new();
    // an up-to-date backend's counters, to check a replayed one against
    let reference = match (0..n).find(|&i| pos[i] == Some(head)) {
        Some(r) => counters_of(m, bs, r).await,
        None => None,
    };
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
                bs.disable(i, &msg); // (logged there, once)
                continue;
            }
        };
        let done = bring_to_head(m, bs, rlog, i, (from, to), head, reference.as_ref()).await;
        match done {
            Ok(k) => {
                replayed.insert(name.clone(), json!({"from": p, "units": k}));
            }
            Err(e) => {
                let msg = format!("stale backend {name} REFUSED: its position is {p}, the head is {head}; replaying from {path} failed: {e}");
                bs.disable(i, &msg);
            }
        }
    }
    m.conclude_recovery(rlog, head, range.is_some(), &pos, replayed, &positions)
}

/// Replay units `from..=to` of the log to backend `i` on one connection, check its counters
/// against an up-to-date backend's (`reference`: its name and counters), and record `head` as its
/// position; the number of units replayed, or why it cannot be brought to the head (its position
/// is then marked as refused when the counters differ).
async fn bring_to_head<B: Backends>(
    m: &Manager,
    bs: &B,
    rlog: &recovery::Log,
    i: usize,
    (from, to): (u64, u64),
    head: u64,
    reference: Option<&(String, Vec<(String, String)>)>,
) -> Result<usize, String> {
    let name = &m.backends[i].name;
    let path = rlog.path.display().to_string();
    let records = rlog.read(from, to).map_err(|e| format!("reading {path}: {e}"))?;
    let mut conn = bs.acquire(i).await?;
    let r = async {
        let mut errors = 0;
        for (seq, rec) in &records {
            errors += B::replay(&mut conn, *seq, rec).await? as usize;
        }
        if B::in_transaction(&conn) {
            B::query(&mut conn, "ROLLBACK").await?; // a transaction the middleware never saw end
        }
        // a transaction it was running when it went down may have taken counter values the
        // others did not (PostgreSQL's sequences are not transactional), and the replay then
        // gave rows other numbers or left the counters elsewhere: they must equal an
        // up-to-date backend's
        if let (Some((what, why)), Some((ref_name, ref_counters))) = (B::COUNTERS, reference) {
            let mine = B::counters(&mut conn).await?;
            if mine != *ref_counters {
                let diff = recovery::differences(&mine, ref_counters);
                B::query(&mut conn, &recovery::position_sql_refused()).await?;
                return Err(format!("after the replay its {what} differ from {ref_name}'s ({diff}): {why}"));
            }
        }
        B::query(&mut conn, &recovery::position_sql(head)).await?;
        Ok::<usize, String>(errors)
    }
    .await;
    B::close(&mut conn); // its session settings are the replay's
    bs.release(i, conn);
    r.map(|errors| {
        log(&format!(
            "backend {name} was behind: units {from}..{to} replayed from {path} ({errors} answered with an error, as they did on the others); now at {head}"
        ));
        records.len()
    })
}

/// An up-to-date backend's name and counters (None when the protocol has none or it cannot be read).
async fn counters_of<B: Backends>(m: &Manager, bs: &B, r: usize) -> Option<(String, Vec<(String, String)>)> {
    B::COUNTERS?;
    let mut conn = bs.acquire(r).await.ok()?;
    let counters = B::counters(&mut conn).await;
    bs.release(r, conn);
    Some((m.backends[r].name.clone(), counters.ok()?))
}

/// What an attempt to bring back a disabled backend while serving came to.
#[derive(Debug, PartialEq)]
pub(crate) enum Rejoin {
    /// it does not answer yet (or there is no log, or no backend to compare it with): later
    NotYet,
    /// replayed to the head (this many units) and serving again
    Rejoined(usize),
    /// the log cannot bring it to the head: it stays disabled for good (the reason is logged)
    Refused,
}

/// Bring back backend `i`, disabled because it stopped answering, while the middleware serves:
/// under the write lock (no write running, no transaction open), its position read, the units it
/// misses replayed from the log and its counters checked against an enabled backend's, then
/// enabled, so it serves no read before it is at the head. One the log cannot bring there is
/// disabled for good with one message naming it and the positions.
pub(crate) async fn rejoin<B: Backends>(m: &Manager, bs: &B, i: usize) -> Rejoin {
    let Some(rlog) = &m.recovery else { return Rejoin::NotYet };
    // a cheap check first: it answers at all (its pool opens a connection)
    match tokio::time::timeout(std::time::Duration::from_secs(2), bs.acquire(i)).await {
        Ok(Ok(conn)) => bs.release(i, conn),
        _ => return Rejoin::NotYet,
    }
    let _guard = m.write_lock.clone().lock_owned().await;
    // under the row scheduler the write lock only stops new transactions: the database is held too,
    // so no transaction is open and no unit runs (the lock table's request for it waits for them)
    let _database = match &m.scheduler {
        Some(s) => {
            let h = s.begin();
            if h.acquire(&crate::middleware::scope::Scope::Database).await.is_err() {
                return Rejoin::NotYet; // (it holds nothing else, so it is never a deadlock's victim)
            }
            Some(h)
        }
        None => None,
    };
    let Some(&r) = m.enabled().first() else { return Rejoin::NotYet };
    let name = m.backends[i].name.clone();
    let found: Result<(u64, u64), String> = async {
        let mut conn = bs.acquire(i).await?;
        let p = position::<B>(&mut conn).await;
        bs.release(i, conn);
        let mut conn = bs.acquire(r).await?;
        let q = position::<B>(&mut conn).await;
        bs.release(r, conn);
        Ok((p?, q?))
    }
    .await;
    let (p, q) = match found {
        Ok(pq) => pq,
        Err(_) => return Rejoin::NotYet, // gone again, or the reference is: later
    };
    let range = rlog.range();
    let head = recovery::head(&[Some(p), Some(q)], range);
    let path = rlog.path.display().to_string();
    let positions = format!("{name} at {p}, {} at {q}", m.backends[r].name);
    let units = match recovery::verdict(p, head, range, &path) {
        Ok(None) => Ok(0),
        Ok(Some(span)) => {
            let reference = counters_of(m, bs, r).await;
            bring_to_head(m, bs, rlog, i, span, head, reference.as_ref()).await
        }
        Err(why) => Err(format!("{why}: it cannot be brought to the head and is not used (copy another backend's database to it, then restart)")),
    };
    match units {
        Ok(k) => {
            m.enable(i, &format!("backend {name} REJOINED: {k} units replayed from {path}; now at {head} ({positions})"));
            Rejoin::Rejoined(k)
        }
        Err(e) => {
            // gone again half-way (each replayed unit moved its position with it): later
            let answers = match bs.acquire(i).await {
                Ok(mut conn) => {
                    let ok = B::query(&mut conn, "SELECT 1").await.is_ok();
                    bs.release(i, conn);
                    ok
                }
                Err(_) => false,
            };
            if !answers {
                return Rejoin::NotYet;
            }
            m.refuse(i, &format!("stale backend {name} REFUSED on its return: its position is {p}, the head is {head} ({positions}); {e}"));
            Rejoin::Refused
        }
    }
}

impl Manager {
    /// The end of a start-time recovery, either protocol: with every backend at the head the log's
    /// units are everywhere (a checkpoint); else the records after the head (applied nowhere) go
    /// and numbering goes on after it; the stats' `recovered`; an error when no backend is left.
    pub(crate) fn conclude_recovery(
        &self,
        rlog: &recovery::Log,
        head: u64,
        had_units: bool,
        pos: &[Option<u64>],
        replayed: serde_json::Map<String, Value>,
        positions: &[String],
    ) -> Result<(), NoBackend> {
        let path = rlog.path.display().to_string();
        let all_there = self.backends.iter().all(|b| b.enabled());
        let cut = if all_there { rlog.checkpoint(head) } else { rlog.cut_after(head) };
        if let Err(e) = cut {
            return Err(NoBackend(format!("recovery log {path}: {e}")));
        }
        if !all_there && had_units {
            self.log_rollback(); // a transaction cut by a crash ends here for any later replay
        }
        *self.recovered.lock().unwrap_or_else(|e| e.into_inner()) = json!({
            "log": path,
            "head_at_start": head,
            "positions_at_start": self.backends.iter().zip(pos).map(|(b, p)| (b.name.clone(), json!(p))).collect::<serde_json::Map<_, _>>(),
            "replayed": replayed,
        });
        if self.enabled().is_empty() {
            return Err(NoBackend(format!("no backend can be served: {}", positions.join(", "))));
        }
        Ok(())
    }
}

// --- PostgreSQL: the manager's own pools ---------------------------------------------------------

impl Backends for Manager {
    type Conn = Conn;
    const TABLE_OPTIONS: &'static str = "";
    const COUNTERS: Option<(&'static str, &'static str)> = Some(("sequences", "values taken by a transaction it was running when it went down"));

    async fn acquire(&self, i: usize) -> Result<Conn, String> {
        self.backends[i].pool.acquire().await.map_err(|e| e.0)
    }

    fn release(&self, i: usize, conn: Conn) {
        self.backends[i].pool.release(conn);
    }

    fn disable(&self, i: usize, reason: &str) {
        Manager::disable(self, i, reason);
    }

    fn disable_unreachable(&self, i: usize, reason: &str) {
        Manager::disable_unreachable(self, i, reason);
    }

    async fn query(conn: &mut Conn, text: &str) -> Result<Vec<Option<String>>, String> {
        recovery::simple_query(conn, text).await
    }

    fn close(conn: &mut Conn) {
        conn.close();
    }

    fn in_transaction(conn: &Conn) -> bool {
        conn.status != b'I'
    }

    async fn replay(conn: &mut Conn, seq: u64, rec: &[u8]) -> Result<bool, String> {
        recovery::replay_unit(conn, seq, rec).await
    }

    async fn counters(conn: &mut Conn) -> Result<Vec<(String, String)>, String> {
        recovery::sequences(conn).await
    }
}
