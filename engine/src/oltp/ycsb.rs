//! YCSB's CoreWorkload against a SQL table, as the JDBC binding shapes it.
//!
//! `load` creates `usertable (ycsb_key VARCHAR(255) PRIMARY KEY, field0..field{n-1} TEXT)` and
//! inserts `--records` rows with keys `"user" + FNV-64(keynum)` (YCSB's hashed insert order) in
//! multi-row INSERTs from `--threads` connections. `run` drives one of the standard workloads
//! A–F from a fixed number of threads, each with its own connection and prepared statements:
//!
//! | wl | read | update | insert | scan | rmw | keys |
//! |----|------|--------|--------|------|-----|------|
//! | A  | 0.50 | 0.50   |        |      |     | zipfian |
//! | B  | 0.95 | 0.05   |        |      |     | zipfian |
//! | C  | 1.00 |        |        |      |     | zipfian |
//! | D  | 0.95 |        | 0.05   |      |     | latest  |
//! | E  |      |        | 0.05   | 0.95 |     | zipfian, scans of 1..100 rows |
//! | F  | 0.50 |        |        |      | 0.50| zipfian |
//!
//! With `--target`, each thread schedules its k-th operation at start + offset + k/rate and
//! latency is measured from that intended start (YCSB's `measurement.interval=intended`), so a
//! slow server shows up as latency instead of silently lowering the offered load.

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};
use clap::{Args, Subcommand, ValueEnum};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use serde_json::json;

use super::db::{Conn, Dbms, Stmt, Val};
use super::error::{at_least_one, seconds, within, OltpError, MAX_SECONDS};
use super::generators::{fnv64, KeyChooser, ScrambledZipfian, Zipfian, ZIPFIAN_CONSTANT};
use super::stats::{self, now_ns, OpRecord, Outcome, Stats};

#[derive(Args, Debug)]
#[command(about = "YCSB core workloads A-F against PostgreSQL or MariaDB/MySQL (load, then run)")]
pub struct YcsbArgs {
    #[command(subcommand)]
    pub phase: Phase,
}

#[derive(Subcommand, Debug)]
pub enum Phase {
    /// (Re)create the table and insert --records rows.
    Load(LoadArgs),
    /// Run one workload (A-F) against a loaded table; prints a summary JSON on stdout.
    Run(RunArgs),
}

#[derive(Args, Debug, Clone)]
pub struct TableArgs {
    /// Where the database is: a libpq string / postgres:// URL (PostgreSQL) or
    /// mysql://user:password@host:port/db (MariaDB/MySQL).
    #[arg(long)]
    pub dsn: String,
    /// Table name.
    #[arg(long, default_value = "usertable")]
    pub table: String,
    /// Fields per record (field0..field{n-1}).
    #[arg(long, default_value_t = 10)]
    pub field_count: usize,
    /// Characters per field (YCSB default 100: ≈1 KB records).
    #[arg(long, default_value_t = 100)]
    pub field_length: usize,
}

#[derive(Args, Debug)]
pub struct LoadArgs {
    #[command(flatten)]
    pub table: TableArgs,
    /// Records to insert (key numbers 0..records-1).
    #[arg(long, default_value_t = 10_000)]
    pub records: u64,
    /// Loading connections.
    #[arg(long, default_value_t = 2)]
    pub threads: usize,
    /// Rows per INSERT statement.
    #[arg(long, default_value_t = 200)]
    pub batch: usize,
    /// Give up after this many seconds.
    #[arg(long, default_value_t = 3600.0)]
    pub max_seconds: f64,
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
}

#[derive(Clone, Copy, Debug, ValueEnum, PartialEq, Eq)]
pub enum Workload {
    A,
    B,
    C,
    D,
    E,
    F,
}

#[derive(Clone, Copy, Debug, ValueEnum, PartialEq, Eq)]
pub enum Distribution {
    Zipfian,
    Latest,
    Uniform,
}

