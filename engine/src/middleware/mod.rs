//! `tierscope-engine middleware`: the RAIDb-1 clustering middleware (C-JDBC-like) on tokio, the lab's
//! only middleware (a port of the Python one, `python -m tierscope.middleware`, removed in issue 25,
//! with its flags, rules and stats).
//!
//! Reads (SELECT without FOR UPDATE/SHARE, SHOW, VALUES, TABLE) go to one enabled backend by the
//! read policy; every other statement is broadcast to all enabled backends under one database-wide
//! write lock, held by an autocommit write until every backend has executed it and by an explicit
//! transaction until it ends (`--scheduler rows`: `scheduler`, transactions whose rows differ side
//! by side). A backend that fails a write another backend executed is disabled
//! and never used again in this process. The counts go to `--stats` (JSON) on SIGTERM/SIGINT.
//!
//! Authentication: the middleware logs in to the backends as `--user` with the password in
//! $TIERSCOPE_MIDDLEWARE_PASSWORD (scram-sha-256), and asks its clients for the same user and
//! password (scram-sha-256); without a password it does not start.
//!
//! `--protocol mysql`: MariaDB backends and MySQL-protocol clients (`mysql_session`, the same
//! routing on this manager; mysql_native_password on both sides).

mod answer;
pub mod balance;
mod client_io;
#[cfg(test)]
mod contract;
pub mod error;
pub mod mysql_session;
pub mod mysql_wire;
pub mod pool;
pub mod recover;
pub mod recovery;
pub mod replies;
pub mod rowlocks;
pub mod scheduler;
pub mod scope;
pub mod scram;
mod serve;
pub mod session;
pub mod sql;
pub mod wire;

use std::collections::{HashMap, HashSet, VecDeque};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use clap::Args;
use serde_json::{json, Value};
use tokio::sync::watch;

use balance::Policy;
use error::ArgError;
use pool::Pool;

const EPILOG: &str = "\
Reads (SELECT without FOR UPDATE/SHARE, SHOW, VALUES, TABLE) go to one backend; every other
statement is broadcast to all enabled backends under one database-wide write lock (--scheduler rows:
write transactions whose rows differ run side by side, UPDATE/DELETE by primary key and INSERT into
a table without a key; any other write holds the whole database). A backend that fails a write
another backend executed is disabled. Counts go to --stats on exit (JSON: reads,
writes, per backend, labels, the 50 ms series). `--policy aware` sends each read to the replica
with the least expected wait (the expected remaining service of what it runs, by the statements'
moving-average service times: away from replicas busy with heavy queries); `--labels` keeps those
per-statement times under any policy.

