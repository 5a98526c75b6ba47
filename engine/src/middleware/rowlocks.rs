//! The row scheduler's locks (`--scheduler rows`): what each open transaction holds (a shared
//! hold on the database and the rows it wrote, or the whole database), who waits for what, and
//! the deadlocks among the waits broken by aborting one waiter.
//!
//! A transaction (`Holder`) asks for a unit's `Scope` before the unit runs and keeps everything it
//! got until it ends (the holder dropped once every backend ran its last unit): with every
//! conflicting pair of units ordered the same way on every replica, and a row's next writer
//! starting only after its previous writer committed everywhere, the replicas stay identical.
//!
//! - Rows are exclusive. A request for rows also takes a shared hold on the database.
//! - The database (a unit this scheduler cannot scope) is exclusive against every other holder.
//!   A transaction that holds rows and then needs the database waits for every other holder.
//! - A request is granted whole or not at all, waiters in the order they came. A transaction that
//!   holds nothing yet waits behind an earlier request for the database (so that one is not
//!   starved by a stream of new transactions).
//! - A wait that closes a cycle of waits (after any change) fails the cycle's latest waiter with
//!   `Deadlock`, as PostgreSQL's own detector does (40P01); its transaction keeps what it holds
//!   until it ends.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};

use tokio::sync::oneshot;

use super::scope::{RowKey, Scope};

/// The answer to a wait the scheduler failed, to break a cycle of waits (the client gets 40P01).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Deadlock;

#[derive(Clone, Debug, PartialEq, Eq)]
enum Want {
    Rows(Vec<RowKey>),
    Database,
}

struct Waiter {
    txn: u64,
    want: Want,
    tx: oneshot::Sender<Result<(), Deadlock>>,
}

#[derive(Default)]
struct Table {
    next_txn: u64,
    /// transactions holding the database shared (every one holding rows)
    shared: HashSet<u64>,
    exclusive: Option<u64>,
    rows: HashMap<RowKey, u64>,
    held: HashMap<u64, Vec<RowKey>>,
    /// in the order they came
    waiting: Vec<Waiter>,
    /// counts: requests granted at once, waits, deadlocks broken
    granted: u64,
    waits: u64,
    deadlocks: u64,
}

impl Table {
    fn holds_anything(&self, txn: u64) -> bool {
        self.shared.contains(&txn) || self.exclusive == Some(txn)
    }

    /// The transactions `txn`'s request waits for now (empty: it may be granted); `earlier`: the
    /// requests that came before it and still wait.
    fn blockers(&self, txn: u64, want: &Want, earlier: &[Waiter]) -> HashSet<u64> {
        let mut out = HashSet::new();
        if let Some(x) = self.exclusive.filter(|&x| x != txn) {
            out.insert(x);
        }
        match want {
            Want::Database => out.extend(self.shared.iter().copied().filter(|&t| t != txn)),
            Want::Rows(keys) => {
                out.extend(keys.iter().filter_map(|k| self.rows.get(k)).copied().filter(|&t| t != txn));
                if !self.holds_anything(txn) {
                    out.extend(earlier.iter().filter(|w| w.want == Want::Database && w.txn != txn).map(|w| w.txn));
                }
            }
        }
        out
    }

    fn grant(&mut self, txn: u64, want: &Want) {
        match want {
            Want::Database => self.exclusive = Some(txn),
            Want::Rows(keys) => {
                self.shared.insert(txn);
                let held = self.held.entry(txn).or_default();
                for k in keys {
                    if self.rows.insert(k.clone(), txn).is_none() {
                        held.push(k.clone());
                    }
                }
            }
        }
    }

    /// Grant what can be granted, in order, then break the cycles of waits (a transaction has one
    /// request at a time, so only a new wait can close a cycle; checking after every change costs
    /// little and needs no proof).
    fn pump(&mut self) {
        loop {
            let found = (0..self.waiting.len()).find(|&i| {
                let w = &self.waiting[i];
                self.blockers(w.txn, &w.want, &self.waiting[..i]).is_empty()
            });
            let Some(i) = found else { break };
            let w = self.waiting.remove(i);
            self.grant(w.txn, &w.want);
            let _ = w.tx.send(Ok(()));
        }
        while let Some(victim) = self.cycle_victim() {
            let w = self.waiting.remove(victim);
            self.deadlocks += 1;
            let _ = w.tx.send(Err(Deadlock));
        }
    }

