//! Fuzzing entry points: drive the protocol parsers and the whole capture pipeline with arbitrary
//! bytes. Used by the cargo-fuzz target `parsers` (engine/fuzz) and by the stable-toolchain
//! mutation test in `tests.rs`. Neither may panic, loop forever or grow without bound.

use super::exchange::{Ctx, Exchange, ProtoCounters, Protocol};
use super::http::Http;
use super::mysql::My;
use super::postgres::Pg;
use super::servermap::ServerMap;
use super::tcp::{Meta, Sink, Tracer};
use super::{net, pcap};

/// Counts rows and checks the invariants every row must satisfy.
pub struct CheckSink {
    pub rows: u64,
}

impl Sink for CheckSink {
    fn push(&mut self, _m: &Meta, ex: &Exchange) -> anyhow::Result<()> {
        assert!(ex.label.len() <= 4096, "label unbounded: {} bytes", ex.label.len());
        self.rows += 1;
        Ok(())
    }
}

/// Interpret `data` as: byte 0 = protocol (0 http, 1 postgres, 2 mysql) and whether the
/// connection start was seen; then records `[control, length, bytes...]` where the control byte
/// says the direction, uncaptured bytes after the record, or a capture gap.
pub fn parsers(data: &[u8]) -> usize {
    let Some((&head, mut rest)) = data.split_first() else { return 0 };
    let saw_start = head & 4 != 0;
    let (mut http, mut pg, mut my);
    let parser: &mut dyn Protocol = match head % 3 {
        0 => {
            http = Http::new();
            &mut http
        }
        1 => {
            pg = Pg::new(saw_start);
            &mut pg
        }
        _ => {
            my = My::new(saw_start);
            &mut my
        }
    };
    let mut out: Vec<Exchange> = Vec::new();
    let mut counters = ProtoCounters::default();
    let mut ts = 0i64;
    let mut rows = 0;
    while rest.len() >= 2 {
        let ctl = rest[0];
        let len = (rest[1] as usize).min(rest.len() - 2);
        let chunk = &rest[2..2 + len];
        rest = &rest[2 + len..];
        let from_client = ctl & 1 == 0;
        let missing = if ctl & 2 != 0 { ((ctl >> 2) & 0x1f) as u32 * 97 } else { 0 };
        let is_gap = ctl & 0x80 != 0;
        ts += 1;
        let mut ctx = Ctx { ts, pkt: ts as u64, conn_flags: 0, out: &mut out, counters: &mut counters };
        parser.feed(&mut ctx, from_client, chunk, if is_gap { missing.max(1) } else { missing }, is_gap);
        rows += out.len();
        out.clear();
    }
    let mut ctx = Ctx { ts, pkt: ts as u64, conn_flags: 0, out: &mut out, counters: &mut counters };
    parser.close(&mut ctx, ts);
    rows + out.len()
}

/// Run the reader, decoder, reassembly and parsers over `data` as if it were a capture file.
pub fn capture(data: &[u8]) -> u64 {
    let Ok(mut r) = pcap::CaptureReader::new(data, "fuzz") else { return 0 };
    let mut t = Tracer::new(ServerMap::default(), CheckSink { rows: 0 });
    while let Some(p) = r.next_packet() {
        if let Ok(seg) = net::decode(p.linktype, p.data, p.orig_len) {
            t.segment(p.ts_ns, &seg).expect("the check sink never fails");
        }
    }
    t.finish().expect("the check sink never fails");
    t.sink.rows
}
