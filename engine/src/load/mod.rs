//! The workload generator: closed-loop emulated users walking a Markov chain of pages with think
//! times (RUBBoS / TPC-W), or open-loop Poisson / bursty (MMPP) arrivals; one Parquet row per
//! request and live progress as JSON lines. The file format is docs/workload.md.

use std::path::PathBuf;

use anyhow::Result;
use clap::Args;

pub mod arrivals;
pub mod driver;
pub mod embedded;
mod error;
pub use error::LoadArgError;
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
    /// Override [workload] session_min_mean_s, e.g. 20s, 15m: the mean of a user session's
    /// minimum duration (TPC-W clause 6.1.9.2; its truncation session_min_max_s becomes 4x it, as
    /// 15 and 60 minutes there). Shorter: users change sessions (and customers) within a run.
    #[arg(long)]
    pub session_min: Option<String>,
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
pub fn parse_duration(s: &str, option: &'static str) -> Result<f64, LoadArgError> {
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
        _ => Err(LoadArgError::Duration { option, value: s.to_string() }),
    }
}

/// `value` within [lo, hi] (NaN never is).
fn within(option: &'static str, value: f64, lo: f64, hi: f64, expected: &'static str) -> Result<f64, LoadArgError> {
    if (lo..=hi).contains(&value) {
        Ok(value)
    } else {
        Err(LoadArgError::OutOfRange { option, value, expected })
    }
}

/// The longest time an option may give, in seconds (≈ 31 years: beyond any use, and well below
/// what `Duration` can hold).
const MAX_SECONDS: f64 = 1e9;