    /// The latest waiter on a cycle of waits, if there is one.
    fn cycle_victim(&self) -> Option<usize> {
        let index: HashMap<u64, usize> = self.waiting.iter().enumerate().map(|(i, w)| (w.txn, i)).collect();
        let edges: Vec<Vec<usize>> = self
            .waiting
            .iter()
            .enumerate()
            .map(|(i, w)| self.blockers(w.txn, &w.want, &self.waiting[..i]).iter().filter_map(|t| index.get(t).copied()).collect())
            .collect();
        // depth-first search for a back edge; the cycle is the path from its target
        let n = edges.len();
        let mut state = vec![0u8; n]; // 0 new, 1 on the path, 2 done
        for start in 0..n {
            if state[start] != 0 {
                continue;
            }
            let mut path = vec![start];
            let mut next = vec![0usize];
            state[start] = 1;
            while let Some(&v) = path.last() {
                let k = next.last_mut().expect("one per node on the path");
                if let Some(&u) = edges[v].get(*k) {
                    *k += 1;
                    if state[u] == 1 {
                        let from = path.iter().position(|&p| p == u).expect("on the path");
                        return path[from..].iter().copied().max();
                    }
                    if state[u] == 0 {
                        state[u] = 1;
                        path.push(u);
                        next.push(0);
                    }
                } else {
                    state[v] = 2;
                    path.pop();
                    next.pop();
                }
            }
        }
        None
    }

    fn release(&mut self, txn: u64) {
        self.shared.remove(&txn);
        if self.exclusive == Some(txn) {
            self.exclusive = None;
        }
        for k in self.held.remove(&txn).unwrap_or_default() {
            self.rows.remove(&k);
        }
        self.waiting.retain(|w| w.txn != txn);
        self.pump();
    }
}

/// The scheduler's lock table.
#[derive(Default)]
pub struct RowLocks {
    table: Mutex<Table>,
}

/// What the scheduler did so far (for --stats).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LockCounts {
    pub granted_at_once: u64,
    pub waits: u64,
    pub deadlocks: u64,
}

impl RowLocks {
    pub fn new() -> Arc<RowLocks> {
        Arc::new(RowLocks::default())
    }

    /// A new transaction, holding nothing.
    pub fn begin(self: &Arc<Self>) -> Holder {
        let mut t = self.table.lock().expect("the lock table");
        t.next_txn += 1;
        Holder { locks: self.clone(), txn: t.next_txn }
    }

    pub fn counts(&self) -> LockCounts {
        let t = self.table.lock().expect("the lock table");
        LockCounts { granted_at_once: t.granted, waits: t.waits, deadlocks: t.deadlocks }
    }
}

/// An open transaction's place in the lock table: everything it got is released when it is
/// dropped.
pub struct Holder {
    locks: Arc<RowLocks>,
    txn: u64,
}

impl Holder {
    /// Hold `scope` too (Shared: the database shared, so a unit that takes the database waits for
    /// this transaction); Err when this wait was chosen to break a deadlock. The request takes its
    /// place in the table when called; the future waits for the grant.
    pub fn acquire(&self, scope: &Scope) -> impl std::future::Future<Output = Result<(), Deadlock>> + Send + 'static {
        let want = match scope {
            Scope::Shared => Want::Rows(Vec::new()),
            Scope::Rows(keys) => Want::Rows(keys.clone()),
            Scope::Database => Want::Database,
        };
        let rx = {
            let mut t = self.locks.table.lock().expect("the lock table");
            if t.blockers(self.txn, &want, &t.waiting).is_empty() {
                t.grant(self.txn, &want);
                t.granted += 1;
                None
            } else {
                let (tx, rx) = oneshot::channel();
                t.waiting.push(Waiter { txn: self.txn, want, tx });
                t.waits += 1;
                t.pump();
                Some(rx)
            }
        };
        async move {
            match rx {
                None => Ok(()),
                Some(rx) => rx.await.unwrap_or(Err(Deadlock)),
            }
        }
    }

    /// Whether it holds the whole database.
    pub fn holds_database(&self) -> bool {
        self.locks.table.lock().expect("the lock table").exclusive == Some(self.txn)
    }
}

