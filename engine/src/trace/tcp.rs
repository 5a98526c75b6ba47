//! TCP connection tracking and stream reassembly.
//!
//! Each connection (keyed by its two endpoints) holds, per direction, the next expected sequence
//! number and a small list of segments that arrived early. In-order bytes go straight to the
//! connection's protocol parser; retransmitted bytes are dropped; a hole that is not filled before
//! the other side sends data (or before 64 segments / 1 MiB wait behind it) is handed to the
//! parser as a gap of known length. Pure ACKs never touch the table, so the common packet costs a
//! header decode only. Memory grows with the number of open connections: closed ones (FIN both
//! ways, RST) are emitted and dropped, and connections idle for 5 minutes of capture time are
//! closed as if the capture ended.
//!
//! Which side is the server: the SYN's sender is the client. Without a SYN: the server map, then
//! the first payload (an HTTP request line, a PostgreSQL or MySQL client message), then well-known
//! ports; as a last resort the lower port, flagged `role_guessed`.

use std::collections::hash_map::Entry;
use std::collections::HashMap;
use std::hash::{Hash, Hasher};
use std::rc::Rc;

use super::exchange::{flag, Ctx, Exchange, ProtoCounters, Protocol};
use super::hash::FxBuild;
use super::http::{starts_request, starts_response, Http};
use super::mysql::My;
use super::net::{endpoint_text, ip_text, Ip, Segment, ACK, FIN, RST, SYN};
use super::postgres::Pg;
use super::servermap::{Proto, ServerMap};

const MAX_HELD_SEGMENTS: usize = 64;
const MAX_HELD_BYTES: usize = 1 << 20;
const IDLE_NS: i64 = 300 * 1_000_000_000;
const SNIFF_SEGMENTS: u8 = 4;

/// The two endpoints of a connection, lower one first (addresses as integers: cheap to compare).
#[derive(Clone, Copy, PartialEq, Eq)]
struct FlowKey {
    a: u128,
    b: u128,
    pa: u16,
    pb: u16,
}

impl Hash for FlowKey {
    #[inline]
    fn hash<H: Hasher>(&self, h: &mut H) {
        h.write_u64(self.a as u64 ^ (self.a >> 64) as u64);
        h.write_u64(self.b as u64 ^ (self.b >> 64) as u64);
        h.write_u64(((self.pa as u64) << 16) | self.pb as u64);
    }
}

impl FlowKey {
    /// The canonical key and the index (0 = a, 1 = b) of the segment's sender.
    #[inline]
    fn of(s: &Segment) -> (FlowKey, usize) {
        let (src, dst) = (s.src, s.dst);
        if (src, s.sport) <= (dst, s.dport) {
            (FlowKey { a: src, b: dst, pa: s.sport, pb: s.dport }, 0)
        } else {
            (FlowKey { a: dst, b: src, pa: s.dport, pb: s.sport }, 1)
        }
    }
}

/// Per-connection facts written on each of its rows.
#[derive(Debug)]
pub struct Meta {
    pub tier: String,
    pub server: String,
    pub protocol: &'static str,
    pub server_addr: String,
    pub server_port: u16,
    pub client_addr: String,
    pub client_port: u16,
    pub client: String,
    pub conn: u64,
}

/// Where finished exchanges go.
pub trait Sink {
    fn push(&mut self, meta: &Meta, ex: &Exchange) -> anyhow::Result<()>;
}

struct Held {
    seq: u32,
    ts: i64,
    wire_len: u32,
    data: Vec<u8>,
}

#[derive(Default)]
struct Dir {
    next: u32,
    init: bool,
    held: Vec<Held>,
    held_bytes: usize,
}

enum Parser {
    Sniff(u8),
    Http(Box<Http>),
    Pg(Box<Pg>),
    My(Box<My>),
    Opaque,
}

struct Conn {
    id: u64,
    /// endpoint index (0 = key.a, 1 = key.b) of the server
    server_idx: usize,
    dirs: [Dir; 2],
    parser: Parser,
    proto: Option<Proto>,
    flags: u16,
    saw_syn: bool,
    last_dir: usize,
    last_ts: i64,
    fin: [bool; 2],
    had_data: bool,
    server_ip: Ip,
    server_port: u16,
    client_ip: Ip,
    client_port: u16,
    map_proto: Option<Proto>,
    meta: Option<Rc<Meta>>,
}

