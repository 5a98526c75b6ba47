//! The workload generator: closed-loop emulated users walking a Markov chain of pages with think
//! times (RUBBoS / TPC-W), or open-loop Poisson / bursty (MMPP) arrivals; one Parquet row per
//! request and live progress as JSON lines. The file format is docs/workload.md.

use std::path::PathBuf;

use anyhow::{bail, Result};
use clap::Args;

pub mod arrivals;
pub mod driver;
pub mod embedded;
pub mod grid;
pub mod http;
pub mod log;
pub mod markov;
pub mod params;
pub mod progress;
pub mod think;
pub mod workload;

/// Wall-clock nanoseconds since the Unix epoch, read from the monotonic clock (no jumps).
pub mod clock {
    use std::sync::OnceLock;
    use std::time::{Instant, SystemTime, UNIX_EPOCH};

    static BASE: OnceLock<(Instant, i64)> = OnceLock::new();

    pub fn base() -> (Instant, i64) {
        *BASE.get_or_init(|| {
            let epoch = SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_nanos() as i64).unwrap_or(0);
            (Instant::now(), epoch)
        })
    }
    #[inline]
    pub fn now_ns() -> i64 {
        let (i, e) = base();
        e + i.elapsed().as_nanos() as i64
    }
}

#[derive(Args, Debug, Clone)]
#[command(
    after_help = "Example: tierscope-engine load examples/static-site.toml --target http://127.0.0.1:8080 --log run.parquet --users 50 --duration 20s"
)]
pub struct LoadArgs {
    /// Workload file (TOML, see docs/workload.md).
    pub workload: PathBuf,
    /// Where to send requests: http://HOST:PORT[/PREFIX].
    #[arg(long)]
    pub target: Option<String>,
    /// Write one row per request (the client_requests table) to this Parquet file.
    #[arg(long)]
    pub log: Option<PathBuf>,
    /// Override [users] count (closed loop).
    #[arg(long)]
    pub users: Option<u32>,
    /// Override [arrivals] rate_per_s (open loop).
    #[arg(long)]
    pub rate: Option<f64>,
    /// Override [phases] run_s, e.g. 60, 20s, 5m.
    #[arg(long)]
    pub duration: Option<String>,
    /// Override [phases] ramp_up_s.
    #[arg(long)]
    pub ramp_up: Option<String>,
    /// Override [phases] ramp_down_s.
    #[arg(long)]
    pub ramp_down: Option<String>,
    /// Override [think] mean_s (seconds; 0 = no think time).
    #[arg(long)]
    pub think: Option<f64>,
    /// Override [think] dispersion (index of dispersion I; 1 = plain exponential).
    #[arg(long)]
    pub think_dispersion: Option<f64>,
    /// Override [connection] policy: per-user, per-request or pool.
    #[arg(long)]
    pub policy: Option<String>,
    /// Override [connection] pool_size.
    #[arg(long)]
    pub pool_size: Option<usize>,
    /// Override [connection] connect_timeout_s.
    #[arg(long)]
    pub connect_timeout: Option<f64>,
    /// Override [connection] request_timeout_s.
    #[arg(long)]
    pub request_timeout: Option<f64>,
    /// Do not fetch embedded objects (ignore the workload's [embedded] section).
    #[arg(long)]
    pub no_embedded: bool,
    /// Override [embedded] connections (parallel connections per user for embedded objects).
    #[arg(long)]
    pub embedded_connections: Option<usize>,
    /// Random seed (runs with the same seed draw the same walks and think times).
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Walk the chain for this many requests without sending anything; print counts as JSON.
    #[arg(long)]
    pub dry_run: Option<u64>,
    /// Only print the final summary (no progress lines).
    #[arg(long)]
    pub quiet: bool,
}

/// "20", "20s", "1.5m", "2h", "250ms" -> seconds.
pub fn parse_duration(s: &str, what: &str) -> Result<f64> {
    let t = s.trim();
    let (num, mult) = if let Some(n) = t.strip_suffix("ms") {
        (n, 0.001)
    } else if let Some(n) = t.strip_suffix('s') {
        (n, 1.0)
    } else if let Some(n) = t.strip_suffix('m') {
        (n, 60.0)
    } else if let Some(n) = t.strip_suffix('h') {
        (n, 3600.0)
    } else {
        (t, 1.0)
    };
    match num.trim().parse::<f64>() {
        Ok(x) if x >= 0.0 && x.is_finite() => Ok(x * mult),
        _ => bail!("{what} {s:?}: expected a duration like 30, 30s, 5m, 1h or 250ms"),
    }
}

pub fn run(args: LoadArgs) -> Result<i32> {
    let mut wl = workload::load(&args.workload)?;
    if let Some(n) = args.users {
        if wl.arrivals.is_some() {
            bail!("--users: {} is an open-loop workload ([arrivals]); use --rate", args.workload.display());
        }
        wl.users = n;
    }
    if let Some(r) = args.rate {
        match wl.arrivals.as_mut() {
            Some(a) if r >= 0.0 => a.rate_per_s = r,
            Some(_) => bail!("--rate must be >= 0"),
            None => bail!("--rate: {} is a closed-loop workload ([users]); use --users", args.workload.display()),
        }
    }
    if let Some(d) = &args.duration {
        wl.run_s = parse_duration(d, "--duration")?;
    }
    if let Some(d) = &args.ramp_up {
        wl.ramp_up_s = parse_duration(d, "--ramp-up")?;
    }
    if let Some(d) = &args.ramp_down {
        wl.ramp_down_s = parse_duration(d, "--ramp-down")?;
    }
    if let Some(z) = args.think {
        if z.is_nan() || z < 0.0 {
            bail!("--think must be >= 0");
        }
        wl.think_mean_s = z;
    }
    if let Some(i) = args.think_dispersion {
        if i.is_nan() || i < 1.0 {
            bail!("--think-dispersion must be >= 1");
        }
        wl.think_dispersion = i;
    }
    if let Some(p) = &args.policy {
        wl.policy = match p.as_str() {
            "per-user" => workload::Policy::PerUser,
            "per-request" => workload::Policy::PerRequest,
            "pool" => workload::Policy::Pool,
            _ => bail!("--policy {p:?}: expected per-user, per-request or pool"),
        };
    }
    if let Some(n) = args.pool_size {
        if n == 0 {
            bail!("--pool-size must be >= 1");
        }
        wl.pool_size = n;
    }
    if let Some(t) = args.connect_timeout {
        wl.connect_timeout_s = t.max(0.001);
    }
    if let Some(t) = args.request_timeout {
        wl.request_timeout_s = t.max(0.001);
    }
    if let Some(n) = args.embedded_connections {
        if !(1..=workload::MAX_EMBEDDED).contains(&n) {
            bail!("--embedded-connections must be in [1, {}]", workload::MAX_EMBEDDED);
        }
        match wl.embedded.as_mut() {
            Some(e) => e.connections = n,
            None => bail!("--embedded-connections: {} fetches no embedded objects (no [embedded] section)", args.workload.display()),
        }
    }
    if args.no_embedded {
        wl.embedded = None;
    }
    if let Some(n) = args.dry_run {
        println!("{}", driver::simulate(&wl, n, args.seed));
        return Ok(0);
    }
    let Some(target) = &args.target else { bail!("--target URL is required (or --dry-run N)") };
    let target = http::Target::parse(target)?;
    driver::run(wl, target, args.log.as_deref(), args.seed, args.quiet)
}
