//! The errors of starting the middleware that a user can cause: a flag's value out of its range,
//! an address that does not parse, the same backend twice, no password, a recovery log that
//! cannot be opened. Each names the offending value and says what was expected; `run` prints
//! them (`tierscope-engine middleware: error: ...`) and exits with status 2.
//!
//! What a user cannot cause directly (a backend that does not answer, a stale backend refused at
//! start, the runtime failing) is reported as it happens, with exit status 1 (`NoBackend`,
//! `anyhow`).
//!
//! Python reads some of these messages (`tests/test_middleware.py`, `tests/test_middleware_rust.py`):
//! "--listen \"nowhere\": expected ADDR:PORT", "--heavy-factor 1: expected > 1". Keep those words.

use std::path::PathBuf;

use super::balance::Policy;
use super::{pylist, split_address, MiddlewareArgs, PASSWORD_ENV};

/// A value the middleware cannot start with.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum ArgError {
    /// `--policy` that names no policy.
    #[error("--policy {0:?}: expected one of lprf, rr, wrr, lrt, aware")]
    Policy(String),
    /// `--heavy-factor` at or below 1 (or NaN): every read would be heavy.
    #[error("--heavy-factor {0}: expected > 1")]
    HeavyFactor(f64),
    /// `--listen` that is not ADDR:PORT.
    #[error("--listen {0:?}: expected ADDR:PORT")]
    Listen(String),
    /// `--pool` 0.
    #[error("--pool {0}: expected >= 1")]
    Pool(usize),
    /// `--series-interval` negative, NaN or infinite.
    #[error("--series-interval {0}: expected >= 0")]
    SeriesInterval(f64),
    /// `--weights` with something that is not a number.
    #[error("--weights {0:?}: expected numbers separated by commas")]
    WeightsNotNumbers(String),
    /// `--weights` of the wrong count, a negative or infinite one, or all zero.
    #[error("--weights {given:?}: expected {backends} weights >= 0, one > 0")]
    Weights { given: String, backends: usize },
    /// A `--backend` that is not HOST:PORT.
    #[error("backend '{0}': expected HOST:PORT")]
    Backend(String),
    /// The same `--backend` twice: one server would get every write twice.
    #[error("backends: the same address is given twice: {}", pylist(.0))]
    DuplicateBackend(Vec<String>),
    /// No password in the environment: the middleware lets no one in without one.
    #[error(
        "no password: set {PASSWORD_ENV} to the backends' password (the middleware asks its clients for the same user and password, and lets no one in without one)"
    )]
    NoPassword,
    /// `--scheduler rows` with what it cannot work with.
    #[error("--scheduler rows: {0}")]
    Scheduler(&'static str),
    /// `--recovery-log` that cannot be opened or is not a recovery log.
    #[error("recovery log {}: {reason}", path.display())]
    RecoveryLog { path: PathBuf, reason: String },
}

/// What the flags say, checked: the policy, where to listen, a weight per backend.
#[derive(Debug, PartialEq)]
pub struct Checked {
    pub policy: Policy,
    pub listen: (String, u16),
    pub weights: Vec<f64>,
}