/// Counts of everything the tracer met, for `--stats` and the summary line.
#[derive(Debug, Default, Clone)]
pub struct TcpStats {
    pub pure_acks: u64,
    pub data_segments: u64,
    pub connections: u64,
    pub connections_mid_stream: u64,
    pub connections_role_guessed: u64,
    pub connections_unrecognised: u64,
    pub connections_http: u64,
    pub connections_postgres: u64,
    pub connections_mysql: u64,
    pub connections_evicted_idle: u64,
    pub retransmitted_segments: u64,
    pub out_of_order_segments: u64,
    pub gaps: u64,
    pub gap_bytes: u64,
    pub snaplen_cut_segments: u64,
    pub snaplen_cut_bytes: u64,
    pub exchanges: u64,
    pub exchanges_http: u64,
    pub exchanges_postgres: u64,
    pub exchanges_mysql: u64,
    pub exchanges_inferred: u64,
    pub exchanges_no_response: u64,
    pub exchanges_truncated: u64,
}

pub struct Tracer<S: Sink> {
    conns: HashMap<FlowKey, Conn, FxBuild>,
    map: ServerMap,
    next_id: u64,
    pkt: u64,
    now: i64,
    next_sweep: u64,
    out: Vec<Exchange>,
    pub counters: ProtoCounters,
    pub stats: TcpStats,
    pub sink: S,
}

const WELL_KNOWN: [u16; 12] = [80, 443, 8080, 8000, 8008, 8081, 8443, 5432, 6432, 3306, 3307, 9000];

impl<S: Sink> Tracer<S> {
    pub fn new(map: ServerMap, sink: S) -> Self {
        Tracer {
            // sized by the open connections only: a small table stays in the L1 cache
            conns: HashMap::with_hasher(FxBuild::default()),
            map,
            next_id: 0,
            pkt: 0,
            now: 0,
            next_sweep: 1 << 20,
            out: Vec::new(),
            counters: ProtoCounters::default(),
            stats: TcpStats::default(),
            sink,
        }
    }

    pub fn open_connections(&self) -> usize {
        self.conns.len()
    }

    /// Feed one decoded TCP segment captured at `ts` (ns).
    #[inline]
    pub fn segment(&mut self, ts: i64, seg: &Segment) -> anyhow::Result<()> {
        self.pkt += 1;
        self.now = ts;
        let ctl = seg.flags & (SYN | FIN | RST);
        if seg.wire_len == 0 && ctl == 0 {
            self.stats.pure_acks += 1;
            return Ok(());
        }
        if self.pkt >= self.next_sweep {
            self.next_sweep = self.pkt + (1 << 20);
            self.sweep_idle(ts)?;
        }
        let (key, src) = FlowKey::of(seg);
        let syn_only = seg.flags & SYN != 0 && seg.flags & ACK == 0;
        if syn_only {
            if let Some(c) = self.conns.get(&key) {
                if c.had_data || c.fin[0] || c.fin[1] {
                    // the 4-tuple is reused by a new connection
                    let c = self.conns.remove(&key).unwrap();
                    self.finish_conn(c)?;
                }
            }
        }
        // one table lookup per segment: the entry either holds the connection or takes a new one
        let c = match self.conns.entry(key) {
            Entry::Occupied(o) => o.into_mut(),
            Entry::Vacant(v) => {
                if seg.wire_len == 0 && seg.flags & SYN == 0 {
                    return Ok(()); // FIN/RST of a connection we never saw carry data
                }
                v.insert(new_conn(&mut self.next_id, &mut self.stats, &self.map, src, seg))
            }
        };
        c.last_ts = ts;
        let mut seq = seg.seq;
        if seg.flags & SYN != 0 {
            let d = &mut c.dirs[src];
            d.next = seg.seq.wrapping_add(1);
            d.init = true;
            seq = d.next;
        }
        if seg.wire_len > 0 {
            self.stats.data_segments += 1;
            c.had_data = true;
            if (seg.payload.len() as u32) < seg.wire_len {
                self.stats.snaplen_cut_segments += 1;
                self.stats.snaplen_cut_bytes += (seg.wire_len - seg.payload.len() as u32) as u64;
            }
            let d = &mut c.dirs[src];
            if !d.init {
                d.next = seq;
                d.init = true;
            }
            let diff = seq.wrapping_sub(d.next) as i32;
            if diff < 0 {
                let over = diff.unsigned_abs();
                if over >= seg.wire_len {
                    self.stats.retransmitted_segments += 1;
                } else {
                    let cut = (over as usize).min(seg.payload.len());
                    deliver(c, src, ts, self.pkt, &seg.payload[cut..], seg.wire_len - over, &mut self.out, &mut self.counters, &mut self.stats);
                    drain_held(c, src, ts, self.pkt, &mut self.out, &mut self.counters, &mut self.stats);
                }
            } else if diff > 0 {
                self.stats.out_of_order_segments += 1;
                let d = &mut c.dirs[src];
                d.held_bytes += seg.payload.len();
                d.held.push(Held { seq, ts, wire_len: seg.wire_len, data: seg.payload.to_vec() });
                if d.held.len() > MAX_HELD_SEGMENTS || d.held_bytes > MAX_HELD_BYTES {
                    flush_hole(c, src, ts, self.pkt, &mut self.out, &mut self.counters, &mut self.stats);
                }
            } else {
                deliver(c, src, ts, self.pkt, seg.payload, seg.wire_len, &mut self.out, &mut self.counters, &mut self.stats);
                drain_held(c, src, ts, self.pkt, &mut self.out, &mut self.counters, &mut self.stats);
            }
        }
        let mut close = seg.flags & RST != 0;
        if seg.flags & FIN != 0 {
            c.fin[src] = true;
            close |= c.fin[0] && c.fin[1];
        }
        if !self.out.is_empty() {
            emit(c, &self.map, &mut self.out, &mut self.sink, &mut self.stats)?;
        }
        if close {
            let c = self.conns.remove(&key).unwrap();
            self.finish_conn(c)?;
        }
        Ok(())
    }

