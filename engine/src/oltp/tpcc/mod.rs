//! TPC-C (v5.11 as BenchBase and DBT-2 implement it) against PostgreSQL or MariaDB.
//!
//! `load` creates the nine tables and the population of clause 4.3 for `--warehouses` W.
//! `run` starts `--terminals` (default 10 per warehouse), each bound to one (warehouse,
//! district) and its own connection. A terminal draws its next transaction from a shuffled
//! deck of 100 cards (45 New-Order, 43 Payment, 4 Order-Status, 4 Delivery, 4 Stock-Level),
//! waits the keying time (18/3/2/2/2 s), runs the transaction, then thinks for an exponential
//! time (mean 12/12/10/5/5 s, truncated at 10× the mean). `--no-waits` drops both waits, as
//! BenchBase does by default; such runs are "TPC-C-like" (tpmC above 12.86 per warehouse).
//!
//! Reported: tpmC (New-Orders completed per minute, the 1 % deliberate rollbacks included), the
//! total transactions per minute, and per type the count, rollbacks, errors, latency percentiles
//! and the 90th-percentile response-time rule (≤ 5 s; Stock-Level ≤ 20 s) as passed / failed.

pub mod load;
pub mod random;
pub mod txn;

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};
use clap::{Args, Subcommand};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use serde_json::json;

use self::random::{Deck, DECK, NEW_ORDER, TXNS};
use super::db::{classify, Conn, Failure};
use super::error::{at_least_one, seconds, within, OltpError};
use super::stats::{self, now_ns, OpRecord, Outcome, Stats};

#[derive(Args, Debug)]
#[command(about = "TPC-C against PostgreSQL or MariaDB/MySQL (load, then run)")]
pub struct TpccArgs {
    #[command(subcommand)]
    pub phase: Phase,
}

#[derive(Subcommand, Debug)]
pub enum Phase {
    /// Drop and create the nine tables and load W warehouses (≈ 100 MB each) plus 100,000 items.
    Load(LoadArgs),
    /// Run the 45/43/4/4/4 mix from terminals; prints a summary JSON on stdout.
    Run(RunArgs),
}

#[derive(Args, Debug)]
pub struct LoadArgs {
    /// libpq string / postgres:// URL, or mysql://user:password@host:port/db.
    #[arg(long)]
    pub dsn: String,
    /// Warehouses (W).
    #[arg(long, default_value_t = 1)]
    pub warehouses: u64,
    /// Loading connections.
    #[arg(long, default_value_t = 2)]
    pub threads: usize,
    /// Rows per INSERT statement.
    #[arg(long, default_value_t = 500)]
    pub batch: usize,
    /// Give up after this many seconds.
    #[arg(long, default_value_t = 3600.0)]
    pub max_seconds: f64,
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
}

#[derive(Args, Debug)]
pub struct RunArgs {
    /// libpq string / postgres:// URL, or mysql://user:password@host:port/db.
    #[arg(long)]
    pub dsn: String,
    /// Warehouses loaded (default: count the warehouse table).
    #[arg(long)]
    pub warehouses: Option<u64>,
    /// Terminals (threads, one connection each); default 10 per warehouse, bound to (w, d).
    #[arg(long)]
    pub terminals: Option<usize>,
    /// Bind terminal i as terminal i + K of one numbering (home warehouse (i+K) mod W + 1, Stock-Level
    /// district (i+K) / W mod 10 + 1): engine processes that share the warehouses give each its own K
    /// (the terminals started before it), so their terminals spread over the home warehouses as
    /// one process's would, instead of all starting at warehouse 1.
    #[arg(long, default_value_t = 0)]
    pub terminal_offset: u64,
    /// No keying and think times (BenchBase's default): terminals run back to back.
    #[arg(long)]
    pub no_waits: bool,
    /// Multiply keying and think times by this factor (1 = the spec's).
    #[arg(long, default_value_t = 1.0)]
    pub wait_scale: f64,
    /// Seconds to run (warm-up included).
    #[arg(long, default_value_t = 60.0)]
    pub duration: f64,
    /// Seconds at the start whose transactions are not counted.
    #[arg(long, default_value_t = 0.0)]
    pub warmup: f64,
    /// Stop after this many transactions in total (warm-up included).
    #[arg(long)]
    pub txns: Option<u64>,
    /// Retries of a transaction that hit a serialization failure or deadlock.
    #[arg(long, default_value_t = 3)]
    pub retries: u32,
    /// Write one row per counted transaction to this Parquet file.
    #[arg(long)]
    pub log: Option<PathBuf>,
    /// Also write the summary JSON to this file.
    #[arg(long)]
    pub summary: Option<PathBuf>,
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
}

