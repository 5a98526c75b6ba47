//! The passive network tracer (filled in by the tracer issue).
use clap::Args;

#[derive(Args, Debug)]
pub struct TraceArgs {
    /// Capture file (pcap or pcapng).
    pub capture: std::path::PathBuf,
}

pub fn run(_args: TraceArgs) -> anyhow::Result<i32> {
    anyhow::bail!("trace: not built yet")
}
