//! The passive network tracer: a capture file in, the `requests` table out.
//!
//! The model (after SysViz, seed 001): one capture point sees the traffic of every tier with one
//! clock. Each TCP connection is reassembled (`tcp`), its protocol recognised and parsed (`http`,
//! `postgres`, `mysql`), and every request/response exchange becomes one row: arrival = capture
//! time of the packet with the request's first byte, departure = capture time of the packet with
//! the response's last byte. Rows whose times or pairing had to be inferred say so (`inferred`,
//! `flags`).
//!
//! The pipeline is streaming and single-threaded: `pcap` hands out packets from one large buffer,
//! `net` decodes headers in place, pure ACKs are dropped before any table lookup, and `output`
//! writes Parquet row groups as rows accumulate. Memory grows with the open connections only.

use std::io::Read;
use std::path::PathBuf;
use std::time::Instant;

use clap::Args;

pub mod capture;
mod exchange;
mod framer;
mod hash;
mod http;
mod label;
mod mysql;
mod net;
mod output;
mod pcap;
mod postgres;
mod pqwrite;
mod servermap;
mod tcp;

#[cfg(test)]
mod tests;

/// Fuzzing entry points (used by engine/fuzz and the stable-toolchain fuzz test).
#[allow(dead_code)] // the binary itself calls none of them
pub mod fuzzing;

#[derive(Args, Debug)]
#[command(
    after_help = "Exit status: 0 traced (a file cut short at the end is a warning), 2 not readable at all, 3 damaged part way (a corrupt record or block, a read error): the rows before the damage are written.\n\nExample: tierscope-engine trace capture.pcap -o requests.parquet --server-map servers.txt --stats"
)]
pub struct TraceArgs {
    /// Capture file written by tcpdump (pcap or pcapng); `-` reads standard input.
    pub capture: PathBuf,
    /// Where to write the requests table (Parquet).
    #[arg(short = 'o', long = "output")]
    pub output: PathBuf,
    /// Server map: lines of `address:port tier server [http|postgres|mysql]` (`*` = any address).
    #[arg(long = "server-map")]
    pub server_map: Option<PathBuf>,
    /// Print counts of everything read, skipped and inferred as one JSON object on standard output.
    #[arg(long)]
    pub stats: bool,
}

#[derive(Default, Debug)]
struct Skipped {
    link_type: u64,
    not_ip: u64,
    not_tcp: u64,
    fragments: u64,
    malformed: u64,
    last_link_type: u32,
}

pub fn run(args: TraceArgs) -> anyhow::Result<i32> {
    let map = match &args.server_map {
        Some(p) => {
            let text = std::fs::read_to_string(p).map_err(|e| anyhow::anyhow!("server map {}: {e}", p.display()))?;
            servermap::ServerMap::parse(&text, &p.display().to_string())?
        }
        None => servermap::ServerMap::default(),
    };
    let name = args.capture.display().to_string();
    let src: Box<dyn Read> = if name == "-" {
        Box::new(std::io::stdin().lock())
    } else {
        Box::new(std::fs::File::open(&args.capture).map_err(|error| pcap::CaptureError::Open { name: name.clone(), error })?)
    };
    let reader = pcap::CaptureReader::new(src, &name)?;
    let sink = output::ParquetSink::create(&args.output)?;
    let t0 = Instant::now();
    let summary = trace(reader, map, sink)?;
    let secs = t0.elapsed().as_secs_f64();
    report(&summary, secs, &args);
    // Damage inside the capture (not a file merely cut short) fails the run once the packets
    // before it are traced and written: status 3, partial output.
    Ok(if summary.damaged { EXIT_DAMAGED } else { 0 })
}

/// Exit status when the capture is damaged part way: the rows before the damage are written.
pub const EXIT_DAMAGED: i32 = 3;

pub struct Summary {
    reader: pcap::ReaderStats,
    stop_reason: Option<String>,
    damaged: bool,
    ts_precision_ns: u64,
    skipped: Skipped,
    tcp: tcp::TcpStats,
    proto: exchange::ProtoCounters,
    rows: u64,
    peak_open_connections: usize,
}

fn trace<R: Read>(mut reader: pcap::CaptureReader<R>, map: servermap::ServerMap, sink: output::ParquetSink) -> anyhow::Result<Summary> {
    let mut tracer = tcp::Tracer::new(map, sink);
    let mut sk = Skipped::default();
    let mut peak = 0usize;
    let mut n: u64 = 0;
    while let Some(p) = reader.next_packet() {
        match net::decode(p.linktype, p.data, p.orig_len) {
            Ok(seg) => tracer.segment(p.ts_ns, &seg)?,
            Err(k) => match k {
                net::Skip::LinkType => {
                    sk.link_type += 1;
                    sk.last_link_type = p.linktype;
                }
                net::Skip::NotIp => sk.not_ip += 1,
                net::Skip::NotTcp => sk.not_tcp += 1,
                net::Skip::Fragment => sk.fragments += 1,
                net::Skip::Malformed => sk.malformed += 1,
            },
        }
        n += 1;
        if n & 0xffff == 0 {
            peak = peak.max(tracer.open_connections());
        }
    }
    peak = peak.max(tracer.open_connections());
    tracer.finish()?;
    let tcp_stats = tracer.stats.clone();
    let proto = tracer.counters.clone();
    let rows = tracer.sink.close()?;
    Ok(Summary {
        reader: reader.stats.clone(),
        stop_reason: reader.stop_reason.clone(),
        damaged: reader.damaged,
        ts_precision_ns: reader.ts_precision_ns,
        skipped: sk,
        tcp: tcp_stats,
        proto,
        rows,
        peak_open_connections: peak,
    })
}

