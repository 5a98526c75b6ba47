//! `--scheduler rows`: write transactions side by side when the rows they write differ (issue 25
//! item 3). The lock table (`rowlocks`), the table facts the scopes are resolved with (`scope`,
//! read from the first enabled backend's catalog), and the counts for --stats.
//!
//! The facts are read again after any statement that may change them (DDL, a setting: the
//! manager's `statement_epoch` moved), and only while holding the whole database, so no
//! transaction that changed the catalog is still open when they are read. Until then a unit of a
//! transaction already holding something takes the database.

use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};

use serde_json::{json, Value};

use super::rowlocks::{Holder, RowLocks};
use super::scope::{self, Facts, Scope};
use super::{recovery, Manager};

/// The row scheduler of one middleware.
pub struct Scheduler {
    pub locks: Arc<RowLocks>,
    /// the facts and the statement epoch they were read at
    facts: Mutex<Option<(u64, Arc<Facts>)>>,
    counts: Mutex<Counts>,
}

#[derive(Default, Clone, Copy)]
struct Counts {
    row_units: u64,
    shared_units: u64,
    database_units: u64,
    facts_read: u64,
    stale_scopes: u64,
}

impl Default for Scheduler {
    fn default() -> Self {
        Scheduler { locks: RowLocks::new(), facts: Mutex::new(None), counts: Mutex::new(Counts::default()) }
    }
}

impl Scheduler {
    /// The facts, if they are current.
    pub fn current_facts(&self, m: &Manager) -> Option<Arc<Facts>> {
        let epoch = m.statement_epoch.load(Ordering::Acquire);
        let f = self.facts.lock().unwrap_or_else(|e| e.into_inner());
        f.as_ref().filter(|(at, _)| *at == epoch).map(|(_, f)| f.clone())
    }

    /// The facts, read again if they are not current: under a hold on the whole database of a
    /// transaction of its own (None: no backend to read them from; facts that could not be read
    /// are empty, and not at READ COMMITTED: every write holds the database). The
    /// connection is taken before the hold, as every transaction takes its connections before its
    /// rows: no holder waits for a connection.
    pub async fn facts(&self, m: &Manager) -> Option<Arc<Facts>> {
        if let Some(f) = self.current_facts(m) {
            return Some(f);
        }
        let b = m.enabled().first().copied()?;
        let mut conn = m.backends[b].pool.acquire().await.ok()?;
        let holder = self.locks.begin();
        let answer = match holder.acquire(&Scope::Database).await {
            Err(_) => Err("a deadlock".to_string()), // (not possible: it held nothing)
            Ok(()) => match self.current_facts(m) {
                Some(f) => {
                    m.backends[b].pool.release(conn);
                    return Some(f); // read by another session meanwhile
                }
                None => recovery::simple_query(&mut conn, scope::FACTS_SQL).await,
            },
        };
        let epoch = m.statement_epoch.load(Ordering::Acquire);
        m.backends[b].pool.release(conn);
        drop(holder);
        // facts that cannot be read are kept as none (every write holds the database) until the
        // catalog may have changed: not read again for every unit
        let facts = match answer.as_deref() {
            Ok([Some(json)]) => scope::parse_facts(json),
            Ok(_) => None,
            Err(e) => {
                super::log(&format!("the row scheduler could not read the table facts (every write holds the database): {e}"));
                None
            }
        };
        let facts = Arc::new(facts.unwrap_or_default());
        self.counts.lock().unwrap_or_else(|e| e.into_inner()).facts_read += 1;
        *self.facts.lock().unwrap_or_else(|e| e.into_inner()) = Some((epoch, facts.clone()));
        Some(facts)
    }

    /// Count a unit's scope.
    pub fn count(&self, s: &Scope) {
        let mut c = self.counts.lock().unwrap_or_else(|e| e.into_inner());
        match s {
            Scope::Rows(_) => c.row_units += 1,
            Scope::Shared => c.shared_units += 1,
            Scope::Database => c.database_units += 1,
        }
    }

    /// A unit whose scope was worked out from facts that went stale before it was granted (it
    /// takes the database too).
    pub fn count_stale(&self) {
        self.counts.lock().unwrap_or_else(|e| e.into_inner()).stale_scopes += 1;
    }

    pub fn begin(&self) -> Holder {
        self.locks.begin()
    }
}

/// The scheduler's part of --stats (zeros under the one write lock).
pub fn stats(s: Option<&Scheduler>) -> Value {
    let c = s.map(|s| *s.counts.lock().unwrap_or_else(|e| e.into_inner())).unwrap_or_default();
    let l = s.map(|s| s.locks.counts()).unwrap_or_default();
    json!({
        "name": if s.is_some() { "rows" } else { "lock" },
        "row_units": c.row_units,
        "shared_units": c.shared_units,
        "database_units": c.database_units,
        "granted_at_once": l.granted_at_once,
        "waits": l.waits,
        "deadlocks": l.deadlocks,
        "facts_read": c.facts_read,
        "stale_scopes": c.stale_scopes,
    })
}