/// Keying time (s) and mean think time (s) per transaction type.
pub const KEYING_S: [f64; 5] = [18.0, 3.0, 2.0, 2.0, 2.0];
pub const THINK_MEAN_S: [f64; 5] = [12.0, 12.0, 10.0, 5.0, 5.0];
/// 90th-percentile response-time limits (s).
pub const P90_LIMIT_S: [f64; 5] = [5.0, 5.0, 5.0, 5.0, 20.0];
/// The (warehouse, district) terminal `k` of one numbering is bound to: the warehouses first, then
/// the districts (terminals 0..W-1 take district 1 of each warehouse, the next W district 2, ...).
pub fn terminal(k: u64, warehouses: u64) -> txn::Terminal {
    txn::Terminal { w: (k % warehouses) + 1, d: ((k / warehouses) % 10) + 1, warehouses }
}

/// The most tpmC one warehouse can give with the spec's waits.
pub const MAX_TPMC_PER_WAREHOUSE: f64 = 12.86;

pub fn run(args: TpccArgs) -> Result<i32> {
    match args.phase {
        Phase::Load(a) => {
            a.check()?;
            let t0 = Instant::now();
            let dbms = Conn::connect(&a.dsn)?.dbms();
            let rows = load::load(&a.dsn, a.warehouses, a.threads, a.batch, a.seed, a.max_seconds)?;
            let secs = t0.elapsed().as_secs_f64();
            let total: u64 = rows.iter().map(|r| r.1).sum();
            let out = json!({
                "benchmark": "tpcc", "phase": "load", "dbms": dbms.name(), "warehouses": a.warehouses,
                "rows": rows.iter().map(|(t, n)| (t.clone(), json!(n))).collect::<serde_json::Map<_, _>>(),
                "total_rows": total, "seconds": (secs * 1000.0).round() / 1000.0,
            });
            println!("{out}");
            Ok(0)
        }
        Phase::Run(a) => run_mix(a),
    }
}

impl LoadArgs {
    /// The values a load cannot run with.
    pub fn check(&self) -> Result<(), OltpError> {
        at_least_one("--warehouses", self.warehouses)?;
        at_least_one("--batch", self.batch as u64)?;
        seconds("--max-seconds", self.max_seconds, true)
    }
}

/// The largest `--wait-scale` (a transaction's keying plus think time stays far below the
/// [`MAX_SECONDS`](super::error::MAX_SECONDS) a `Duration` is made of).
pub const MAX_WAIT_SCALE: f64 = 1e6;

impl RunArgs {
    /// The values a run cannot run with (checked before connecting).
    pub fn check(&self) -> Result<(), OltpError> {
        if let Some(w) = self.warehouses {
            at_least_one("--warehouses", w)?;
        }
        if let Some(t) = self.terminals {
            at_least_one("--terminals", t as u64)?;
        }
        seconds("--duration", self.duration, true)?;
        seconds("--warmup", self.warmup, false)?;
        within("--wait-scale", self.wait_scale, 0.0, MAX_WAIT_SCALE, "a factor >= 0 and <= 1e6 (1 = the spec's keying and think times)")
    }
}

/// The nine tables among the database's `present` ones (lower-cased, as [`Conn::tables`] gives
/// them); the error names every one missing.
pub fn check_tables_present(present: &[String]) -> Result<(), OltpError> {
    let missing: Vec<String> = load::TABLES.iter().filter(|t| !present.iter().any(|p| p == *t)).map(|t| t.to_string()).collect();
    if !missing.is_empty() {
        return Err(OltpError::MissingTables { tables: missing });
    }
    Ok(())
}

