//! The workload generator (filled in by the foundation issue).
use clap::Args;

#[derive(Args, Debug)]
pub struct LoadArgs {
    /// Workload file (TOML).
    pub workload: std::path::PathBuf,
}

pub fn run(_args: LoadArgs) -> anyhow::Result<i32> {
    anyhow::bail!("load: not built yet")
}
