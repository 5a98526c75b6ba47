//! What a user can get wrong on `load`'s command line: an override the workload file cannot take
//! (a value out of range, `--users` for an open-loop workload...) or a `--target` that is not a
//! plain-HTTP URL this machine can resolve. Each names the option and says what was expected;
//! the workload file's own errors are [`WorkloadError`](super::workload::WorkloadError) and
//! [`ParamError`](super::params::ParamError).

use std::path::PathBuf;

#[derive(Debug, thiserror::Error)]
pub enum LoadArgError {
    /// `--duration`, `--ramp-up`, `--ramp-down` that is not a duration.
    #[error("{option} {value:?}: expected a duration like 30, 30s, 5m, 1h or 250ms")]
    Duration { option: &'static str, value: String },
    /// A number out of its range (NaN and infinite values included).
    #[error("{option} must be {expected}, got {value}")]
    OutOfRange { option: &'static str, value: f64, expected: &'static str },
    /// `--users` for a workload of arrivals.
    #[error("--users: {} is an open-loop workload ([arrivals]); use --rate", workload.display())]
    UsersForOpenLoop { workload: PathBuf },
    /// `--rate` for a workload of users.
    #[error("--rate: {} is a closed-loop workload ([users]); use --users", workload.display())]
    RateForClosedLoop { workload: PathBuf },
    /// `--embedded-connections` for a workload that fetches no embedded objects.
    #[error("--embedded-connections: {} fetches no embedded objects (no [embedded] section)", workload.display())]
    NoEmbedded { workload: PathBuf },
    /// An unknown connection policy.
    #[error("--policy {value:?}: expected per-user, per-request or pool")]
    Policy { value: String },
    /// A run without `--target` (only `--dry-run` needs none).
    #[error("--target URL is required (or --dry-run N)")]
    NoTarget,
    /// A `--target` that is not `http://HOST[:PORT][/PREFIX]` (`https` said apart).
    #[error("--target {url}: {}", if *https { "https is not supported (plain http only)" } else { "expected http://HOST:PORT[/PREFIX]" })]
    TargetUrl { url: String, https: bool },
    /// `http://` with no host.
    #[error("--target {url}: no host")]
    NoHost { url: String },
    /// A host that does not resolve, or resolves to no address.
    #[error("--target {url}: cannot resolve {host_port}: {reason}")]
    Unresolved { url: String, host_port: String, reason: String },
}