/// Check the flags that need more than clap's parsing (the backends' addresses are checked by
/// `Manager::new`, the password and the recovery log where they are read).
pub fn check(args: &MiddlewareArgs) -> Result<Checked, ArgError> {
    let policy = Policy::parse(&args.policy).ok_or_else(|| ArgError::Policy(args.policy.clone()))?;
    if args.heavy_factor.is_nan() || args.heavy_factor <= 1.0 {
        return Err(ArgError::HeavyFactor(args.heavy_factor));
    }
    let listen = split_address(&args.listen).ok_or_else(|| ArgError::Listen(args.listen.clone()))?;
    if args.pool < 1 {
        return Err(ArgError::Pool(args.pool));
    }
    if args.series_interval < 0.0 || !args.series_interval.is_finite() {
        return Err(ArgError::SeriesInterval(args.series_interval));
    }
    if args.scheduler == "rows" && args.protocol != "postgres" {
        return Err(ArgError::Scheduler("expected --protocol postgres (the MySQL side keeps the one write lock)"));
    }
    let mut weights = vec![1.0; args.backend.len()];
    if let Some(w) = &args.weights {
        let parsed: Vec<f64> =
            w.split(',').map(|x| x.trim().parse::<f64>()).collect::<Result<_, _>>().map_err(|_| ArgError::WeightsNotNumbers(w.clone()))?;
        if parsed.len() != args.backend.len() || parsed.iter().any(|&x| x < 0.0 || !x.is_finite()) || !parsed.iter().any(|&x| x > 0.0) {
            return Err(ArgError::Weights { given: w.clone(), backends: args.backend.len() });
        }
        weights = parsed;
    }
    Ok(Checked { policy, listen, weights })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::middleware::Manager;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        args: MiddlewareArgs,
    }

    fn args(extra: &[&str]) -> MiddlewareArgs {
        let mut argv = vec!["mw", "--listen", "127.0.0.1:6000", "--backend", "127.0.0.1:5432", "--backend", "127.0.0.1:5433"];
        argv.extend_from_slice(extra);
        Cli::try_parse_from(argv).expect("the flags parse").args
    }

    #[test]
    fn every_case_is_reached_through_the_flags() {
        let cases: &[(&[&str], ArgError)] = &[
            (&["--policy", "fastest"], ArgError::Policy("fastest".into())),
            (&["--heavy-factor", "1"], ArgError::HeavyFactor(1.0)),
            (&["--pool", "0"], ArgError::Pool(0)),
            (&["--series-interval=-1"], ArgError::SeriesInterval(-1.0)),
            (&["--weights", "1,x"], ArgError::WeightsNotNumbers("1,x".into())),
            (&["--weights", "1"], ArgError::Weights { given: "1".into(), backends: 2 }),
            (&["--weights", "0,0"], ArgError::Weights { given: "0,0".into(), backends: 2 }),
            (&["--weights", "1,-1"], ArgError::Weights { given: "1,-1".into(), backends: 2 }),
            (
                &["--scheduler", "rows", "--protocol", "mysql"],
                ArgError::Scheduler("expected --protocol postgres (the MySQL side keeps the one write lock)"),
            ),
        ];
        for (flags, want) in cases {
            assert_eq!(check(&args(flags)).unwrap_err(), *want, "{flags:?}");
        }
        let mut a = args(&[]);
        a.listen = "nowhere".into();
        let e = check(&a).unwrap_err();
        assert_eq!(e.to_string(), "--listen \"nowhere\": expected ADDR:PORT");
        assert_eq!(check(&args(&["--heavy-factor", "1"])).unwrap_err().to_string(), "--heavy-factor 1: expected > 1");
        let ok = check(&args(&["--policy", "wrr", "--weights", "3, 1"])).unwrap();
        assert_eq!(ok, Checked { policy: Policy::Wrr, listen: ("127.0.0.1".into(), 6000), weights: vec![3.0, 1.0] });
        assert!(check(&args(&["--heavy-factor", "NaN"])).is_err());
    }

    #[test]
    fn a_backend_address_and_a_duplicate_are_refused_by_name() {
        let bad = ["db1".to_string()];
        let e = Manager::new(&bad, "u", "pw", "d", 1, Policy::Lprf, false, &[1.0]).err().unwrap();
        assert_eq!(e, ArgError::Backend("db1".into()));
        let twice = ["127.0.0.1:5432".to_string(), "127.0.0.1:5432".to_string()];
        let e = Manager::new(&twice, "u", "pw", "d", 1, Policy::Lprf, false, &[1.0, 1.0]).err().unwrap();
        assert_eq!(e.to_string(), "backends: the same address is given twice: ['127.0.0.1:5432', '127.0.0.1:5432']");
    }
}