#[derive(Args, Debug)]
pub struct RunArgs {
    #[command(flatten)]
    pub table: TableArgs,
    /// Standard workload (proportions in the module doc; `--help` of `ycsb` lists them).
    #[arg(long, value_enum, default_value = "a")]
    pub workload: Workload,
    /// Override the workload's request distribution.
    #[arg(long, value_enum)]
    pub distribution: Option<Distribution>,
    /// Records in the table (default: count them at start).
    #[arg(long)]
    pub records: Option<u64>,
    /// Client threads, one connection each.
    #[arg(long, default_value_t = 4)]
    pub threads: usize,
    /// Total target ops/s split over the threads (0 = as fast as possible). Latency is then
    /// measured from each operation's intended start (coordinated-omission corrected).
    #[arg(long, default_value_t = 0.0)]
    pub target: f64,
    /// Stop after this many operations in total (warm-up included).
    #[arg(long)]
    pub ops: Option<u64>,
    /// Stop after this many seconds (warm-up included).
    #[arg(long, default_value_t = 30.0)]
    pub duration: f64,
    /// Seconds at the start whose operations are not counted.
    #[arg(long, default_value_t = 0.0)]
    pub warmup: f64,
    /// Longest scan (workload E; YCSB's E file uses 100).
    #[arg(long, default_value_t = 100)]
    pub max_scan_length: u64,
    /// Write one row per counted operation to this Parquet file.
    #[arg(long)]
    pub log: Option<PathBuf>,
    /// Also write the summary JSON to this file.
    #[arg(long)]
    pub summary: Option<PathBuf>,
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
}

/// Operation types, in the order of the summary.
pub const OPS: [&str; 5] = ["READ", "UPDATE", "INSERT", "SCAN", "READ-MODIFY-WRITE"];
const READ: usize = 0;
const UPDATE: usize = 1;
const INSERT: usize = 2;
const SCAN: usize = 3;
const RMW: usize = 4;

/// (read, update, insert, scan, rmw) proportions and the request distribution of a workload.
pub fn mix(w: Workload) -> ([f64; 5], Distribution) {
    match w {
        Workload::A => ([0.5, 0.5, 0.0, 0.0, 0.0], Distribution::Zipfian),
        Workload::B => ([0.95, 0.05, 0.0, 0.0, 0.0], Distribution::Zipfian),
        Workload::C => ([1.0, 0.0, 0.0, 0.0, 0.0], Distribution::Zipfian),
        Workload::D => ([0.95, 0.0, 0.05, 0.0, 0.0], Distribution::Latest),
        Workload::E => ([0.0, 0.0, 0.05, 0.95, 0.0], Distribution::Zipfian),
        Workload::F => ([0.5, 0.0, 0.0, 0.0, 0.5], Distribution::Zipfian),
    }
}

/// Pick an operation from cumulative proportions.
pub fn choose_op<R: Rng>(rng: &mut R, props: &[f64; 5]) -> usize {
    let total: f64 = props.iter().sum();
    let mut u = rng.gen::<f64>() * total;
    for (i, p) in props.iter().enumerate() {
        if u < *p {
            return i;
        }
        u -= p;
    }
    props.iter().rposition(|p| *p > 0.0).unwrap_or(0)
}

/// The row key of key number `keynum` (YCSB's hashed insert order, zero padding 1).
pub fn key_name(keynum: u64) -> String {
    let mut k = String::with_capacity(24);
    key_into(keynum, &mut k);
    k
}

/// [`key_name`] into `out` (cleared first): no allocation once `out` has room for 24 bytes.
pub fn key_into(keynum: u64, out: &mut String) {
    use std::fmt::Write;
    out.clear();
    let _ = write!(out, "user{}", fnv64(keynum as i64));
}

const ALPHABET: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";

/// A random field value of `len` letters and digits.
pub fn field_value<R: Rng>(rng: &mut R, len: usize) -> String {
    let mut v = String::with_capacity(len);
    field_into(rng, len, &mut v);
    v
}

/// [`field_value`] into `out` (cleared first).
pub fn field_into<R: Rng>(rng: &mut R, len: usize, out: &mut String) {
    out.clear();
    out.extend((0..len).map(|_| ALPHABET[rng.gen_range(0..ALPHABET.len())] as char));
}

/// A thread's reused text buffers: the key and a field value.
#[derive(Default)]
struct Scratch {
    key: String,
    field: String,
}