/// Exponential think time with mean `mean`, truncated at 10× the mean.
fn think<R: Rng>(rng: &mut R, mean: f64) -> f64 {
    let u: f64 = rng.gen::<f64>().max(1e-12);
    (-u.ln() * mean).min(10.0 * mean)
}

/// Sleep `secs` unless the deadline or the stop flag comes first; false when it did.
fn wait(secs: f64, deadline: Instant, stop: &AtomicBool) -> bool {
    let until = Instant::now() + Duration::from_secs_f64(secs.max(0.0));
    loop {
        if stop.load(Ordering::Relaxed) {
            return false;
        }
        let now = Instant::now();
        if now >= deadline {
            return false;
        }
        if now >= until {
            return true;
        }
        std::thread::sleep((until.min(deadline) - now).min(Duration::from_millis(200)));
    }
}

#[derive(Default, Clone, Copy)]
struct Tally {
    new_orders_committed: u64,
    new_orders_rolled_back: u64,
    order_lines: u64,
    remote_order_lines: u64,
    payments_remote: u64,
    by_name: u64,
    delivered: u64,
    skipped_districts: u64,
    retries: u64,
}

impl Tally {
    fn add(&mut self, o: &Tally) {
        self.new_orders_committed += o.new_orders_committed;
        self.new_orders_rolled_back += o.new_orders_rolled_back;
        self.order_lines += o.order_lines;
        self.remote_order_lines += o.remote_order_lines;
        self.payments_remote += o.payments_remote;
        self.by_name += o.by_name;
        self.delivered += o.delivered;
        self.skipped_districts += o.skipped_districts;
        self.retries += o.retries;
    }
}