The password (the backends', and what clients must log in with, scram-sha-256) is read from
$TIERSCOPE_MIDDLEWARE_PASSWORD, never from the command line.

--protocol mysql: MariaDB backends and MySQL-protocol clients (mysql_native_password on both
sides, the same user and password). Served: COM_QUERY, COM_STMT_PREPARE/EXECUTE/CLOSE/RESET,
COM_PING, COM_INIT_DB (the served database), COM_RESET_CONNECTION, COM_SET_OPTION, COM_QUIT;
transactions followed by the backends' status flags; a write calling NOW() and the other time
functions runs between SET timestamp = <one instant> and SET timestamp = DEFAULT on every
backend. Cursors (COM_STMT_FETCH) and COM_STMT_SEND_LONG_DATA are answered with ERR 1235.
--recovery-log works with both protocols (a stale MariaDB backend is replayed, or refused when its
AUTO_INCREMENT counters then differ from an up-to-date one's).

Example: tierscope-engine middleware --listen 127.0.0.1:25322 --backend 127.0.0.1:5433 \\
    --backend 127.0.0.1:5434 --db rubbos --user tierscope --pool 16 --policy lprf --stats mw.json";

#[derive(Args, Debug, Clone)]
#[command(after_help = EPILOG)]
pub struct MiddlewareArgs {
    /// Address and port clients connect to (ADDR:PORT).
    #[arg(long, value_name = "ADDR:PORT")]
    pub listen: String,
    /// A database server: PostgreSQL, or MariaDB with --protocol mysql (repeat; the order is the
    /// LPRF order).
    #[arg(long, value_name = "HOST:PORT", required = true)]
    pub backend: Vec<String>,
    /// The wire protocol on both sides: postgres (PostgreSQL backends) or mysql (MariaDB backends,
    /// mysql_native_password).
    #[arg(long, default_value = "postgres", value_parser = ["postgres", "mysql"])]
    pub protocol: String,
    /// The database served.
    #[arg(long, default_value = "rubbos", value_name = "NAME")]
    pub db: String,
    /// The user the middleware connects to the backends as, with the password in
    /// $TIERSCOPE_MIDDLEWARE_PASSWORD (scram-sha-256; mysql_native_password with --protocol
    /// mysql), and the only user its clients may log in as, with the same password.
    #[arg(long, default_value = "tierscope")]
    pub user: String,
    /// Connections to each backend at most.
    #[arg(long, default_value_t = 16)]
    pub pool: usize,
    /// Read balancing: lprf = Least-Pending-Requests-First, rr = round robin, wrr = weighted round
    /// robin (--weights), lrt = least (pending + 1) x recent read latency, aware = least expected
    /// wait (the expected remaining service of the reads in flight, by their statements'
    /// moving-average service times: away from replicas busy with heavy queries).
    #[arg(long, default_value = "lprf")]
    pub policy: String,
    /// With wrr: one weight per --backend, in order (default: all 1).
    #[arg(long, value_name = "W,W,...")]
    pub weights: Option<String>,
    /// Keep per-statement service times and heavy reads per backend under any policy (aware always
    /// does); they go to --stats.
    #[arg(long)]
    pub labels: bool,
    /// A statement is heavy when its average service time is more than K times the typical read's
    /// (the median over the reads).
    #[arg(long, default_value_t = balance::HEAVY_FACTOR, value_name = "K")]
    pub heavy_factor: f64,
    /// Answer a write after the first backend succeeded or after all finished.
    #[arg(long, default_value = "first", value_parser = ["first", "all"])]
    pub wait: String,
    /// The recovery log: every write unit gets a sequence number and is appended here (fsync'd
    /// before its client is answered); each backend keeps its last unit's number in a table
    /// (tierscope_recovery). At start, a backend behind the others is brought to the head from the
    /// log before anything is served, or refused when the log cannot (off: no log, no table).
    #[arg(long, value_name = "PATH")]
    pub recovery_log: Option<PathBuf>,
    /// How writes keep one order on every backend: lock = one database-wide write lock (an
    /// explicit transaction holds it to its end); rows = write transactions run side by side when
    /// the rows they write differ (UPDATE or DELETE of one row by its primary key, INSERT into a
    /// table without a unique key; any other write holds the whole database; a deadlock among
    /// them fails one transaction with 40P01). PostgreSQL only. With --recovery-log a transaction
    /// holding rows is logged as one record when it commits, the commits one at a time.
    #[arg(long, default_value = "lock", value_parser = ["lock", "rows"])]
    pub scheduler: String,
    /// Write the counts as JSON here on exit.
    #[arg(long, value_name = "PATH")]
    pub stats: Option<PathBuf>,
    /// Seconds to wait for the backends at start.
    #[arg(long, default_value_t = 10.0)]
    pub connect_timeout: f64,
    /// Sample pending requests and reads done per backend every S seconds into the stats' series
    /// (the last hour at 50 ms; 0: off).
    #[arg(long, default_value_t = 0.05, value_name = "S")]
    pub series_interval: f64,
    /// Threads of the tokio runtime: 1 = every session on one thread (the current-thread runtime,
    /// the least CPU per transaction); N > 1 = N worker threads; 0 = one worker per CPU.
    #[arg(long, default_value_t = 1)]
    pub threads: usize,
    /// Accepted for command-line compatibility with the Python middleware (ignored: tokio).
    #[arg(long = "loop", hide = true, value_parser = ["auto", "asyncio", "uvloop"])]
    pub event_loop: Option<String>,
}

pub fn log(message: &str) {
    let secs = sql::now_micros().div_euclid(1_000_000) * 1_000_000;
    eprintln!("{} middleware: {message}", sql::iso_utc(secs));
}

/// Python's repr of a list of strings (for the same disabled reasons).
pub fn pylist(items: &[String]) -> String {
    let parts: Vec<String> = items.iter().map(|s| format!("'{}'", s.replace('\\', "\\\\").replace('\'', "\\'"))).collect();
    format!("[{}]", parts.join(", "))
}

/// No enabled backend is left to run a request.
#[derive(Debug)]
pub struct NoBackend(pub String);

/// One database server and what the manager knows about it (the counts are in `State`).
pub struct Backend {
    pub name: String,
    pub pool: Pool,
    enabled: AtomicBool,
    /// disabled because it stopped answering: with a recovery log it may rejoin (`recover::rejoin`)
    rejoinable: AtomicBool,
    /// writes finished here (reads routed here wait for the writes started before them)
    progress: watch::Sender<u64>,
}

impl Backend {
    pub fn enabled(&self) -> bool {
        self.enabled.load(Ordering::Acquire)
    }

    /// Wait until the writes started before a read was routed here have executed here (with
    /// wait=first a replica may still apply a write the client was already answered for).
    pub async fn wait_for_writes(&self, upto: u64) {
        if *self.progress.borrow() >= upto {
            return;
        }
        let mut rx = self.progress.subscribe();
        let _ = rx.wait_for(|&done| done >= upto || !self.enabled()).await;
    }
}

#[derive(Default, Clone)]
pub struct BState {
    pub pending: i64,
    pub reads: u64,
    pub writes: u64,
    pub failed_writes: u64,
    pub writes_started: u64,
    pub weight: f64,
    pub read_latency_s: Option<f64>,
    pub disabled_reason: Option<String>,
    /// times it came back while serving (`recover::rejoin`)
    pub rejoined: u64,
    /// reads in flight here when labels are tracked: token -> (expected seconds, started at, heavy)
    pub inflight: HashMap<u64, (f64, f64, bool)>,
    /// heavy reads in flight here (labels tracked)
    pub heavy: i64,
    /// heavy reads it executed (labels tracked)
    pub heavy_reads: u64,
}

/// Per-label service times (the aware policy; any policy with --labels): the manager's part of
/// `python/tierscope/middleware/manager.py`.
#[derive(Default)]
pub struct Labels {
    pub track: bool,
    pub heavy_factor: f64,
    /// statement text -> label
    cache: HashMap<String, Arc<str>>,
    /// label -> moving average of its reads' service times (seconds)
    pub service_s: HashMap<Arc<str>, f64>,
    pub counts: HashMap<Arc<str>, u64>,
    pub heavy_set: HashSet<Arc<str>>,
    pub typical_s: Option<f64>,
    tokens: u64,
    heavy_checked: u64,
}

impl Labels {
    /// Which labels are heavy now and the typical service time (every 100 reads, and when a label
    /// is new).
    fn update_heavy(&mut self) {
        self.heavy_checked = self.tokens;
        let names: Vec<&Arc<str>> = self.service_s.keys().collect();
        let service: Vec<f64> = names.iter().map(|k| self.service_s[*k]).collect();
        let counts: Vec<f64> = names.iter().map(|k| self.counts.get(*k).copied().unwrap_or(0) as f64).collect();
        let (heavy, typical) = balance::heavy_labels(&service, &counts, self.heavy_factor);
        self.heavy_set = heavy.into_iter().map(|i| names[i].clone()).collect();
        self.typical_s = typical;
    }
}

#[derive(Default, Clone, Copy)]
pub struct Counts {
    pub sessions: u64,
    pub units: u64,
    pub reads: u64,
    pub writes: u64,
    pub transaction_units: u64,
    pub read_retries: u64,
    pub named_statements: u64,
    pub flushed_units: u64,
    pub errors_to_clients: u64,
    pub macros_rewritten: u64,
    pub write_lock_wait_s: f64,
}

pub struct State {
    pub counts: Counts,
    pub b: Vec<BState>,
    pub labels: Labels,
    rr_next: usize,
    wrr_current: Vec<f64>,
}

/// samples kept in the stats series at most (an hour at 50 ms)
const SERIES_MAX: usize = 72_000;

/// One sample: seconds since the start, pending requests, heavy reads in flight and reads done per
/// backend.
type Sample = (f64, Vec<i64>, Vec<i64>, Vec<u64>);

#[derive(Default)]
struct Series {
    interval_s: f64,
    rows: VecDeque<Sample>,
}

/// The RAIDb-1 request manager: the backends, the read balancer, the write lock (or the row
/// scheduler), the counts.
pub struct Manager {
    pub backends: Vec<Backend>,
    pub policy: Policy,
    pub wait_all: bool,
    pub database: String,
    /// the only user clients may log in as
    pub user: String,
    /// the SCRAM verifier of the password clients must prove they know (the backends')
    pub verifier: scram::Verifier,
    pub write_lock: Arc<tokio::sync::Mutex<()>>,
    /// with a recovery log under the row scheduler: held by a unit that takes a sequence number
    /// from its number until every backend has run it and its record is written, so that every
    /// backend applies the logged units in their order (the transactions' bodies run side by side)
    pub log_order: Arc<tokio::sync::Mutex<()>>,
    /// `--scheduler rows`: the row scheduler instead of the write lock
    pub scheduler: Option<scheduler::Scheduler>,
    pub st: Mutex<State>,
    pub parameters: OnceLock<Vec<(String, String)>>,
    /// the recovery log (--recovery-log)
    pub recovery: Option<Arc<recovery::Log>>,
    /// what the start found and did: each backend's position, the head, the units replayed
    recovered: Mutex<Value>,
    /// reads get labels (the state's `labels.track`, read without the lock: set before serving)
    labels_on: bool,
    /// bumped by every write that may invalidate statements prepared on backend connections
    pub statement_epoch: AtomicU64,
    started: Instant,
    /// writes still running on slower backends (after their client was answered)
    inflight: watch::Sender<usize>,
    series: Mutex<Series>,
}

impl Manager {
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        addresses: &[String],
        user: &str,
        password: &str,
        database: &str,
        pool: usize,
        policy: Policy,
        wait_all: bool,
        weights: &[f64],
    ) -> Result<Manager, ArgError> {
        let mut backends = Vec::new();
        for a in addresses {
            let (host, port) = split_address(a).ok_or_else(|| ArgError::Backend(a.clone()))?;
            if backends.iter().any(|b: &Backend| &b.name == a) {
                return Err(ArgError::DuplicateBackend(addresses.to_vec()));
            }
            backends.push(Backend {
                name: a.clone(),
                pool: Pool::new(&host, port, user, password, database, pool),
                enabled: AtomicBool::new(true),
                rejoinable: AtomicBool::new(false),
                progress: watch::Sender::new(0),
            });
        }
        let b = weights.iter().map(|&w| BState { weight: w, ..Default::default() }).collect();
        let n = backends.len();
        Ok(Manager {
            backends,
            policy,
            wait_all,
            database: database.to_string(),
            user: user.to_string(),
            verifier: scram::Verifier::new(password),
            write_lock: Arc::new(tokio::sync::Mutex::new(())),
            log_order: Arc::new(tokio::sync::Mutex::new(())),
            scheduler: None,
            st: Mutex::new(State {
                counts: Counts::default(),
                b,
                labels: Labels { track: policy == Policy::Aware, heavy_factor: balance::HEAVY_FACTOR, ..Default::default() },
                rr_next: 0,
                wrr_current: vec![0.0; n],
            }),
            parameters: OnceLock::new(),
            labels_on: policy == Policy::Aware,
            recovery: None,
            recovered: Mutex::new(Value::Null),
            statement_epoch: AtomicU64::new(0),
            started: Instant::now(),
            inflight: watch::Sender::new(0),
            series: Mutex::new(Series::default()),
        })
    }

    /// Keep per-label service times under any policy (`--labels`; aware always does) and call a
    /// label heavy above `heavy_factor` x the typical read's time.
    pub fn track_labels(&mut self, on: bool, heavy_factor: f64) {
        let st = self.st.get_mut().unwrap_or_else(|e| e.into_inner());
        st.labels.track = st.labels.track || on;
        st.labels.heavy_factor = heavy_factor;
        self.labels_on = st.labels.track;
    }

    /// Whether reads get labels (and their service times are kept).
    pub fn tracks_labels(&self) -> bool {
        self.labels_on
    }

    /// The label of a unit running `texts` (cached by the joined text): each statement's label,
    /// joined by "; ".
    pub fn label(&self, texts: &[&str]) -> Arc<str> {
        let joined;
        let key = if texts.len() == 1 {
            texts[0]
        } else {
            joined = texts.join("\n");
            joined.as_str()
        };
        if let Some(l) = self.state().labels.cache.get(key) {
            return l.clone();
        }
        let lab: Arc<str> = texts.iter().map(|t| sql::label(t)).collect::<Vec<_>>().join("; ").into();
        let mut st = self.state();
        if st.labels.cache.len() > 10_000 {
            st.labels.cache.clear();
        }
        st.labels.cache.insert(key.to_string(), lab.clone());
        lab
    }

    /// Seconds since the manager started (the clock of the reads in flight).
    fn now(&self) -> f64 {
        self.started.elapsed().as_secs_f64()
    }

    pub fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.st.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub fn count(&self, f: impl FnOnce(&mut Counts)) {
        f(&mut self.state().counts);
    }

    pub fn enabled(&self) -> Vec<usize> {
        (0..self.backends.len()).filter(|&i| self.backends[i].enabled()).collect()
    }

    /// The backend for the next read (of `label`, when labels are tracked) by the configured
    /// policy, counted as pending there, the number of writes started there so far, and the
    /// read's token for `read_over` (labels tracked: it is in flight there, `read_begin`). The
    /// choice and the in-flight entry are made under one lock, so a read routed by another thread
    /// in between never sees this one pending without knowing what it runs (the Python middleware,
    /// on one event loop, does both without an await in between).
    pub fn choose_read(&self, label: Option<&Arc<str>>) -> Result<(usize, u64, Option<u64>), NoBackend> {
        let flags: Vec<bool> = self.backends.iter().map(Backend::enabled).collect();
        let now = if self.policy == Policy::Aware || label.is_some() { self.now() } else { 0.0 };
        let mut st = self.state();
        let pending: Vec<i64> = st.b.iter().map(|b| b.pending).collect();
        let i = match self.policy {
            Policy::Aware => {
                let typical = st.labels.typical_s.unwrap_or(0.0);
                let waits: Vec<f64> =
                    st.b.iter()
                        .map(|b| balance::expected_wait(b.inflight.values().map(|e| (e.0, e.1)), now, b.pending - b.inflight.len() as i64, typical))
                        .collect();
                let own = label.filter(|l| st.labels.heavy_set.contains(*l)).and_then(|l| st.labels.service_s.get(l).copied());
                let heavy: Vec<i64> = st.b.iter().map(|b| b.heavy).collect();
                balance::choose_aware(&waits, &pending, &flags, own.map(|o| (heavy.as_slice(), o)))
            }
            Policy::Lprf => balance::choose_lprf(&pending, &flags),
            Policy::Rr => {
                let (i, next) = balance::choose_rr(st.rr_next, &flags);
                st.rr_next = next;
                i
            }
            Policy::Wrr => {
                let weights: Vec<f64> = st.b.iter().map(|b| b.weight).collect();
                let mut cur = std::mem::take(&mut st.wrr_current);
                let i = balance::choose_wrr(&mut cur, &weights, &flags);
                st.wrr_current = cur;
                i
            }
            Policy::Lrt => {
                let lat: Vec<Option<f64>> = st.b.iter().map(|b| b.read_latency_s).collect();
                balance::choose_lrt(&pending, &lat, &flags)
            }
        };
        let i = i.ok_or_else(|| NoBackend("no database backend is enabled".into()))?;
        st.b[i].pending += 1;
        let token = Self::read_begin(&mut st, i, label, now);
        Ok((i, st.b[i].writes_started, token))
    }

    /// A read of `label` was routed to backend `i` (labels tracked): remember what it expects (the
    /// label's average, the typical read's for a label not known yet); the token for `read_over`.
    fn read_begin(st: &mut State, i: usize, label: Option<&Arc<str>>, now: f64) -> Option<u64> {
        let label = label?;
        let State { labels, b, .. } = st;
        labels.tokens += 1;
        let expected = labels.service_s.get(label).copied().unwrap_or(labels.typical_s.unwrap_or(0.0));
        let heavy = labels.heavy_set.contains(label);
        let bs = &mut b[i];
        bs.inflight.insert(labels.tokens, (expected, now, heavy));
        if heavy {
            bs.heavy += 1;
            bs.heavy_reads += 1;
        }
        Some(labels.tokens)
    }

    /// A read routed to backend `i` is over (done, failed or to be routed again): no longer
    /// pending there nor in flight.
    pub fn read_over(&self, i: usize, token: Option<u64>) {
        let mut st = self.state();
        let bs = &mut st.b[i];
        bs.pending -= 1;
        if let Some(t) = token {
            if let Some((_, _, true)) = bs.inflight.remove(&t) {
                bs.heavy -= 1;
            }
        }
    }

    /// A read executed on backend `i` in `seconds`: its moving average feeds the lrt policy, the
    /// label's (when tracked) the aware policy.
    pub fn read_done(&self, i: usize, seconds: f64, label: Option<&Arc<str>>) {
        let mut st = self.state();
        st.b[i].read_latency_s = Some(balance::ewma(st.b[i].read_latency_s, seconds));
        let Some(label) = label else {
            return;
        };
        let l = &mut st.labels;
        if !l.service_s.contains_key(label) && l.service_s.len() > 10_000 {
            l.service_s.clear();
            l.counts.clear();
        }
        let avg = balance::ewma(l.service_s.get(label).copied(), seconds);
        l.service_s.insert(label.clone(), avg);
        let n = l.counts.entry(label.clone()).or_insert(0);
        *n += 1;
        if *n == 1 || l.tokens - l.heavy_checked >= 100 {
            l.update_heavy();
        }
    }

    /// Take backend `i` out of service for good (until a restart's recovery): its result differed,
    /// it failed where another succeeded, it was refused.
    pub fn disable(&self, i: usize, reason: &str) {
        self.disable_as(i, reason, false);
    }

    /// Take backend `i` out of service because it stopped answering (its connection broke, none
    /// could be opened): with a recovery log it rejoins once it answers again and the log brings
    /// it to the head (`recover::rejoin`).
    pub fn disable_unreachable(&self, i: usize, reason: &str) {
        self.disable_as(i, reason, self.recovery.is_some());
    }

    /// The disabled backends that may rejoin.
    pub fn rejoinable(&self) -> Vec<usize> {
        (0..self.backends.len()).filter(|&i| !self.backends[i].enabled() && self.backends[i].rejoinable.load(Ordering::Acquire)).collect()
    }

    /// Backend `i` is at the head again: reads and writes go to it (`message` logged).
    pub fn enable(&self, i: usize, message: &str) {
        let b = &self.backends[i];
        b.rejoinable.store(false, Ordering::Release);
        {
            let mut st = self.state();
            st.b[i].disabled_reason = None;
            st.b[i].rejoined += 1;
        }
        b.enabled.store(true, Ordering::Release);
        log(message);
    }

    /// Backend `i`, disabled, cannot be brought back: it stays out for good (`reason` logged).
    pub fn refuse(&self, i: usize, reason: &str) {
        self.backends[i].rejoinable.store(false, Ordering::Release);
        self.state().b[i].disabled_reason = Some(reason.to_string());
        log(&format!("backend {} DISABLED: {reason}", self.backends[i].name));
    }

    fn disable_as(&self, i: usize, reason: &str, rejoinable: bool) {
        let b = &self.backends[i];
        if !b.enabled.swap(false, Ordering::AcqRel) {
            return;
        }
        b.rejoinable.store(rejoinable, Ordering::Release);
        self.state().b[i].disabled_reason = Some(reason.to_string());
        b.pool.drop_idle();
        log(&format!("backend {} DISABLED: {reason}", b.name));
        b.progress.send_modify(|_| {}); // reads waiting on it choose again
    }

    pub fn writes_begin(&self, idx: &[usize]) {
        let mut st = self.state();
        for &i in idx {
            st.b[i].pending += 1;
            st.b[i].writes_started += 1;
        }
    }

    pub fn writes_end(&self, i: usize) {
        let mut st = self.state();
        st.b[i].pending -= 1;
        st.b[i].writes += 1;
    }

    /// One more write is over on backend `i`; reads waiting for it are woken.
    pub fn write_finished(&self, i: usize) {
        self.backends[i].progress.send_modify(|d| *d += 1);
    }

    pub fn inflight_add(&self, d: isize) {
        self.inflight.send_modify(|n| *n = n.saturating_add_signed(d));
    }

    /// Open one connection to every backend (retrying up to `timeout`); a backend that never
    /// answers is disabled. Keeps the first backend's server parameters for the clients.
    pub async fn check_backends(&self, timeout: Duration) -> Result<(), NoBackend> {
        let deadline = Instant::now() + timeout;
        for (i, b) in self.backends.iter().enumerate() {
            loop {
                match b.pool.acquire().await {
                    Ok(conn) => {
                        let _ = self.parameters.set(conn.parameters.clone());
                        b.pool.release(conn);
                        break;
                    }
                    Err(err) if Instant::now() < deadline => {
                        let _ = err;
                        tokio::time::sleep(Duration::from_millis(200)).await;
                    }
                    Err(err) => {
                        self.disable_unreachable(i, &format!("unreachable at start: {err}"));
                        break;
                    }
                }
            }
        }
        if self.enabled().is_empty() {
            let st = self.state();
            let why: Vec<String> =
                self.backends.iter().zip(&st.b).map(|(b, s)| format!("{}: {}", b.name, s.disabled_reason.as_deref().unwrap_or("None"))).collect();
            return Err(NoBackend(format!("no database backend answered: {}", why.join("; "))));
        }
        Ok(())
    }

    /// A transaction the backends rolled back (its connections closed): a ROLLBACK record, so that
    /// a replay does not run the units after it inside it.
    pub fn log_rollback(&self) {
        if let Some(l) = &self.recovery {
            let seq = l.take_seq();
            if let Err(e) = l.append(seq, &l.rollback_record()) {
                log(&format!("recovery log {}: cannot append unit {seq}: {e}", l.path.display()));
            }
        }
    }

    /// With a recovery log, before anything is served: each enabled backend's position (its
    /// recovery table, made when missing: position 0); the head is the log's last unit or the
    /// highest position. A backend behind the head gets the missing units replayed from the log
    /// on one connection, then the head as its position; one the log cannot bring there (the units
    /// are gone from it, or the log is behind the backends) is refused: disabled with one message
    /// naming it and the positions. With every backend at the head, the log is emptied.
    pub async fn recover(&self) -> Result<(), NoBackend> {
        recover::recover(self, self).await
    }

    fn sample(&self) {
        let t = round3(self.started.elapsed().as_secs_f64());
        let (pending, heavy, reads) = {
            let st = self.state();
            (st.b.iter().map(|b| b.pending).collect(), st.b.iter().map(|b| b.heavy).collect(), st.b.iter().map(|b| b.reads).collect())
        };
        let mut s = self.series.lock().unwrap_or_else(|e| e.into_inner());
        if s.rows.len() >= SERIES_MAX {
            s.rows.pop_front();
        }
        s.rows.push_back((t, pending, heavy, reads));
    }

    /// The counts, in the shape `python -m tierscope.middleware` writes.
    pub fn stats(&self) -> Value {
        let st = self.state();
        let c = st.counts;
        let backends: Vec<Value> = self
            .backends
            .iter()
            .zip(&st.b)
            .map(|(b, s)| {
                json!({
                    "name": b.name,
                    "enabled": b.enabled(),
                    "disabled_reason": s.disabled_reason,
                    "reads": s.reads,
                    "weight": s.weight,
                    "read_latency_ms": s.read_latency_s.map(|l| round3(1e3 * l)),
                    "writes": s.writes,
                    "failed_writes": s.failed_writes,
                    "connections_opened": b.pool.opened.load(Ordering::Relaxed),
                    "pool": b.pool.size,
                    "heavy_reads": s.heavy_reads,
                    "rejoined": s.rejoined,
                })
            })
            .collect();
        let labels = {
            let l = &st.labels;
            // the 50 slowest labels, slowest first (ties: by text)
            let mut slow: Vec<(&Arc<str>, f64)> = l.service_s.iter().map(|(k, &v)| (k, v)).collect();
            slow.sort_by(|a, b| b.1.total_cmp(&a.1).then_with(|| a.0.cmp(b.0)));
            slow.truncate(50);
            let mut heavy: Vec<&str> = l.heavy_set.iter().map(|k| &**k).collect();
            heavy.sort();
            json!({
                "tracked": l.track,
                "heavy_factor": l.heavy_factor,
                "typical_ms": l.typical_s.map(|t| round3(1e3 * t)),
                "heavy": heavy,
                "service_ms": slow.iter().map(|(k, v)| (k.to_string(), json!(round3(1e3 * v)))).collect::<serde_json::Map<_, _>>(),
                "counts": slow.iter().map(|(k, _)| (k.to_string(), json!(l.counts.get(*k).copied().unwrap_or(0)))).collect::<serde_json::Map<_, _>>(),
            })
        };
        drop(st);
        let series = {
            let s = self.series.lock().unwrap_or_else(|e| e.into_inner());
            let per = |f: &dyn Fn(&Sample, usize) -> Value| -> Value {
                let mut m = serde_json::Map::new();
                for (i, b) in self.backends.iter().enumerate() {
                    m.insert(b.name.clone(), Value::Array(s.rows.iter().map(|r| f(r, i)).collect()));
                }
                Value::Object(m)
            };
            json!({
                "interval_s": s.interval_s,
                "t_s": s.rows.iter().map(|r| r.0).collect::<Vec<f64>>(),
                "pending": per(&|r, i| json!(r.1[i])),
                "heavy": per(&|r, i| json!(r.2[i])),
                "reads": per(&|r, i| json!(r.3[i])),
            })
        };
        json!({
            "protocol": "postgres",
            "implementation": "rust",
            "policy": self.policy.name(),
            "wait": if self.wait_all { "all" } else { "first" },
            "uptime_s": round3(self.started.elapsed().as_secs_f64()),
            "sessions": c.sessions,
            "units": c.units,
            "reads": c.reads,
            "writes": c.writes,
            "transaction_units": c.transaction_units,
            "read_retries": c.read_retries,
            "named_statements": c.named_statements,
            "flushed_units": c.flushed_units,
            "errors_to_clients": c.errors_to_clients,
            "macros_rewritten": c.macros_rewritten,
            "write_lock_wait_s": round3(c.write_lock_wait_s),
            "disabled": self.backends.iter().filter(|b| !b.enabled()).map(|b| b.name.clone()).collect::<Vec<_>>(),
            "backends": backends,
            "labels": labels,
            "series": series,
            "recovery": self.recovery.as_ref().map(|l| {
                let mut r = self.recovered.lock().unwrap_or_else(|e| e.into_inner()).clone();
                if let Value::Object(o) = &mut r {
                    o.insert("next_seq".into(), json!(l.peek_seq()));
                }
                r
            }),
            "scheduler": scheduler::stats(self.scheduler.as_ref()),
        })
    }
}

fn round3(x: f64) -> f64 {
    (x * 1000.0).round() / 1000.0
}

/// ("host", port) of "host:port" (IPv6 in brackets allowed).
pub fn split_address(a: &str) -> Option<(String, u16)> {
    let (host, port) = a.rsplit_once(':')?;
    if host.is_empty() || port.is_empty() || !port.bytes().all(|c| c.is_ascii_digit()) {
        return None;
    }
    Some((host.trim_matches(|c| c == '[' || c == ']').to_string(), port.parse().ok()?))
}

fn write_stats(path: &PathBuf, stats: &Value) -> Result<()> {
    let mut tmp = path.clone().into_os_string();
    tmp.push(".tmp");
    let tmp = PathBuf::from(tmp);
    std::fs::write(&tmp, serde_json::to_string_pretty(stats)? + "\n").with_context(|| format!("writing {}", tmp.display()))?;
    std::fs::rename(&tmp, path).with_context(|| format!("writing {}", path.display()))?;
    Ok(())
}

fn usage_error(err: &ArgError) -> Result<i32> {
    eprintln!("tierscope-engine middleware: error: {err}");
    Ok(2)
}

/// the environment variable carrying the backends' password (the clients' too)
pub const PASSWORD_ENV: &str = "TIERSCOPE_MIDDLEWARE_PASSWORD";

pub fn run(args: MiddlewareArgs) -> Result<i32> {
    let error::Checked { policy, listen: (listen_host, listen_port), weights } = match error::check(&args) {
        Ok(c) => c,
        Err(e) => return usage_error(&e),
    };
    let password = std::env::var(PASSWORD_ENV).unwrap_or_default();
    if password.is_empty() {
        log(&ArgError::NoPassword.to_string());
        return Ok(2);
    }
    let manager = match Manager::new(&args.backend, &args.user, &password, &args.db, args.pool, policy, args.wait == "all", &weights) {
        Ok(mut m) => {
            m.track_labels(args.labels, args.heavy_factor);
            if args.scheduler == "rows" {
                m.scheduler = Some(scheduler::Scheduler::default());
            }
            if let Some(path) = &args.recovery_log {
                match recovery::Log::open(path) {
                    Ok(mut l) => {
                        l.mysql = args.protocol == "mysql";
                        m.recovery = Some(Arc::new(l));
                    }
                    Err(e) => {
                        log(&ArgError::RecoveryLog { path: path.clone(), reason: e.to_string() }.to_string());
                        return Ok(2);
                    }
                }
            }
            Arc::new(m)
        }
        Err(e) => {
            log(&e.to_string());
            return Ok(2);
        }
    };
    // one thread: tokio's current-thread runtime (every task on one thread, as the Python middleware's
    // event loop: no wakeups between workers); more: the multi-threaded runtime
    let mut rt = if args.threads == 1 { tokio::runtime::Builder::new_current_thread() } else { tokio::runtime::Builder::new_multi_thread() };
    if args.threads > 1 {
        rt.worker_threads(args.threads);
    }
    let rt = rt.enable_all().build().context("starting the tokio runtime")?;
    let code = if args.protocol == "mysql" {
        let cluster = Arc::new(mysql_session::Cluster::new(manager, &password, args.pool));
        rt.block_on(serve::serve(cluster, args, listen_host, listen_port))?
    } else {
        rt.block_on(serve::serve(manager, args, listen_host, listen_port))?
    };
    rt.shutdown_timeout(Duration::from_millis(200));
    Ok(code)
}

/// The PostgreSQL front end: the manager's own pools are the backends' connections.
impl serve::Front for Manager {
    const NAME: &'static str = "";

    fn manager(self: &Arc<Self>) -> Arc<Manager> {
        self.clone()
    }

    async fn check_backends(&self, timeout: Duration) -> Result<(), NoBackend> {
        Manager::check_backends(self, timeout).await
    }

    async fn recover(&self) -> Result<(), NoBackend> {
        Manager::recover(self).await
    }

    fn spawn_session(self: &Arc<Self>, stream: tokio::net::TcpStream, id: u32) {
        tokio::spawn(session::Session::new(self.clone(), stream, id).run());
    }

    async fn rejoin(&self, i: usize) -> recover::Rejoin {
        recover::rejoin(self, self, i).await
    }

    fn drop_idle(&self) {
        for b in &self.backends {
            b.pool.drop_idle();
        }
    }

    fn stats(&self) -> Value {
        Manager::stats(self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_split_like_the_python_middleware() {
        assert_eq!(split_address("127.0.0.1:5432"), Some(("127.0.0.1".into(), 5432)));
        assert_eq!(split_address("[::1]:5432"), Some(("::1".into(), 5432)));
        assert_eq!(split_address("localhost"), None);
        assert_eq!(split_address(":5432"), None);
        assert_eq!(split_address("h:x"), None);
        assert_eq!(pylist(&["INSERT 0 1".into()]), "['INSERT 0 1']");
    }

    #[test]
    fn the_manager_routes_reads_by_policy_and_skips_disabled_backends() {
        let addrs = vec!["127.0.0.1:1".to_string(), "127.0.0.1:2".to_string()];
        let m = Manager::new(&addrs, "postgres", "pw", "db", 1, Policy::Rr, false, &[1.0, 1.0]).unwrap();
        let seq: Vec<usize> = (0..3).map(|_| m.choose_read(None).unwrap().0).collect();
        assert_eq!(seq, [0, 1, 0]);
        m.disable(0, "test");
        assert!(!m.backends[0].enabled());
        assert_eq!(m.choose_read(None).unwrap().0, 1);
        m.disable(1, "test");
        assert!(m.choose_read(None).is_err());
        let s = m.stats();
        assert_eq!(s["disabled"].as_array().unwrap().len(), 2);
        assert_eq!(s["backends"][0]["disabled_reason"], "test");
        let m = Manager::new(&addrs, "postgres", "pw", "db", 1, Policy::Lprf, false, &[1.0, 1.0]).unwrap();
        let seq: Vec<usize> = (0..4).map(|_| m.choose_read(None).unwrap().0).collect();
        assert_eq!(seq, [0, 1, 0, 1]); // none finishes: pending decides
        assert!(Manager::new(&[addrs[0].clone(), addrs[0].clone()], "u", "pw", "d", 1, Policy::Lprf, false, &[1.0, 1.0]).is_err());
    }

    #[test]
    fn the_manager_sends_light_reads_away_from_the_replica_running_a_heavy_one() {
        let addrs = vec!["127.0.0.1:1".to_string(), "127.0.0.1:2".to_string()];
        let mut m = Manager::new(&addrs, "postgres", "pw", "db", 4, Policy::Aware, false, &[1.0, 1.0]).unwrap();
        m.track_labels(false, balance::HEAVY_FACTOR);
        assert!(m.tracks_labels());
        let (light, heavy): (Arc<str>, Arc<str>) = ("light".into(), "heavy".into());
        // teach it the labels: 95 light reads of 1 ms, 5 heavy reads of 100 ms
        for _ in 0..95 {
            m.read_done(0, 0.001, Some(&light));
        }
        for _ in 0..5 {
            m.read_done(1, 0.100, Some(&heavy));
        }
        {
            let st = m.state();
            assert_eq!(st.labels.heavy_set, HashSet::from([heavy.clone()]));
            assert_eq!(st.labels.typical_s, Some(0.001));
        }
        // a heavy read starts: the first backend (idle) gets it
        let (h, _, th) = m.choose_read(Some(&heavy)).unwrap();
        assert_eq!(h, 0);
        // two light reads: both to the second backend although LPRF would put the second one on
        // the first ([1, 1] -> first)
        let mut picks = Vec::new();
        let mut tokens = Vec::new();
        for _ in 0..2 {
            let (x, _, t) = m.choose_read(Some(&light)).unwrap();
            tokens.push((x, t));
            picks.push(x);
        }
        assert_eq!(picks, [1, 1]);
        assert_eq!(balance::choose_lprf(&[1, 1], &[true, true]), Some(0));
        // a read of a label not known yet counts as the typical read: to the second backend too
        let unknown: Arc<str> = "unknown".into();
        let (u, _, tu) = m.choose_read(Some(&unknown)).unwrap();
        assert_eq!(u, 1);
        assert_eq!(m.state().b[1].inflight[&tu.unwrap()].0, 0.001);
        // a second heavy read joins the first (it would wait there at most as long as it runs)
        let (h2, _, th2) = m.choose_read(Some(&heavy)).unwrap();
        assert_eq!(h2, 0);
        assert_eq!(m.state().b[0].heavy, 2);
        m.read_over(0, th2);
        m.read_over(0, th);
        for (x, t) in tokens {
            m.read_over(x, t);
        }
        m.read_over(u, tu);
        {
            let st = m.state();
            assert_eq!((st.b[0].heavy, st.b[0].pending, st.b[1].pending), (0, 0, 0));
            assert!(st.b[0].inflight.is_empty() && st.b[1].inflight.is_empty());
        }
        assert_eq!(m.choose_read(Some(&light)).unwrap().0, 0); // idle again
        let s = m.stats();
        assert_eq!(s["labels"]["heavy"], json!(["heavy"]));
        assert_eq!(s["labels"]["typical_ms"], json!(1.0));
        assert_eq!(s["labels"]["counts"]["light"], json!(95));
        assert_eq!(s["labels"]["service_ms"]["heavy"], json!(100.0));
        assert_eq!(s["labels"]["tracked"], json!(true));
        assert_eq!(s["backends"][0]["heavy_reads"], json!(2));
        assert_eq!(s["backends"][1]["heavy_reads"], json!(0));
        assert_eq!(
            &*m.label(&["SELECT v FROM t WHERE id = 1", "SELECT v FROM t WHERE id = 1"]),
            "SELECT v FROM t WHERE id = ?; SELECT v FROM t WHERE id = ?"
        );
        assert_eq!(&*m.label(&["SELECT 2"]), "SELECT ?");
        // without --labels, LPRF keeps none
        let m = Manager::new(&addrs, "postgres", "pw", "db", 4, Policy::Lprf, false, &[1.0, 1.0]).unwrap();
        assert!(!m.tracks_labels());
        assert_eq!(m.stats()["labels"]["tracked"], json!(false));
    }

    #[test]
    fn a_heavy_read_joins_heavy_reads_only_where_it_would_wait_at_most_its_own_time() {
        let addrs: Vec<String> = (1..=3).map(|p| format!("127.0.0.1:{p}")).collect();
        let mut m = Manager::new(&addrs[..2], "postgres", "pw", "db", 4, Policy::Aware, false, &[1.0, 1.0]).unwrap();
        m.track_labels(false, balance::HEAVY_FACTOR);
        let (light, heavy): (Arc<str>, Arc<str>) = ("light".into(), "heavy".into());
        for _ in 0..20 {
            m.read_done(0, 0.001, Some(&light));
        }
        m.read_done(0, 1.0, Some(&heavy)); // heavy from its first execution (a new label)
        assert!(m.state().labels.heavy_set.contains(&heavy));
        // four heavy reads of 1 s on average, none finishing: the first on the idle first replica;
        // the second joins it (it would wait there under 1 s, at most its own time); the third
        // would wait there about 2 s, more than it runs: the least expected wait, the second
        // replica; the fourth would wait about 2 s on the first replica (the most heavy reads) and
        // under 1 s on the second: it joins the second. LPRF alternates.
        let picks: Vec<(usize, Option<u64>)> = (0..4).map(|_| m.choose_read(Some(&heavy)).map(|(i, _, t)| (i, t)).unwrap()).collect();
        assert_eq!(picks.iter().map(|p| p.0).collect::<Vec<_>>(), [0, 0, 1, 1]);
        let mut pending = [0i64; 2];
        let lprf: Vec<usize> = (0..4)
            .map(|_| {
                let i = balance::choose_lprf(&pending, &[true, true]).unwrap();
                pending[i] += 1;
                i
            })
            .collect();
        assert_eq!(lprf, [0, 1, 0, 1]);
        {
            let st = m.state();
            assert_eq!((st.b[0].heavy, st.b[1].heavy), (2, 2));
            assert_eq!((st.b[0].heavy_reads, st.b[1].heavy_reads), (2, 2));
        }
        // a light read now: both replicas expect about 2 s; the one whose heavy reads started
        // earlier (less left) by the expected wait, ties: fewer pending, then the earliest
        let (l, _, tl) = m.choose_read(Some(&light)).unwrap();
        assert_eq!(l, 0);
        for (i, t) in picks.into_iter().chain([(l, tl)]) {
            m.read_over(i, t);
        }
        {
            let st = m.state();
            assert_eq!((st.b[0].heavy, st.b[1].heavy, st.b[0].pending, st.b[1].pending), (0, 0, 0, 0));
            assert!(st.b[0].inflight.is_empty() && st.b[1].inflight.is_empty());
        }
        // a disabled replica running heavy reads is never joined
        let mut m = Manager::new(&addrs, "postgres", "pw", "db", 4, Policy::Aware, false, &[1.0; 3]).unwrap();
        m.track_labels(false, balance::HEAVY_FACTOR);
        for _ in 0..20 {
            m.read_done(0, 0.001, Some(&light));
        }
        m.read_done(0, 1.0, Some(&heavy));
        assert_eq!(m.choose_read(Some(&heavy)).unwrap().0, 0);
        m.disable(0, "test");
        assert_eq!(m.choose_read(Some(&heavy)).unwrap().0, 1);
        assert_eq!(m.choose_read(Some(&heavy)).unwrap().0, 1);
    }
}