fn check_name(table: &str) -> Result<(), OltpError> {
    if table.is_empty() || !table.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') {
        return Err(OltpError::TableName(table.to_string()));
    }
    Ok(())
}

impl TableArgs {
    /// The table name and the fields, as SQL and the drivers need them.
    pub fn check(&self) -> Result<(), OltpError> {
        check_name(&self.table)?;
        at_least_one("--field-count", self.field_count as u64)
    }
}

impl LoadArgs {
    /// The values a load cannot run with.
    pub fn check(&self) -> Result<(), OltpError> {
        self.table.check()?;
        at_least_one("--threads", self.threads as u64)?;
        at_least_one("--batch", self.batch as u64)?;
        seconds("--max-seconds", self.max_seconds, true)
    }
}

impl RunArgs {
    /// The values a run cannot run with (checked before connecting).
    pub fn check(&self) -> Result<(), OltpError> {
        self.table.check()?;
        at_least_one("--threads", self.threads as u64)?;
        seconds("--duration", self.duration, true)?;
        seconds("--warmup", self.warmup, false)?;
        // 0 = as fast as possible; else one operation per thread at least every 1e9 s
        if self.target != 0.0 {
            let slowest = self.threads as f64 / MAX_SECONDS;
            within("--target", self.target, slowest, f64::MAX, "0 (as fast as possible) or a rate of operations per second >= --threads / 1e9")?;
        }
        at_least_one("--max-scan-length", self.max_scan_length)?;
        if let Some(r) = self.records {
            at_least_one("--records", r)?;
        }
        Ok(())
    }
}

/// The table of a run among the database's `tables` (lower-cased, as [`Conn::tables`] gives them).
pub fn check_table_present(tables: &[String], table: &str) -> Result<(), OltpError> {
    if !tables.contains(&table.to_lowercase()) {
        return Err(OltpError::MissingTable { table: table.to_string() });
    }
    Ok(())
}

pub fn run(args: YcsbArgs) -> Result<i32> {
    match args.phase {
        Phase::Load(a) => load(a),
        Phase::Run(a) => run_workload(a),
    }
}

fn create_sql(t: &TableArgs, dbms: Dbms) -> String {
    let fields: Vec<String> = (0..t.field_count).map(|i| format!("field{i} TEXT")).collect();
    let tail = if dbms == Dbms::Mysql { " ENGINE=InnoDB" } else { "" };
    format!("CREATE TABLE {} (ycsb_key VARCHAR(255) PRIMARY KEY, {}){}", t.table, fields.join(", "), tail)
}

fn load(a: LoadArgs) -> Result<i32> {
    a.check()?;
    let started = Instant::now();
    let mut conn = Conn::connect(&a.table.dsn)?;
    let dbms = conn.dbms();
    conn.batch(&format!("DROP TABLE IF EXISTS {}", a.table.table))?;
    conn.batch(&create_sql(&a.table, dbms))?;
    drop(conn);
    let deadline = started + Duration::from_secs_f64(a.max_seconds);
    let next = Arc::new(AtomicU64::new(0));
    let mut handles = Vec::new();
    for t in 0..a.threads {
        let next = next.clone();
        let ta = a.table.clone();
        let (records, batch, seed, max_seconds) = (a.records, a.batch as u64, a.seed, a.max_seconds);
        handles.push(std::thread::spawn(move || -> Result<u64> {
            let mut conn = Conn::connect(&ta.dsn)?;
            let mut rng = SmallRng::seed_from_u64(seed.wrapping_mul(1000).wrapping_add(t as u64));
            let cols: Vec<String> = (0..ta.field_count).map(|i| format!("field{i}")).collect();
            let head = format!("INSERT INTO {} (ycsb_key, {}) VALUES ", ta.table, cols.join(", "));
            let mut done = 0u64;
            loop {
                if Instant::now() > deadline {
                    return Err(OltpError::LoadTimeout { seconds: max_seconds }.into());
                }
                let from = next.fetch_add(batch, Ordering::Relaxed);
                if from >= records {
                    return Ok(done);
                }
                let to = (from + batch).min(records);
                let mut sql = String::with_capacity(head.len() + ((to - from) as usize) * (ta.field_count * (ta.field_length + 4) + 40));
                sql.push_str(&head);
                for k in from..to {
                    if k > from {
                        sql.push(',');
                    }
                    sql.push_str("('");
                    sql.push_str(&key_name(k));
                    sql.push('\'');
                    for _ in 0..ta.field_count {
                        sql.push_str(",'");
                        sql.push_str(&field_value(&mut rng, ta.field_length));
                        sql.push('\'');
                    }
                    sql.push(')');
                }
                conn.batch(&sql)?;
                done += to - from;
            }
        }));
    }
    let mut loaded = 0;
    for h in handles {
        loaded += h.join().map_err(|_| anyhow!("a load thread panicked"))??;
    }
    let secs = started.elapsed().as_secs_f64();
    let out = json!({
        "benchmark": "ycsb", "phase": "load", "dbms": dbms.name(), "table": a.table.table,
        "records": loaded, "field_count": a.table.field_count, "field_length": a.table.field_length,
        "seconds": (secs * 1000.0).round() / 1000.0, "rows_per_s": (loaded as f64 / secs).round(),
    });
    println!("{out}");
    Ok(0)
}