fn report(s: &Summary, secs: f64, args: &TraceArgs) {
    let pps = s.reader.packets as f64 / secs.max(1e-9);
    let t = &s.tcp;
    let k = &s.skipped;
    eprintln!(
        "trace: {} packets -> {} exchanges (http {}, postgres {}, mysql {}) on {} connections in {:.2} s ({:.0} packets/s) -> {}",
        s.reader.packets,
        s.rows,
        t.exchanges_http,
        t.exchanges_postgres,
        t.exchanges_mysql,
        t.connections,
        secs,
        pps,
        args.output.display()
    );
    let skipped = k.link_type + k.not_ip + k.not_tcp + k.fragments + k.malformed;
    if skipped > 0 {
        eprintln!(
            "trace: skipped {} packets: {} not IP, {} not TCP, {} IP fragments, {} malformed/cut headers, {} of unsupported link type{}",
            skipped,
            k.not_ip,
            k.not_tcp,
            k.fragments,
            k.malformed,
            k.link_type,
            if k.link_type > 0 { format!(" (last: {})", k.last_link_type) } else { String::new() }
        );
    }
    if t.connections_mid_stream + t.connections_unrecognised + s.proto.tls_connections > 0 {
        eprintln!(
            "trace: {} connections started before the capture, {} not recognised (no HTTP/PostgreSQL/MySQL), {} TLS (not decoded)",
            t.connections_mid_stream, t.connections_unrecognised, s.proto.tls_connections
        );
    }
    if t.exchanges_inferred + t.exchanges_truncated > 0 {
        eprintln!(
            "trace: {} exchanges inferred ({} without a response), {} with payload cut by the snapshot length",
            t.exchanges_inferred, t.exchanges_no_response, t.exchanges_truncated
        );
    }
    if let Some(w) = &s.stop_reason {
        if s.damaged {
            eprintln!(
                "trace: error: damaged capture: {w}; kept the {} packets read before it ({} exchanges written to {})",
                s.reader.packets,
                s.rows,
                args.output.display()
            );
        } else {
            eprintln!("trace: warning: {w}");
        }
    }
    if s.reader.packets > 0 && k.link_type == s.reader.packets {
        eprintln!("trace: warning: no packet had a supported link type (Ethernet, Linux cooked SLL/SLL2, raw IP, loopback)");
    }
    if args.stats {
        let j = serde_json::json!({
            "capture": args.capture.display().to_string(),
            "output": args.output.display().to_string(),
            "seconds": secs,
            "packets_per_s": pps,
            "packets": s.reader.packets,
            "bytes": s.reader.bytes,
            "timestamp_precision_ns": s.ts_precision_ns,
            "stopped_early": s.stop_reason,
            "damaged": s.damaged,
            "skipped_blocks": s.reader.skipped_blocks,
            "skipped": {
                "unsupported_link_type": k.link_type,
                "not_ip": k.not_ip,
                "not_tcp": k.not_tcp,
                "ip_fragments": k.fragments,
                "malformed": k.malformed,
                "unknown_interface": s.reader.unknown_interface,
                "bad_record_lengths": s.reader.bad_lengths,
            },
            "tcp": {
                "pure_acks": t.pure_acks,
                "data_segments": t.data_segments,
                "retransmitted_segments": t.retransmitted_segments,
                "out_of_order_segments": t.out_of_order_segments,
                "gaps": t.gaps,
                "gap_bytes": t.gap_bytes,
                "snaplen_cut_segments": t.snaplen_cut_segments,
                "snaplen_cut_bytes": t.snaplen_cut_bytes,
            },
            "connections": {
                "total": t.connections,
                "peak_open": s.peak_open_connections,
                "mid_stream": t.connections_mid_stream,
                "role_guessed": t.connections_role_guessed,
                "unrecognised": t.connections_unrecognised,
                "tls": s.proto.tls_connections,
                "http": t.connections_http,
                "postgres": t.connections_postgres,
                "mysql": t.connections_mysql,
                "evicted_idle": t.connections_evicted_idle,
            },
            "exchanges": {
                "total": s.rows,
                "http": t.exchanges_http,
                "postgres": t.exchanges_postgres,
                "mysql": t.exchanges_mysql,
                "inferred": t.exchanges_inferred,
                "no_response": t.exchanges_no_response,
                "truncated": t.exchanges_truncated,
                "pipelined": s.proto.pipelined,
            },
            "parsers": {
                "responses_without_request": s.proto.responses_without_request,
                "framing_lost": s.proto.framing_lost,
                "resynced": s.proto.resynced,
                "unparsed_bytes": s.proto.unparsed_bytes,
                "no_response_commands": s.proto.no_response_commands,
            },
        });
        println!("{j}");
    }
}
