//! `tierscope-engine`: the hot paths of tierscope, in one binary.
//!
//! * `load`  — the workload generator: closed-loop emulated users walking a Markov chain of
//!   pages with think times (RUBBoS / TPC-W), or open-loop Poisson / bursty (MMPP) arrivals.
//!   Writes one row per request (the `client_requests` table) and live progress as JSON lines.
//! * `trace` — the passive network tracer: reads a pcap/pcapng capture and turns every TCP
//!   request/response exchange (HTTP/1.1, PostgreSQL, MySQL/MariaDB) into the `requests` table.
//!
//! * `ycsb`, `tpcc` — database benchmark drivers (YCSB core workloads, TPC-C) that talk to
//!   PostgreSQL or MariaDB directly; summary JSON on stdout, optional per-operation Parquet.
//! * `middleware` — the RAIDb-1 clustering middleware in front of PostgreSQL or MySQL/MariaDB
//!   replicas (reads to one, writes to all).
//!
//! Each is a cargo feature of its own (engine/Cargo.toml), all built by default.
//!
//! The Python package `tierscope` drives them all; users rarely call this binary directly.

use clap::{Parser, Subcommand};

#[cfg(feature = "load")]
mod load;
#[cfg(feature = "middleware")]
mod middleware;
#[cfg(feature = "oltp")]
mod oltp;
#[cfg(feature = "trace")]
mod trace;

#[derive(Parser)]
#[command(name = "tierscope-engine", version, about = "tierscope's native engine (workload generator and passive tracer)")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
#[allow(clippy::large_enum_variant)] // parsed once at start: boxing the big variant would save nothing
enum Command {
    #[cfg(feature = "load")]
    /// Drive an HTTP system with emulated users described by a workload TOML file.
    Load(load::LoadArgs),
    #[cfg(feature = "trace")]
    /// Turn a pcap/pcapng capture into the `requests` table (one row per exchange).
    Trace(trace::TraceArgs),
    #[cfg(feature = "trace")]
    /// Capture live traffic to pcap (AF_PACKET TPACKET_V3, outgoing copies ignored on lo and bridges).
    Capture(trace::capture::CaptureArgs),
    #[cfg(feature = "oltp")]
    /// YCSB core workloads A-F against PostgreSQL or MariaDB (load, run).
    Ycsb(oltp::ycsb::YcsbArgs),
    #[cfg(feature = "oltp")]
    /// TPC-C against PostgreSQL or MariaDB (load, run): tpmC and the 90th-percentile rules.
    Tpcc(oltp::tpcc::TpccArgs),
    #[cfg(feature = "middleware")]
    /// The RAIDb-1 clustering middleware (PostgreSQL or MySQL protocol) on tokio: tierscope's only one.
    Middleware(middleware::MiddlewareArgs),
    /// Print the engine version.
    Version,
}

fn main() {
    let cli = Cli::parse();
    let result = match cli.command {
        #[cfg(feature = "load")]
        Command::Load(args) => load::run(args),
        #[cfg(feature = "trace")]
        Command::Trace(args) => trace::run(args),
        #[cfg(feature = "trace")]
        Command::Capture(args) => trace::capture::run(args),
        #[cfg(feature = "oltp")]
        Command::Ycsb(args) => oltp::ycsb::run(args),
        #[cfg(feature = "oltp")]
        Command::Tpcc(args) => oltp::tpcc::run(args),
        #[cfg(feature = "middleware")]
        Command::Middleware(args) => middleware::run(args),
        Command::Version => {
            println!("tierscope-engine {}", env!("CARGO_PKG_VERSION"));
            Ok(0)
        }
    };
    match result {
        Ok(code) => std::process::exit(code),
        Err(err) => {
            eprintln!("tierscope-engine: error: {err:#}");
            std::process::exit(2);
        }
    }
}