/// Key numbers handed to inserts, and the highest one below which all inserts are acknowledged
/// (YCSB's AcknowledgedCounterGenerator: reads never pick a key still being inserted).
struct InsertKeys {
    next: AtomicU64,
    last_acked: AtomicU64,
    pending: Mutex<BTreeSet<u64>>,
}

impl InsertKeys {
    fn new(records: u64) -> InsertKeys {
        InsertKeys { next: AtomicU64::new(records), last_acked: AtomicU64::new(records.saturating_sub(1)), pending: Mutex::new(BTreeSet::new()) }
    }
    fn take(&self) -> u64 {
        self.next.fetch_add(1, Ordering::Relaxed)
    }
    fn ack(&self, k: u64) {
        let mut p = self.pending.lock().expect("insert keys lock");
        p.insert(k);
        let mut last = self.last_acked.load(Ordering::Relaxed);
        while p.remove(&(last + 1)) {
            last += 1;
        }
        self.last_acked.store(last, Ordering::Release);
    }
    fn last(&self) -> u64 {
        self.last_acked.load(Ordering::Acquire)
    }
}

struct Prepared {
    read: Stmt,
    update: Vec<Stmt>,
    insert: Stmt,
    scan: Stmt,
}

fn prepare(conn: &mut Conn, t: &TableArgs) -> Result<Prepared> {
    let read = conn.prepare(&format!("SELECT * FROM {} WHERE ycsb_key = ?", t.table))?;
    let update =
        (0..t.field_count).map(|i| conn.prepare(&format!("UPDATE {} SET field{i} = ? WHERE ycsb_key = ?", t.table))).collect::<Result<Vec<_>>>()?;
    let cols: Vec<String> = (0..t.field_count).map(|i| format!("field{i}")).collect();
    let marks = vec!["?"; t.field_count + 1].join(", ");
    let insert = conn.prepare(&format!("INSERT INTO {} (ycsb_key, {}) VALUES ({marks})", t.table, cols.join(", ")))?;
    let scan = conn.prepare(&format!("SELECT * FROM {} WHERE ycsb_key >= ? ORDER BY ycsb_key LIMIT ?", t.table))?;
    Ok(Prepared { read, update, insert, scan })
}