/// The command line's overrides of the workload file `wl`, checked.
pub fn apply(args: &LoadArgs, wl: &mut workload::Workload) -> Result<(), LoadArgError> {
    if let Some(n) = args.users {
        if wl.arrivals.is_some() {
            return Err(LoadArgError::UsersForOpenLoop { workload: args.workload.clone() });
        }
        wl.users = n;
    }
    if let Some(r) = args.rate {
        let r = within("--rate", r, 0.0, 1e9, "a rate of arrivals per second >= 0 and <= 1e9")?;
        match wl.arrivals.as_mut() {
            Some(a) => a.rate_per_s = r,
            None => return Err(LoadArgError::RateForClosedLoop { workload: args.workload.clone() }),
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
        wl.think_mean_s = within("--think", z, 0.0, MAX_SECONDS, "a mean think time in seconds >= 0 and <= 1e9")?;
    }
    if let Some(i) = args.think_dispersion {
        wl.think_dispersion = within("--think-dispersion", i, 1.0, 1e9, "a dispersion >= 1 and <= 1e9")?;
    }
    if let Some(d) = &args.session_min {
        let m = parse_duration(d, "--session-min")?;
        wl.session_min_mean_s = within("--session-min", m, 0.0, MAX_SECONDS / 4.0, "a mean of at most 2.5e8 seconds")?;
        wl.session_min_max_s = 4.0 * wl.session_min_mean_s;
    }
    if let Some(p) = &args.policy {
        wl.policy = match p.as_str() {
            "per-user" => workload::Policy::PerUser,
            "per-request" => workload::Policy::PerRequest,
            "pool" => workload::Policy::Pool,
            _ => return Err(LoadArgError::Policy { value: p.clone() }),
        };
    }
    if let Some(n) = args.pool_size {
        if n == 0 {
            return Err(LoadArgError::OutOfRange { option: "--pool-size", value: 0.0, expected: "at least 1" });
        }
        wl.pool_size = n;
    }
    // timeouts: 0 (or less) means the shortest, 1 ms, as before; NaN and huge values are refused
    if let Some(t) = args.connect_timeout {
        wl.connect_timeout_s = within("--connect-timeout", t, f64::MIN, MAX_SECONDS, "a number of seconds <= 1e9")?.max(0.001);
    }
    if let Some(t) = args.request_timeout {
        wl.request_timeout_s = within("--request-timeout", t, f64::MIN, MAX_SECONDS, "a number of seconds <= 1e9")?.max(0.001);
    }
    if let Some(n) = args.embedded_connections {
        if !(1..=workload::MAX_EMBEDDED).contains(&n) {
            return Err(LoadArgError::OutOfRange { option: "--embedded-connections", value: n as f64, expected: EMBEDDED_RANGE });
        }
        match wl.embedded.as_mut() {
            Some(e) => e.connections = n,
            None => return Err(LoadArgError::NoEmbedded { workload: args.workload.clone() }),
        }
    }
    if args.no_embedded {
        wl.embedded = None;
    }
    Ok(())
}

/// What `--embedded-connections` takes (`workload::MAX_EMBEDDED` is 64).
const EMBEDDED_RANGE: &str = "in [1, 64]";
const _: () = assert!(workload::MAX_EMBEDDED == 64, "EMBEDDED_RANGE says 64");

pub fn run(args: LoadArgs) -> Result<i32> {
    let mut wl = workload::load(&args.workload)?;
    apply(&args, &mut wl)?;
    if let Some(n) = args.dry_run {
        println!("{}", driver::simulate(&wl, n, args.seed));
        return Ok(0);
    }
    let Some(target) = &args.target else { return Err(LoadArgError::NoTarget.into()) };
    let target = http::Target::parse(target)?;
    driver::run(wl, target, args.log.as_deref(), args.seed, args.quiet)
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use clap::Parser;

    use super::*;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        args: LoadArgs,
    }

    const CLOSED: &str = "[workload]\nstart = \"A\"\n[[pages]]\nname = \"A\"\nurl = \"/a\"\n";

    /// `load wl.toml ARGS...` applied to a closed-loop workload, or an open-loop one with `open`.
    fn apply_to(open: bool, argv: &[&str]) -> Result<workload::Workload, LoadArgError> {
        let text = if open { format!("{CLOSED}[arrivals]\nrate_per_s = 10.0\n") } else { CLOSED.to_string() };
        let mut wl = workload::parse(&text, Path::new("wl.toml")).expect("a valid workload");
        let args = Cli::try_parse_from([&["load", "wl.toml"], argv].concat()).expect("parses").args;
        apply(&args, &mut wl)?;
        Ok(wl)
    }

    fn out_of_range(e: &LoadArgError) -> (&'static str, f64) {
        match e {
            LoadArgError::OutOfRange { option, value, .. } => (option, *value),
            other => panic!("not OutOfRange: {other:?}"),
        }
    }

    #[test]
    fn good_overrides_change_the_workload() {
        let wl = apply_to(false, &["--users", "7", "--duration", "2m", "--ramp-up", "250ms", "--think", "0", "--policy", "pool", "--pool-size", "3"])
            .unwrap();
        assert_eq!((wl.users, wl.run_s, wl.ramp_up_s, wl.think_mean_s, wl.pool_size), (7, 120.0, 0.25, 0.0, 3));
        assert!(matches!(wl.policy, workload::Policy::Pool));
        let wl = apply_to(true, &["--rate", "0", "--connect-timeout", "0", "--request-timeout=-5"]).unwrap();
        assert_eq!(wl.arrivals.as_ref().unwrap().rate_per_s, 0.0);
        assert_eq!((wl.connect_timeout_s, wl.request_timeout_s), (0.001, 0.001), "0 and less: the shortest, 1 ms");
    }

    #[test]
    fn durations_that_are_not_durations_are_refused() {
        for (opt, bad) in [("--duration", "5x"), ("--ramp-up", "-1s"), ("--ramp-down", "inf"), ("--duration", "NaN")] {
            let e = apply_to(false, &[&format!("{opt}={bad}")]).unwrap_err();
            assert!(matches!(&e, LoadArgError::Duration { option, value } if *option == opt && value == bad), "{e:?}");
            assert_eq!(e.to_string(), format!("{opt} {bad:?}: expected a duration like 30, 30s, 5m, 1h or 250ms"));
        }
    }

    #[test]
    fn numbers_out_of_range_are_refused() {
        for (open, opt, bad) in [
            (true, "--rate", "-1"),
            (true, "--rate", "NaN"),
            (true, "--rate", "inf"),
            (false, "--think", "-0.5"),
            (false, "--think", "inf"),
            (false, "--think-dispersion", "0.5"),
            (false, "--think-dispersion", "NaN"),
            (false, "--pool-size", "0"),
            (false, "--connect-timeout", "inf"),
            (false, "--request-timeout", "NaN"),
            (false, "--embedded-connections", "65"),
            (false, "--embedded-connections", "0"),
        ] {
            let e = apply_to(open, &[&format!("{opt}={bad}")]).unwrap_err();
            let (option, value) = out_of_range(&e);
            assert_eq!(option, opt, "{e:?}");
            let want: f64 = bad.parse().unwrap();
            assert!(value == want || (value.is_nan() && want.is_nan()), "{opt}={bad}: {e:?}");
            assert!(e.to_string().starts_with(&format!("{opt} must be ")), "{e}");
        }
        assert_eq!(
            apply_to(false, &["--think=-0.5"]).unwrap_err().to_string(),
            "--think must be a mean think time in seconds >= 0 and <= 1e9, got -0.5"
        );
        assert_eq!(apply_to(false, &["--embedded-connections", "65"]).unwrap_err().to_string(), "--embedded-connections must be in [1, 64], got 65");
        assert_eq!(apply_to(false, &["--pool-size", "0"]).unwrap_err().to_string(), "--pool-size must be at least 1, got 0");
    }

    #[test]
    fn overrides_the_workload_cannot_take_are_refused() {
        let e = apply_to(true, &["--users", "5"]).unwrap_err();
        assert!(matches!(&e, LoadArgError::UsersForOpenLoop { workload } if workload == Path::new("wl.toml")), "{e:?}");
        assert_eq!(e.to_string(), "--users: wl.toml is an open-loop workload ([arrivals]); use --rate");
        let e = apply_to(false, &["--rate", "5"]).unwrap_err();
        assert!(matches!(e, LoadArgError::RateForClosedLoop { .. }), "{e:?}");
        assert_eq!(e.to_string(), "--rate: wl.toml is a closed-loop workload ([users]); use --users");
        let e = apply_to(false, &["--embedded-connections", "4"]).unwrap_err();
        assert!(matches!(e, LoadArgError::NoEmbedded { .. }), "{e:?}");
        assert_eq!(e.to_string(), "--embedded-connections: wl.toml fetches no embedded objects (no [embedded] section)");
        let e = apply_to(false, &["--policy", "per-page"]).unwrap_err();
        assert!(matches!(&e, LoadArgError::Policy { value } if value == "per-page"), "{e:?}");
        assert_eq!(e.to_string(), "--policy \"per-page\": expected per-user, per-request or pool");
    }

    #[test]
    fn a_run_needs_a_target_it_can_reach() {
        let dir = std::env::temp_dir().join(format!("tierscope-loadargs-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let wl = dir.join("wl.toml");
        std::fs::write(&wl, CLOSED).unwrap();
        let args = Cli::try_parse_from(["load", wl.to_str().unwrap(), "--duration", "1"]).unwrap().args;
        let e = run(args).unwrap_err();
        assert!(matches!(e.downcast_ref::<LoadArgError>(), Some(LoadArgError::NoTarget)), "{e:?}");
        assert_eq!(e.to_string(), "--target URL is required (or --dry-run N)");
        std::fs::remove_dir_all(&dir).unwrap();

        for (url, https) in [("https://example.com/", true), ("ftp://x", false), ("127.0.0.1:8080", false)] {
            let e = http::Target::parse(url).unwrap_err();
            assert!(matches!(&e, LoadArgError::TargetUrl { url: u, https: h } if u == url && *h == https), "{e:?}");
        }
        assert_eq!(http::Target::parse("https://x").unwrap_err().to_string(), "--target https://x: https is not supported (plain http only)");
        assert_eq!(http::Target::parse("ftp://x").unwrap_err().to_string(), "--target ftp://x: expected http://HOST:PORT[/PREFIX]");
        let e = http::Target::parse("http:///rubbos").unwrap_err();
        assert!(matches!(&e, LoadArgError::NoHost { url } if url == "http:///rubbos"), "{e:?}");
        assert_eq!(e.to_string(), "--target http:///rubbos: no host");
        // a port out of range (refused before any DNS query: the tests stay on loopback)
        for (url, host_port) in [("http://127.0.0.1:99999", "127.0.0.1:99999"), ("http://localhost:70000/x", "localhost:70000")] {
            let e = http::Target::parse(url).unwrap_err();
            assert!(matches!(&e, LoadArgError::Unresolved { url: u, host_port: h, .. } if u == url && h == host_port), "{e:?}");
            assert!(e.to_string().starts_with(&format!("--target {url}: cannot resolve {host_port}: ")), "{e}");
        }
        assert_eq!(http::Target::parse("http://127.0.0.1:8080/app/").unwrap().prefix, "/app");
    }
}