    fn sweep_idle(&mut self, now: i64) -> anyhow::Result<()> {
        let idle: Vec<FlowKey> = self.conns.iter().filter(|(_, c)| now - c.last_ts > IDLE_NS).map(|(k, _)| *k).collect();
        for k in idle {
            if let Some(c) = self.conns.remove(&k) {
                self.stats.connections_evicted_idle += 1;
                self.finish_conn(c)?;
            }
        }
        Ok(())
    }

    fn finish_conn(&mut self, mut c: Conn) -> anyhow::Result<()> {
        for side in 0..2 {
            if !c.dirs[side].held.is_empty() {
                let last_ts = c.last_ts;
                flush_hole(&mut c, side, last_ts, self.pkt, &mut self.out, &mut self.counters, &mut self.stats);
            }
        }
        let mut ctx = Ctx { ts: c.last_ts, pkt: self.pkt, conn_flags: c.flags, out: &mut self.out, counters: &mut self.counters };
        let last = c.last_ts;
        match &mut c.parser {
            Parser::Http(p) => p.close(&mut ctx, last),
            Parser::Pg(p) => p.close(&mut ctx, last),
            Parser::My(p) => p.close(&mut ctx, last),
            Parser::Sniff(_) => {
                if c.had_data {
                    self.stats.connections_unrecognised += 1;
                }
            }
            Parser::Opaque => {}
        }
        if !self.out.is_empty() {
            emit(&mut c, &self.map, &mut self.out, &mut self.sink, &mut self.stats)?;
        }
        Ok(())
    }

    /// The capture ended: close every open connection (in the order they were first seen).
    pub fn finish(&mut self) -> anyhow::Result<()> {
        let mut all: Vec<(FlowKey, u64)> = self.conns.iter().map(|(k, c)| (*k, c.id)).collect();
        all.sort_by_key(|x| x.1);
        for (k, _) in all {
            if let Some(c) = self.conns.remove(&k) {
                self.finish_conn(c)?;
            }
        }
        Ok(())
    }
}

/// A connection first seen with `seg` (sent by endpoint `src`).
fn new_conn(next_id: &mut u64, stats: &mut TcpStats, map: &ServerMap, src: usize, seg: &Segment) -> Conn {
    *next_id += 1;
    stats.connections += 1;
    let syn = seg.flags & SYN != 0;
    let ack = seg.flags & ACK != 0;
    let mut flags = 0;
    let server_idx = if syn && !ack {
        1 - src
    } else if syn {
        src
    } else {
        flags |= flag::MID_STREAM;
        stats.connections_mid_stream += 1;
        let (dst_server, guessed) = guess_server(map, seg);
        if guessed {
            flags |= flag::ROLE_GUESSED;
            stats.connections_role_guessed += 1;
        }
        if dst_server {
            1 - src
        } else {
            src
        }
    };
    let (server_ip, server_port, client_ip, client_port) =
        if server_idx == src { (seg.src, seg.sport, seg.dst, seg.dport) } else { (seg.dst, seg.dport, seg.src, seg.sport) };
    let (server_ip, client_ip) = (server_ip.to_be_bytes(), client_ip.to_be_bytes());
    let map_proto = map.get(&server_ip, server_port).and_then(|e| e.protocol);
    Conn {
        id: *next_id,
        server_idx,
        dirs: [Dir::default(), Dir::default()],
        parser: Parser::Sniff(0),
        proto: None,
        flags,
        saw_syn: syn,
        last_dir: 2,
        last_ts: 0,
        fin: [false; 2],
        had_data: false,
        server_ip,
        server_port,
        client_ip,
        client_port,
        map_proto,
        meta: None,
    }
}