fn run_workload(a: RunArgs) -> Result<i32> {
    let t = &a.table;
    a.check()?;
    let mut conn = Conn::connect(&t.dsn)?;
    let dbms = conn.dbms();
    let tables = conn.tables()?;
    check_table_present(&tables, &t.table)?;
    let records = match a.records {
        Some(r) => r,
        None => {
            conn.simple_rows(&format!("SELECT COUNT(*) FROM {}", t.table))?.first().and_then(|r| r.first()).map(|v| v.i64()).transpose()?.unwrap_or(0)
                as u64
        }
    };
    if records == 0 {
        return Err(OltpError::EmptyTable { table: t.table.clone() }.into());
    }
    drop(conn);
    let (props, default_dist) = mix(a.workload);
    let dist = a.distribution.unwrap_or(default_dist);
    // YCSB: the zipfian range covers the keys inserts will add (2 × ops × insert proportion)
    let expected_new = match a.ops {
        Some(n) => (n as f64 * props[INSERT] * 2.0) as u64,
        None => (records as f64 * props[INSERT] * 2.0) as u64,
    };
    let keys = Arc::new(InsertKeys::new(records));
    let issued = Arc::new(AtomicU64::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let cpu0 = stats::cpu_seconds();
    let t0 = Instant::now();
    let epoch0 = now_ns();
    let warm = t0 + Duration::from_secs_f64(a.warmup.max(0.0));
    let deadline = t0 + Duration::from_secs_f64(a.duration);
    let interval = if a.target > 0.0 { Some(Duration::from_secs_f64(a.threads as f64 / a.target)) } else { None };
    let keep = a.log.is_some();
    let mut handles = Vec::new();
    for tid in 0..a.threads {
        let ta = t.clone();
        let (keys, issued, stop) = (keys.clone(), issued.clone(), stop.clone());
        let ops_bound = a.ops;
        let (max_scan, seed) = (a.max_scan_length, a.seed);
        handles.push(std::thread::spawn(move || -> Result<(Stats, Instant)> {
            let mut rng = SmallRng::seed_from_u64(seed.wrapping_mul(7919).wrapping_add(tid as u64 + 1));
            let mut chooser = match dist {
                Distribution::Uniform => KeyChooser::Uniform,
                Distribution::Zipfian => KeyChooser::Zipfian(ScrambledZipfian::new(0, records + expected_new - 1)),
                Distribution::Latest => KeyChooser::Latest(Box::new(Zipfian::new(0, records, ZIPFIAN_CONSTANT))),
            };
            let mut conn = Conn::connect_fast(&ta.dsn)?;
            let st = prepare(&mut conn, &ta)?;
            let mut stats = Stats::new(&OPS, keep);
            let mut next_at = interval.map(|iv| t0 + iv.mul_f64(rng.gen::<f64>()));
            let mut last_end = t0;
            let mut consecutive_errors = 0u32;
            let mut scratch = Scratch::default();
            loop {
                if stop.load(Ordering::Relaxed) {
                    break;
                }
                if let Some(n) = ops_bound {
                    if issued.fetch_add(1, Ordering::Relaxed) >= n {
                        break;
                    }
                }
                let intended = match (next_at.as_mut(), interval) {
                    (Some(at), Some(iv)) => {
                        let this = *at;
                        *at += iv;
                        let now = Instant::now();
                        if this >= deadline {
                            break;
                        }
                        if this > now {
                            std::thread::sleep(this - now);
                        }
                        this
                    }
                    _ => Instant::now(),
                };
                if intended >= deadline {
                    break;
                }
                let op = choose_op(&mut rng, &props);
                let start = Instant::now();
                let outcome = match do_op(&mut conn, &st, &ta, op, &mut rng, &mut chooser, &keys, max_scan, &mut scratch) {
                    Ok(true) => Outcome::Ok,
                    Ok(false) => {
                        stats.note_error(op, || "no row found".to_string());
                        Outcome::Error
                    }
                    Err(e) => {
                        stats.note_error(op, || format!("{e:#}"));
                        Outcome::Error
                    }
                };
                let end = Instant::now();
                last_end = end;
                if outcome == Outcome::Error {
                    consecutive_errors += 1;
                    if consecutive_errors >= 1000 || conn.is_closed() {
                        stop.store(true, Ordering::Relaxed);
                        bail!("thread {tid}: {} errors in a row (connection closed: {}), stopping", consecutive_errors, conn.is_closed());
                    }
                } else {
                    consecutive_errors = 0;
                }
                if intended >= warm {
                    let lat = end.duration_since(intended).as_micros() as u64;
                    stats.record(op, lat, outcome);
                    if let Some(recs) = stats.records.as_mut() {
                        let ns = |i: Instant| epoch0 + i.duration_since(t0).as_nanos() as i64;
                        recs.push(OpRecord {
                            thread: tid as u32,
                            op: op as u8,
                            intended_ns: ns(intended),
                            start_ns: ns(start),
                            end_ns: ns(end),
                            outcome,
                        });
                    }
                }
            }
            Ok((stats, last_end))
        }));
    }
    let mut total = Stats::new(&OPS, keep);
    let mut end = t0;
    let mut failures = Vec::new();
    for h in handles {
        match h.join().map_err(|_| anyhow!("a client thread panicked"))? {
            Ok((s, e)) => {
                total.merge(s);
                end = end.max(e);
            }
            Err(e) => failures.push(format!("{e:#}")),
        }
    }
    if !failures.is_empty() && total.total_ok() == 0 {
        bail!("every client thread failed: {}", failures.join("; "));
    }
    let cpu1 = stats::cpu_seconds();
    let measured = end.saturating_duration_since(warm).as_secs_f64();
    let ok = total.total_ok();
    let stopped_by = match a.ops {
        Some(n) if issued.load(Ordering::Relaxed) >= n => "ops",
        _ => "duration",
    };
    let cpu = (cpu1.0 - cpu0.0) + (cpu1.1 - cpu0.1);
    let mut out = json!({
        "benchmark": "ycsb",
        "phase": "run",
        "workload": format!("{:?}", a.workload).to_lowercase(),
        "dbms": dbms.name(),
        "distribution": format!("{dist:?}").to_lowercase(),
        "records": records,
        "threads": a.threads,
        "target_ops_s": a.target,
        "latency_from": if interval.is_some() { "intended" } else { "start" },
        "warmup_s": a.warmup,
        "seconds": (measured * 1000.0).round() / 1000.0,
        "stopped_by": stopped_by,
        "ops": ok,
        "ops_per_s": if measured > 0.0 { (ok as f64 / measured * 10.0).round() / 10.0 } else { 0.0 },
        "errors": total.total_errors(),
        "operations": total.per_op_json(),
        "inserted_keys": keys.next.load(Ordering::Relaxed) - records,
        "cpu_s": (cpu * 1000.0).round() / 1000.0,
        "ops_per_cpu_s": if cpu > 0.0 { (ok as f64 / cpu).round() } else { 0.0 },
    });
    if !failures.is_empty() {
        out["thread_failures"] = json!(failures);
    }
    if let (Some(path), Some(recs)) = (a.log.as_ref(), total.records.as_mut()) {
        let n = stats::write_ops(path, &OPS, recs, interval.is_some(), "tierscope-engine ycsb")?;
        out["log"] = json!({"path": path.display().to_string(), "rows": n});
    }
    let text = out.to_string();
    if let Some(path) = a.summary.as_ref() {
        std::fs::write(path, format!("{text}\n")).with_context(|| format!("--summary {}", path.display()))?;
    }
    println!("{text}");
    Ok(if failures.is_empty() { 0 } else { 1 })
}

/// One operation; Ok(false) when the server did it but found no row (YCSB's NOT_FOUND).
#[allow(clippy::too_many_arguments)]
fn do_op(
    conn: &mut Conn,
    st: &Prepared,
    t: &TableArgs,
    op: usize,
    rng: &mut SmallRng,
    chooser: &mut KeyChooser,
    keys: &InsertKeys,
    max_scan: u64,
    buf: &mut Scratch,
) -> Result<bool> {
    match op {
        READ => {
            key_into(chooser.next(rng, keys.last()), &mut buf.key);
            Ok(conn.query_count_text(st.read, &[&buf.key])? > 0)
        }
        UPDATE => {
            key_into(chooser.next(rng, keys.last()), &mut buf.key);
            let f = rng.gen_range(0..t.field_count);
            field_into(rng, t.field_length, &mut buf.field);
            Ok(conn.execute_text(st.update[f], &[&buf.field, &buf.key])? == 1)
        }
        INSERT => {
            let n = keys.take();
            let mut vals = Vec::with_capacity(t.field_count + 1);
            vals.push(Val::S(key_name(n)));
            for _ in 0..t.field_count {
                vals.push(Val::S(field_value(rng, t.field_length)));
            }
            let r = conn.execute(st.insert, &vals);
            keys.ack(n);
            Ok(r? == 1)
        }
        SCAN => {
            key_into(chooser.next(rng, keys.last()), &mut buf.key);
            let len = rng.gen_range(1..=max_scan);
            // the length as a number: the postgres crate binds it as the LIMIT's bigint, MySQL as an integer
            Ok(conn.query_count(st.scan, &[Val::S(buf.key.clone()), Val::I(len as i64)])? > 0)
        }
        RMW => {
            key_into(chooser.next(rng, keys.last()), &mut buf.key);
            if conn.query_count_text(st.read, &[&buf.key])? == 0 {
                return Ok(false);
            }
            let f = rng.gen_range(0..t.field_count);
            field_into(rng, t.field_length, &mut buf.field);
            Ok(conn.execute_text(st.update[f], &[&buf.field, &buf.key])? == 1)
        }
        _ => Err(anyhow!("unknown operation {op}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Pearson χ² of observed counts against expected proportions (zero-proportion cells must
    /// stay at zero).
    fn chi_square(obs: &[u64], props: &[f64]) -> f64 {
        let n: u64 = obs.iter().sum();
        let total: f64 = props.iter().sum();
        let mut x = 0.0;
        for (o, p) in obs.iter().zip(props) {
            if *p == 0.0 {
                assert_eq!(*o, 0, "an operation with proportion 0 was drawn");
                continue;
            }
            let e = n as f64 * p / total;
            x += (*o as f64 - e).powi(2) / e;
        }
        x
    }

    #[test]
    fn workload_mixes_match_their_proportions() {
        // χ² critical values at p = 0.001: 1 dof 10.83 (two non-zero cells)
        for w in [Workload::A, Workload::B, Workload::C, Workload::D, Workload::E, Workload::F] {
            let (props, _) = mix(w);
            let mut rng = SmallRng::seed_from_u64(42);
            let mut obs = [0u64; 5];
            for _ in 0..100_000 {
                obs[choose_op(&mut rng, &props)] += 1;
            }
            let cells = props.iter().filter(|p| **p > 0.0).count();
            let x = chi_square(&obs, &props);
            if cells > 1 {
                assert!(x < 10.83, "{w:?}: χ² = {x}, counts {obs:?}");
            } else {
                assert_eq!(obs.iter().sum::<u64>(), obs[READ]);
            }
        }
    }

    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(subcommand)]
        phase: Phase,
    }

    fn parse(phase: &str, extra: &[&str]) -> Result<Phase, clap::Error> {
        let mut argv = vec!["ycsb", phase, "--dsn", "host=127.0.0.1 user=x dbname=x"];
        argv.extend_from_slice(extra);
        Cli::try_parse_from(argv).map(|c| c.phase)
    }

    fn run_check(extra: &[&str]) -> Result<(), OltpError> {
        match parse("run", extra).expect("parses") {
            Phase::Run(a) => a.check(),
            Phase::Load(_) => unreachable!(),
        }
    }

    fn load_check(extra: &[&str]) -> Result<(), OltpError> {
        match parse("load", extra).expect("parses") {
            Phase::Load(a) => a.check(),
            Phase::Run(_) => unreachable!(),
        }
    }

    #[test]
    fn the_defaults_are_valid() {
        run_check(&[]).unwrap();
        load_check(&[]).unwrap();
        run_check(&["--target", "500", "--warmup", "2", "--records", "10"]).unwrap();
    }

    #[test]
    fn counts_below_one_are_refused() {
        for (opt, load) in [
            ("--threads", false),
            ("--threads", true),
            ("--batch", true),
            ("--field-count", false),
            ("--max-scan-length", false),
            ("--records", false),
        ] {
            let e = if load { load_check(&[opt, "0"]) } else { run_check(&[opt, "0"]) }.unwrap_err();
            assert!(matches!(e, OltpError::TooFew { option, value: 0 } if option == opt), "{opt}: {e:?}");
            assert_eq!(e.to_string(), format!("{opt} must be at least 1, got 0"));
        }
    }

    #[test]
    fn times_out_of_range_are_refused() {
        let e = run_check(&["--duration", "0"]).unwrap_err();
        assert!(matches!(e, OltpError::OutOfRange { option: "--duration", value, .. } if value == 0.0), "{e:?}");
        assert_eq!(e.to_string(), "--duration must be a number of seconds > 0 and <= 1e9 (every run is bounded in time), got 0");
        for bad in ["NaN", "inf", "-1", "1e10"] {
            let e = run_check(&[&format!("--duration={bad}")]).unwrap_err();
            assert!(matches!(e, OltpError::OutOfRange { option: "--duration", .. }), "{bad}: {e:?}");
        }
        let e = run_check(&["--warmup=-1"]).unwrap_err();
        assert_eq!(e.to_string(), "--warmup must be a number of seconds >= 0 and <= 1e9, got -1");
        let e = load_check(&["--max-seconds", "inf"]).unwrap_err();
        assert!(matches!(e, OltpError::OutOfRange { option: "--max-seconds", value, .. } if value.is_infinite()), "{e:?}");
        assert!(e.to_string().ends_with("got inf"), "{e}");
        let e = run_check(&["--target=-5"]).unwrap_err();
        assert!(matches!(e, OltpError::OutOfRange { option: "--target", .. }), "{e:?}");
        assert_eq!(e.to_string(), "--target must be 0 (as fast as possible) or a rate of operations per second >= --threads / 1e9, got -5");
    }

    #[test]
    fn a_table_name_sql_cannot_take_is_refused() {
        for bad in ["user table", "t;drop", ""] {
            let e = run_check(&["--table", bad]).unwrap_err();
            assert!(matches!(&e, OltpError::TableName(t) if t == bad), "{e:?}");
            assert_eq!(e.to_string(), format!("--table {bad:?}: letters, digits and _ only"));
        }
    }

    #[test]
    fn an_unknown_workload_is_refused_by_the_parser() {
        let e = parse("run", &["--workload", "g"]).expect_err("no workload g");
        assert_eq!(e.kind(), clap::error::ErrorKind::InvalidValue);
        assert!(e.to_string().contains("'g'"), "{e}");
        let e = parse("run", &["--distribution", "pareto"]).expect_err("no pareto");
        assert_eq!(e.kind(), clap::error::ErrorKind::InvalidValue);
    }

    #[test]
    fn a_missing_table_is_named() {
        check_table_present(&["usertable".to_string()], "UserTable").unwrap();
        let e = check_table_present(&["other".to_string()], "usertable").unwrap_err();
        assert!(matches!(&e, OltpError::MissingTable { table } if table == "usertable"), "{e:?}");
        // tests/test_oltp.py looks for "usertable is missing"
        assert_eq!(e.to_string(), "table usertable is missing: run `tierscope-engine ycsb load --dsn ...` first");
        assert_eq!(OltpError::EmptyTable { table: "usertable".into() }.to_string(), "table usertable is empty: load it first");
    }

    #[test]
    fn keys_are_hashed_key_numbers() {
        assert_eq!(key_name(0), format!("user{}", fnv64(0)));
        // the reused buffers of the hot path: cleared, then written, without growing
        let mut k = String::with_capacity(24);
        let at = k.as_ptr();
        for n in [0, 12345, u64::MAX / 3, 7] {
            key_into(n, &mut k);
            assert_eq!(k, format!("user{}", fnv64(n as i64)));
        }
        assert_eq!(k.as_ptr(), at, "user + 19 digits fit in 24 bytes: no reallocation");
        let mut rng = SmallRng::seed_from_u64(3);
        let mut f = String::new();
        field_into(&mut rng, 100, &mut f);
        field_into(&mut rng, 7, &mut f);
        assert!(f.len() == 7 && f.bytes().all(|b| ALPHABET.contains(&b)), "{f}");
        let names: std::collections::HashSet<String> = (0..10_000).map(key_name).collect();
        assert_eq!(names.len(), 10_000);
    }

    #[test]
    fn acknowledged_inserts_advance_in_order() {
        let k = InsertKeys::new(10);
        assert_eq!(k.last(), 9);
        let (a, b) = (k.take(), k.take());
        k.ack(b);
        assert_eq!(k.last(), 9, "11 acked before 10: not visible yet");
        k.ack(a);
        assert_eq!(k.last(), 11);
    }
}