fn run_mix(a: RunArgs) -> Result<i32> {
    a.check()?;
    let mut conn = Conn::connect(&a.dsn)?;
    let dbms = conn.dbms();
    let present = conn.tables()?;
    check_tables_present(&present)?;
    let warehouses = match a.warehouses {
        Some(w) => w,
        None => conn.simple_rows("SELECT COUNT(*) FROM warehouse")?.first().and_then(|r| r.first()).map(|v| v.i64()).transpose()?.unwrap_or(0) as u64,
    };
    if warehouses == 0 {
        return Err(OltpError::NoWarehouses.into());
    }
    drop(conn);
    let terminals = a.terminals.unwrap_or(warehouses.saturating_mul(10) as usize);
    let waits = !a.no_waits && a.wait_scale > 0.0;
    let stop = Arc::new(AtomicBool::new(false));
    let issued = Arc::new(AtomicU64::new(0));
    let cpu0 = stats::cpu_seconds();
    let t0 = Instant::now();
    let epoch0 = now_ns();
    let warm = t0 + Duration::from_secs_f64(a.warmup.max(0.0));
    let deadline = t0 + Duration::from_secs_f64(a.duration);
    let keep = a.log.is_some();
    let mut handles = Vec::new();
    for i in 0..terminals {
        let term = terminal(i as u64 + a.terminal_offset, warehouses);
        let (stop, issued, dsn) = (stop.clone(), issued.clone(), a.dsn.clone());
        let (txns_bound, retries, seed, scale) = (a.txns, a.retries, a.seed, a.wait_scale);
        handles.push(std::thread::spawn(move || -> Result<(Stats, Tally, Instant)> {
            let mut rng = SmallRng::seed_from_u64(seed.wrapping_mul(104_729).wrapping_add(i as u64 + 1));
            let mut conn = Conn::connect(&dsn)?;
            let st = txn::prepare(&mut conn)?;
            let mut deck = Deck::new(&mut rng);
            let mut stats = Stats::new(&TXNS, keep);
            let mut tally = Tally::default();
            let mut last_end = t0;
            let mut consecutive_errors = 0u32;
            loop {
                if stop.load(Ordering::Relaxed) || Instant::now() >= deadline {
                    break;
                }
                if let Some(n) = txns_bound {
                    if issued.fetch_add(1, Ordering::Relaxed) >= n {
                        break;
                    }
                }
                let kind = deck.draw(&mut rng);
                if waits && !wait(KEYING_S[kind] * scale, deadline, &stop) {
                    break;
                }
                let start = Instant::now();
                let mut attempt = 0;
                let result = loop {
                    let r = txn::run(kind, &mut conn, &st, &mut rng, &term);
                    match &r {
                        Err(e) if attempt < retries && classify(e) == Failure::Conflict => {
                            attempt += 1;
                            tally.retries += 1;
                        }
                        _ => break r,
                    }
                };
                let end = Instant::now();
                last_end = end;
                let outcome = match &result {
                    Ok(fx) if fx.rolled_back => Outcome::Rollback,
                    Ok(_) => Outcome::Ok,
                    Err(_) => Outcome::Error,
                };
                match &result {
                    Err(e) => {
                        stats.note_error(kind, || format!("{e:#}"));
                        consecutive_errors += 1;
                        if consecutive_errors >= 100 || conn.is_closed() || classify(e) == Failure::Broken {
                            stop.store(true, Ordering::Relaxed);
                            return Err(anyhow!("terminal {i}: {e:#}"));
                        }
                    }
                    Ok(_) => consecutive_errors = 0,
                }
                if start >= warm {
                    stats.record(kind, end.duration_since(start).as_micros() as u64, outcome);
                    if let Some(recs) = stats.records.as_mut() {
                        let ns = |x: Instant| epoch0 + x.duration_since(t0).as_nanos() as i64;
                        recs.push(OpRecord {
                            thread: i as u32,
                            op: kind as u8,
                            intended_ns: ns(start),
                            start_ns: ns(start),
                            end_ns: ns(end),
                            outcome,
                        });
                    }
                    if let Ok(fx) = &result {
                        if kind == NEW_ORDER {
                            if fx.rolled_back {
                                tally.new_orders_rolled_back += 1;
                            } else {
                                tally.new_orders_committed += 1;
                                tally.order_lines += fx.lines;
                                tally.remote_order_lines += fx.remote_lines;
                            }
                        }
                        tally.payments_remote += fx.remote_payment as u64;
                        tally.by_name += fx.by_name as u64;
                        tally.delivered += fx.delivered;
                        tally.skipped_districts += fx.skipped_districts;
                    }
                }
                if waits && !wait(think(&mut rng, THINK_MEAN_S[kind]) * scale, deadline, &stop) {
                    break;
                }
            }
            Ok((stats, tally, last_end))
        }));
    }
    let mut total = Stats::new(&TXNS, keep);
    let mut tally = Tally::default();
    let mut end = t0;
    let mut failures = Vec::new();
    for h in handles {
        match h.join().map_err(|_| anyhow!("a terminal thread panicked"))? {
            Ok((s, t, e)) => {
                total.merge(s);
                tally.add(&t);
                end = end.max(e);
            }
            Err(e) => failures.push(format!("{e:#}")),
        }
    }
    if !failures.is_empty() && total.total_ok() == 0 {
        bail!("every terminal failed: {}", failures.join("; "));
    }
    let cpu1 = stats::cpu_seconds();
    // with waits the run lasts until the deadline, whatever the last transaction's end
    let until = if waits { deadline.min(Instant::now()).max(end) } else { end };
    let measured = until.saturating_duration_since(warm).as_secs_f64();
    let minutes = measured / 60.0;
    let done = total.total_ok();
    let tpmc = if minutes > 0.0 { total.count[NEW_ORDER] as f64 / minutes } else { 0.0 };
    let mut per = total.per_op_json();
    let mut all_passed = true;
    for (k, name) in TXNS.iter().enumerate() {
        if let Some(o) = per.get_mut(*name) {
            let p90_s = total.percentile_us(k, 90.0) as f64 / 1e6;
            let passed = total.count[k] > 0 && p90_s <= P90_LIMIT_S[k];
            all_passed &= passed;
            o["p90_limit_s"] = json!(P90_LIMIT_S[k]);
            o["p90_rule"] = json!(if passed { "passed" } else { "failed" });
            o["share_pct"] = json!(if done > 0 { (total.count[k] as f64 / done as f64 * 10000.0).round() / 100.0 } else { 0.0 });
        }
    }
    let cpu = (cpu1.0 - cpu0.0) + (cpu1.1 - cpu0.1);
    let tpcc_like = !waits || a.wait_scale < 1.0 || tpmc > MAX_TPMC_PER_WAREHOUSE * warehouses as f64;
    let mut out = json!({
        "benchmark": "tpcc",
        "phase": "run",
        "dbms": dbms.name(),
        "warehouses": warehouses,
        "terminals": terminals,
        "terminal_offset": a.terminal_offset,
        "waits": waits,
        "wait_scale": if waits { a.wait_scale } else { 0.0 },
        "deck": DECK,
        "delivery": "direct",
        "warmup_s": a.warmup,
        "seconds": (measured * 1000.0).round() / 1000.0,
        "tpmC": (tpmc * 10.0).round() / 10.0,
        "tpm_total": if minutes > 0.0 { (done as f64 / minutes * 10.0).round() / 10.0 } else { 0.0 },
        "tpcc_like": tpcc_like,
        "max_tpmC_with_spec_waits": MAX_TPMC_PER_WAREHOUSE * warehouses as f64,
        "transactions_done": done,
        "errors": total.total_errors(),
        "retries": tally.retries,
        "transactions": per,
        "p90_rules_passed": all_passed,
        "new_orders": {
            "committed": tally.new_orders_committed,
            "rolled_back": tally.new_orders_rolled_back,
            "order_lines": tally.order_lines,
            "remote_order_lines": tally.remote_order_lines,
        },
        "payments_remote": tally.payments_remote,
        "customer_by_name": tally.by_name,
        "delivered_orders": tally.delivered,
        "delivery_skipped_districts": tally.skipped_districts,
        "cpu_s": (cpu * 1000.0).round() / 1000.0,
        "txns_per_cpu_s": if cpu > 0.0 { (done as f64 / cpu).round() } else { 0.0 },
    });
    if !failures.is_empty() {
        out["terminal_failures"] = json!(failures);
    }
    if let (Some(path), Some(recs)) = (a.log.as_ref(), total.records.as_mut()) {
        let n = stats::write_ops(path, &TXNS, recs, false, "tierscope-engine tpcc")?;
        out["log"] = json!({"path": path.display().to_string(), "rows": n});
    }
    let text = out.to_string();
    if let Some(path) = a.summary.as_ref() {
        std::fs::write(path, format!("{text}\n")).with_context(|| format!("--summary {}", path.display()))?;
    }
    println!("{text}");
    Ok(if failures.is_empty() { 0 } else { 1 })
}