/// Is the segment's destination the server? And was that a guess?
fn guess_server(map: &ServerMap, seg: &Segment) -> (bool, bool) {
    if map.get(&seg.dst.to_be_bytes(), seg.dport).is_some() {
        return (true, false);
    }
    if map.get(&seg.src.to_be_bytes(), seg.sport).is_some() {
        return (false, false);
    }
    let p = seg.payload;
    if starts_request(p) || Pg::sniff_client(p) || My::sniff_client(p) {
        return (true, false);
    }
    if starts_response(p) || My::sniff_server(p) {
        return (false, false);
    }
    if WELL_KNOWN.contains(&seg.dport) {
        return (true, false);
    }
    if WELL_KNOWN.contains(&seg.sport) {
        return (false, false);
    }
    (seg.dport < seg.sport, true)
}

fn decide_protocol(c: &Conn, from_client: bool, d: &[u8], server_port: u16, map_proto: Option<Proto>) -> Option<Proto> {
    if map_proto.is_some() {
        return map_proto;
    }
    if from_client {
        if starts_request(d) {
            return Some(Proto::Http);
        }
        if Pg::sniff_client(d) {
            return Some(Proto::Pg);
        }
        if My::sniff_client(d) {
            return Some(Proto::My);
        }
    } else {
        if starts_response(d) {
            return Some(Proto::Http);
        }
        if My::sniff_server(d) {
            return Some(Proto::My);
        }
    }
    let _ = c;
    match server_port {
        5432 | 6432 => Some(Proto::Pg),
        3306 | 3307 => Some(Proto::My),
        _ => None,
    }
}

#[allow(clippy::too_many_arguments)] // the hot path: the tracer's parts passed apart, so the borrow checker sees them apart
#[inline]
fn deliver(
    c: &mut Conn,
    dir: usize,
    ts: i64,
    pkt: u64,
    data: &[u8],
    wire_len: u32,
    out: &mut Vec<Exchange>,
    counters: &mut ProtoCounters,
    stats: &mut TcpStats,
) {
    if c.last_dir != dir {
        let other = 1 - dir;
        if c.last_dir == other && !c.dirs[other].held.is_empty() {
            // the other side's hole will not be filled before this side talks: a capture gap
            flush_hole(c, other, ts, pkt, out, counters, stats);
        }
        c.last_dir = dir;
    }
    c.dirs[dir].next = c.dirs[dir].next.wrapping_add(wire_len);
    let missing = wire_len - data.len() as u32;
    feed(c, dir, ts, pkt, data, missing, false, out, counters, stats);
}

#[allow(clippy::too_many_arguments)] // as for deliver
#[inline]
fn feed(
    c: &mut Conn,
    dir: usize,
    ts: i64,
    pkt: u64,
    data: &[u8],
    missing: u32,
    is_gap: bool,
    out: &mut Vec<Exchange>,
    counters: &mut ProtoCounters,
    stats: &mut TcpStats,
) {
    let from_client = dir != c.server_idx;
    if let Parser::Sniff(tries) = c.parser {
        if is_gap {
            return;
        }
        let proto = decide_protocol(c, from_client, data, c.server_port, c.map_proto);
        match proto {
            Some(p) => {
                c.proto = Some(p);
                c.parser = match p {
                    Proto::Http => Parser::Http(Box::new(Http::new())),
                    Proto::Pg => Parser::Pg(Box::new(Pg::new(c.saw_syn))),
                    Proto::My => Parser::My(Box::new(My::new(c.saw_syn))),
                };
                match p {
                    Proto::Http => stats.connections_http += 1,
                    Proto::Pg => stats.connections_postgres += 1,
                    Proto::My => stats.connections_mysql += 1,
                }
            }
            None => {
                c.parser = if tries + 1 >= SNIFF_SEGMENTS {
                    stats.connections_unrecognised += 1;
                    Parser::Opaque
                } else {
                    Parser::Sniff(tries + 1)
                };
                return;
            }
        }
    }
    let mut ctx = Ctx { ts, pkt, conn_flags: c.flags, out, counters };
    match &mut c.parser {
        Parser::Http(p) => p.feed(&mut ctx, from_client, data, missing, is_gap),
        Parser::Pg(p) => p.feed(&mut ctx, from_client, data, missing, is_gap),
        Parser::My(p) => p.feed(&mut ctx, from_client, data, missing, is_gap),
        Parser::Sniff(_) | Parser::Opaque => {}
    }
}