impl Drop for Holder {
    fn drop(&mut self) {
        if let Ok(mut t) = self.locks.table.lock() {
            t.release(self.txn);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn rows(keys: &[&str]) -> Scope {
        Scope::Rows(keys.iter().map(|k| ("t".to_string(), k.to_string())).collect())
    }

    /// Whether `fut` is still waiting after a few turns of the runtime.
    async fn pending<F: std::future::Future + Unpin>(fut: &mut F) -> bool {
        tokio::time::timeout(Duration::from_millis(20), fut).await.is_err()
    }

    #[tokio::test]
    async fn different_rows_run_side_by_side_and_the_same_row_waits_for_its_holder() {
        let locks = RowLocks::new();
        let (a, b, c) = (locks.begin(), locks.begin(), locks.begin());
        a.acquire(&rows(&["1"])).await.unwrap();
        b.acquire(&rows(&["2"])).await.unwrap();
        let mut wait = Box::pin(c.acquire(&rows(&["1", "3"])));
        assert!(pending(&mut wait).await, "row 1 is a's");
        // a row already held is granted again at once
        a.acquire(&rows(&["1"])).await.unwrap();
        drop(a);
        assert_eq!(wait.await, Ok(()));
        assert_eq!(locks.counts(), LockCounts { granted_at_once: 3, waits: 1, deadlocks: 0 });
    }

    #[tokio::test]
    async fn the_database_waits_for_every_holder_and_new_transactions_wait_behind_it() {
        let locks = RowLocks::new();
        let (a, ddl, late) = (locks.begin(), locks.begin(), locks.begin());
        a.acquire(&Scope::Shared).await.unwrap();
        let mut whole = Box::pin(ddl.acquire(&Scope::Database));
        assert!(pending(&mut whole).await, "a holds the database shared");
        let mut after = Box::pin(late.acquire(&rows(&["9"])));
        assert!(pending(&mut after).await, "a new transaction waits behind the earlier request for the database");
        // a transaction already holding something goes on (it must reach its end)
        a.acquire(&rows(&["5"])).await.unwrap();
        drop(a);
        assert_eq!(whole.await, Ok(()));
        assert!(ddl.holds_database());
        assert!(pending(&mut after).await, "the database is ddl's");
        drop(ddl);
        assert_eq!(after.await, Ok(()));
    }

    #[tokio::test]
    async fn a_cycle_of_waits_fails_its_latest_waiter() {
        let locks = RowLocks::new();
        let (a, b) = (locks.begin(), locks.begin());
        a.acquire(&rows(&["1"])).await.unwrap();
        b.acquire(&rows(&["2"])).await.unwrap();
        let mut a_wait = Box::pin(a.acquire(&rows(&["2"])));
        assert!(pending(&mut a_wait).await);
        // b's wait closes the cycle: b is the victim, a keeps waiting for b's end
        assert_eq!(b.acquire(&rows(&["1"])).await, Err(Deadlock));
        assert!(pending(&mut a_wait).await, "b still holds row 2 until it ends");
        drop(b);
        assert_eq!(a_wait.await, Ok(()));
        assert_eq!(locks.counts().deadlocks, 1);
    }

    #[tokio::test]
    async fn two_transactions_wanting_the_whole_database_while_holding_rows_deadlock() {
        let locks = RowLocks::new();
        let (a, b) = (locks.begin(), locks.begin());
        a.acquire(&rows(&["1"])).await.unwrap();
        b.acquire(&rows(&["2"])).await.unwrap();
        let mut a_up = Box::pin(a.acquire(&Scope::Database));
        assert!(pending(&mut a_up).await);
        assert_eq!(b.acquire(&Scope::Database).await, Err(Deadlock));
        drop(b);
        assert_eq!(a_up.await, Ok(()));
        assert!(a.holds_database());
    }

    #[tokio::test]
    async fn a_row_taken_while_another_waits_for_it_among_others_counts_in_the_cycle() {
        // w waits for rows 1 (held by h) and 2 (free): granted whole or not at all, so x takes 2;
        // x then waits for w's row 3: w waits for x and x for w, although h still holds row 1
        let locks = RowLocks::new();
        let (h, w, x) = (locks.begin(), locks.begin(), locks.begin());
        h.acquire(&rows(&["1"])).await.unwrap();
        w.acquire(&rows(&["3"])).await.unwrap();
        let mut w_wait = Box::pin(w.acquire(&rows(&["1", "2"])));
        assert!(pending(&mut w_wait).await);
        x.acquire(&rows(&["2"])).await.unwrap();
        assert_eq!(x.acquire(&rows(&["3"])).await, Err(Deadlock), "x's wait closes the cycle");
        drop(x);
        assert!(pending(&mut w_wait).await, "row 1 is still h's");
        drop(h);
        assert_eq!(w_wait.await, Ok(()));
    }

    #[tokio::test]
    async fn a_dropped_transaction_releases_its_rows_and_its_wait() {
        let locks = RowLocks::new();
        let (a, b, c) = (locks.begin(), locks.begin(), locks.begin());
        a.acquire(&rows(&["1"])).await.unwrap();
        {
            let mut gone = Box::pin(b.acquire(&Scope::Database));
            assert!(pending(&mut gone).await);
        }
        drop(b); // its waiting request goes with it
        c.acquire(&rows(&["2"])).await.unwrap();
        drop(a);
        let d = locks.begin();
        d.acquire(&rows(&["1"])).await.unwrap();
    }
}