#[cfg(test)]
mod tests {
    use super::*;

    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(subcommand)]
        phase: Phase,
    }

    fn check(phase: &str, extra: &[&str]) -> Result<(), OltpError> {
        let mut argv = vec!["tpcc", phase, "--dsn", "host=127.0.0.1 user=x dbname=x"];
        argv.extend_from_slice(extra);
        match Cli::try_parse_from(argv).expect("parses").phase {
            Phase::Load(a) => a.check(),
            Phase::Run(a) => a.check(),
        }
    }

    #[test]
    fn bad_values_are_refused() {
        check("run", &[]).unwrap();
        check("load", &[]).unwrap();
        check("run", &["--no-waits", "--wait-scale", "0", "--terminals", "3", "--warehouses", "2"]).unwrap();
        for (phase, opt) in [("load", "--warehouses"), ("load", "--batch"), ("run", "--warehouses"), ("run", "--terminals")] {
            let e = check(phase, &[opt, "0"]).unwrap_err();
            assert!(matches!(e, OltpError::TooFew { option, value: 0 } if option == opt), "{opt}: {e:?}");
            assert_eq!(e.to_string(), format!("{opt} must be at least 1, got 0"));
        }
        let e = check("run", &["--duration=-3"]).unwrap_err();
        assert!(matches!(e, OltpError::OutOfRange { option: "--duration", value, .. } if value == -3.0), "{e:?}");
        assert_eq!(e.to_string(), "--duration must be a number of seconds > 0 and <= 1e9 (every run is bounded in time), got -3");
        let e = check("run", &["--wait-scale", "inf"]).unwrap_err();
        assert!(matches!(e, OltpError::OutOfRange { option: "--wait-scale", .. }), "{e:?}");
        assert_eq!(e.to_string(), "--wait-scale must be a factor >= 0 and <= 1e6 (1 = the spec's keying and think times), got inf");
        let e = check("load", &["--max-seconds", "0"]).unwrap_err();
        assert!(matches!(e, OltpError::OutOfRange { option: "--max-seconds", .. }), "{e:?}");
    }

    #[test]
    fn missing_tables_are_all_named() {
        let all: Vec<String> = load::TABLES.iter().map(|t| t.to_string()).collect();
        check_tables_present(&all).unwrap();
        let e = check_tables_present(&["warehouse".to_string(), "item".to_string()]).unwrap_err();
        assert!(
            matches!(&e, OltpError::MissingTables { tables } if tables == &["district", "customer", "history", "orders", "new_order", "order_line", "stock"]),
            "{e:?}"
        );
        // tests/test_oltp.py reads the list between "missing:" and "("
        assert_eq!(
            e.to_string(),
            "TPC-C tables missing: district, customer, history, orders, new_order, order_line, stock (load them with `tierscope-engine tpcc load --dsn ...`)"
        );
        assert_eq!(OltpError::NoWarehouses.to_string(), "the warehouse table is empty: load it with `tierscope-engine tpcc load`");
    }

    #[test]
    fn think_time_mean_and_truncation() {
        let mut rng = SmallRng::seed_from_u64(3);
        let n = 200_000;
        let xs: Vec<f64> = (0..n).map(|_| think(&mut rng, 12.0)).collect();
        assert!(xs.iter().all(|x| *x >= 0.0 && *x <= 120.0));
        let mean = xs.iter().sum::<f64>() / n as f64;
        // truncation at 10× removes e^-10 of the mass: the mean stays 12 s within sampling error
        assert!((mean - 12.0).abs() < 0.15, "{mean}");
    }

    #[test]
    fn spec_waits_give_at_most_12_86_tpmc_per_warehouse() {
        // cycle = Σ share × (keying + think); 10 terminals; New-Orders are 45 % of transactions
        let cycle: f64 = (0..5).map(|k| DECK[k] as f64 / 100.0 * (KEYING_S[k] + THINK_MEAN_S[k])).sum();
        let tpmc = 10.0 * 60.0 / cycle * 0.45;
        assert!((tpmc - MAX_TPMC_PER_WAREHOUSE).abs() < 0.01, "{tpmc}");
    }

    #[test]
    fn processes_with_offsets_take_disjoint_terminals() {
        // 3 processes x 6 terminals over 2 warehouses (20 districts), each offset by the terminals
        // before it: 18 distinct (w, d) pairs, as one process of 18 terminals would bind them
        let (w, per) = (2, 6u64);
        let mut pairs: Vec<(u64, u64)> = (0..3u64).flat_map(|p| (0..per).map(move |i| terminal(i + p * per, w))).map(|t| (t.w, t.d)).collect();
        let one: Vec<(u64, u64)> = (0..3 * per).map(|k| terminal(k, w)).map(|t| (t.w, t.d)).collect();
        assert_eq!(pairs, one);
        pairs.sort();
        pairs.dedup();
        assert_eq!(pairs.len(), 18);
        assert!(pairs.iter().all(|&(pw, pd)| (1..=2).contains(&pw) && (1..=10).contains(&pd)));
        // without offsets the processes would share (1, 1)..: the first terminal of each is the same
        assert_eq!((terminal(0, w).w, terminal(0, w).d), (1, 1));
        assert_eq!((terminal(per + 1, w).w, terminal(per + 1, w).d), (2, 4));
    }
}