fn drain_held(c: &mut Conn, dir: usize, ts: i64, pkt: u64, out: &mut Vec<Exchange>, counters: &mut ProtoCounters, stats: &mut TcpStats) {
    while !c.dirs[dir].held.is_empty() {
        let next = c.dirs[dir].next;
        let Some(i) = c.dirs[dir].held.iter().position(|h| (h.seq.wrapping_sub(next) as i32) <= 0) else { return };
        let h = c.dirs[dir].held.swap_remove(i);
        c.dirs[dir].held_bytes -= h.data.len();
        let over = next.wrapping_sub(h.seq);
        if over >= h.wire_len {
            stats.retransmitted_segments += 1;
            continue;
        }
        let cut = (over as usize).min(h.data.len());
        deliver(c, dir, ts.max(h.ts), pkt, &h.data[cut..], h.wire_len - over, out, counters, stats);
    }
}

/// Give up waiting for the bytes before the earliest held segment: report them as a gap.
fn flush_hole(c: &mut Conn, dir: usize, ts: i64, pkt: u64, out: &mut Vec<Exchange>, counters: &mut ProtoCounters, stats: &mut TcpStats) {
    while !c.dirs[dir].held.is_empty() {
        let next = c.dirs[dir].next;
        let first = c.dirs[dir].held.iter().map(|h| h.seq.wrapping_sub(next)).min().unwrap_or(0);
        if first > 0 && (first as i32) > 0 {
            stats.gaps += 1;
            stats.gap_bytes += first as u64;
            c.dirs[dir].next = next.wrapping_add(first);
            let saved = c.last_dir;
            feed(c, dir, ts, pkt, &[], first, true, out, counters, stats);
            c.last_dir = saved;
        }
        let before = c.dirs[dir].held.len();
        let saved = c.last_dir;
        c.last_dir = dir;
        drain_held(c, dir, ts, pkt, out, counters, stats);
        c.last_dir = saved;
        if c.dirs[dir].held.len() == before {
            // held segments entirely behind `next` (should not happen): drop them
            c.dirs[dir].held.clear();
            c.dirs[dir].held_bytes = 0;
        }
    }
}

fn emit<S: Sink>(c: &mut Conn, map: &ServerMap, out: &mut Vec<Exchange>, sink: &mut S, stats: &mut TcpStats) -> anyhow::Result<()> {
    if c.meta.is_none() {
        let entry = map.get(&c.server_ip, c.server_port);
        let server_text = endpoint_text(&c.server_ip, c.server_port);
        c.meta = Some(Rc::new(Meta {
            tier: entry.map(|e| e.tier.clone()).unwrap_or_else(|| c.proto.map(|p| p.default_tier()).unwrap_or("unknown").to_string()),
            server: entry.map(|e| e.server.clone()).unwrap_or_else(|| server_text.clone()),
            protocol: c.proto.map(|p| p.name()).unwrap_or("unknown"),
            server_addr: ip_text(&c.server_ip),
            server_port: c.server_port,
            client_addr: ip_text(&c.client_ip),
            client_port: c.client_port,
            client: endpoint_text(&c.client_ip, c.client_port),
            conn: c.id,
        }));
    }
    let meta = c.meta.clone().unwrap();
    for ex in out.drain(..) {
        stats.exchanges += 1;
        match c.proto {
            Some(Proto::Http) => stats.exchanges_http += 1,
            Some(Proto::Pg) => stats.exchanges_postgres += 1,
            Some(Proto::My) => stats.exchanges_mysql += 1,
            None => {}
        }
        if ex.flags & flag::INFERRED != 0 {
            stats.exchanges_inferred += 1;
        }
        if ex.flags & flag::NO_RESPONSE != 0 {
            stats.exchanges_no_response += 1;
        }
        if ex.flags & flag::TRUNCATED != 0 {
            stats.exchanges_truncated += 1;
        }
        sink.push(&meta, &ex)?;
    }
    Ok(())
}
