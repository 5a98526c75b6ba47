//! Whole-pipeline tests on hand-built captures: reader -> decoder -> reassembly -> parsers -> rows.

use super::exchange::{flag, Exchange, Status};
use super::fuzzing;
use super::net;
use super::net::{ACK, FIN, SYN};
use super::pcap::CaptureReader;
use super::servermap::ServerMap;
use super::tcp::{Meta, Sink, Tracer};

#[derive(Default)]
struct VecSink {
    rows: Vec<(String, String, u64, Exchange)>,
}
impl Sink for VecSink {
    fn push(&mut self, m: &Meta, ex: &Exchange) -> anyhow::Result<()> {
        self.rows.push((m.server.clone(), m.client.clone(), m.conn, ex.clone()));
        Ok(())
    }
}

/// A pcap file being written: Ethernet + IPv4 + TCP frames, microsecond times.
struct Cap {
    f: Vec<u8>,
    snap: usize,
}

const C: ([u8; 4], u16) = ([10, 0, 0, 1], 40000);
const S: ([u8; 4], u16) = ([10, 0, 0, 2], 80);

impl Cap {
    fn new(snap: usize) -> Self {
        let mut f = Vec::new();
        f.extend_from_slice(&0xa1b2c3d4u32.to_le_bytes());
        f.extend_from_slice(&[2, 0, 4, 0, 0, 0, 0, 0, 0, 0, 0, 0]);
        f.extend_from_slice(&(snap as u32).to_le_bytes());
        f.extend_from_slice(&1u32.to_le_bytes());
        Cap { f, snap }
    }
    fn frame(&mut self, us: u64, src: ([u8; 4], u16), dst: ([u8; 4], u16), seq: u32, flags: u8, payload: &[u8]) {
        let mut p = vec![0u8; 12];
        p.extend_from_slice(&[0x08, 0x00]);
        let total = 40 + payload.len();
        p.extend_from_slice(&[0x45, 0, (total >> 8) as u8, total as u8, 0, 0, 0x40, 0, 64, 6, 0, 0]);
        p.extend_from_slice(&src.0);
        p.extend_from_slice(&dst.0);
        p.extend_from_slice(&src.1.to_be_bytes());
        p.extend_from_slice(&dst.1.to_be_bytes());
        p.extend_from_slice(&seq.to_be_bytes());
        p.extend_from_slice(&[0, 0, 0, 0, 0x50, flags, 0xff, 0xff, 0, 0, 0, 0]);
        p.extend_from_slice(payload);
        self.raw(us, &p);
    }
    fn raw(&mut self, us: u64, p: &[u8]) {
        let cap = p.len().min(self.snap);
        self.f.extend_from_slice(&((us / 1_000_000) as u32).to_le_bytes());
        self.f.extend_from_slice(&((us % 1_000_000) as u32).to_le_bytes());
        self.f.extend_from_slice(&(cap as u32).to_le_bytes());
        self.f.extend_from_slice(&(p.len() as u32).to_le_bytes());
        self.f.extend_from_slice(&p[..cap]);
    }
}

fn run(f: &[u8]) -> (Vec<(String, String, u64, Exchange)>, super::tcp::TcpStats) {
    let mut r = CaptureReader::new(f, "t").unwrap();
    let mut t = Tracer::new(ServerMap::default(), VecSink::default());
    while let Some(p) = r.next_packet() {
        if let Ok(seg) = net::decode(p.linktype, p.data, p.orig_len) {
            t.segment(p.ts_ns, &seg).unwrap();
        }
    }
    t.finish().unwrap();
    (t.sink.rows, t.stats)
}

const REQ: &[u8] = b"GET /item/17 HTTP/1.1\r\nHost: x\r\nX-Request-Id: abc\r\n\r\n";

fn resp(body: usize) -> Vec<u8> {
    let mut r = format!("HTTP/1.1 200 OK\r\nServer: test\r\nContent-Length: {body}\r\n\r\n").into_bytes();
    r.extend(std::iter::repeat_n(b'x', body));
    r
}

fn handshake(c: &mut Cap) {
    c.frame(1_000_000, C, S, 99, SYN, b"");
    c.frame(1_000_010, S, C, 499, SYN | ACK, b"");
    c.frame(1_000_020, C, S, 100, ACK, b"");
}

#[test]
fn one_connection_two_exchanges_times_and_endpoints() {
    let mut c = Cap::new(65535);
    handshake(&mut c);
    c.frame(1_000_100, C, S, 100, ACK, REQ);
    let r = resp(1000);
    c.frame(1_000_300, S, C, 500, ACK, &r[..600]);
    c.frame(1_000_400, C, S, 100 + REQ.len() as u32, ACK, b"");
    c.frame(1_000_450, S, C, 1100, ACK, &r[600..]);
    let q = 100 + REQ.len() as u32;
    c.frame(1_002_000, C, S, q, ACK, REQ);
    c.frame(1_002_500, S, C, 500 + r.len() as u32, ACK, &r);
    c.frame(1_003_000, C, S, q + REQ.len() as u32, FIN | ACK, b"");
    c.frame(1_003_100, S, C, 500 + 2 * r.len() as u32, FIN | ACK, b"");
    let (rows, st) = run(&c.f);
    assert_eq!(rows.len(), 2);
    let (server, client, conn, e) = &rows[0];
    assert_eq!((server.as_str(), client.as_str(), *conn), ("10.0.0.2:80", "10.0.0.1:40000", 1));
    assert_eq!((e.arrival_ns, e.departure_ns), (1_000_100_000, 1_000_450_000));
    assert_eq!((e.label.as_str(), e.status, e.bytes_in, e.bytes_out), ("GET /item/{id}", Status::Http(200), REQ.len() as u64, r.len() as u64));
    assert_eq!(e.request_id.as_deref(), Some("abc"));
    assert_eq!(e.flags, 0);
    assert_eq!((rows[1].3.arrival_ns, rows[1].3.departure_ns), (1_002_000_000, 1_002_500_000));
    assert_eq!(st.pure_acks, 2);
    assert_eq!(st.connections, 1);
}

#[test]
fn retransmission_and_reordering_are_undone() {
    let mut c = Cap::new(65535);
    handshake(&mut c);
    c.frame(1_000_100, C, S, 100, ACK, REQ);
    c.frame(1_000_101, C, S, 100, ACK, REQ); // retransmitted request
    let r = resp(2000);
    let (a, b, d) = (&r[..700], &r[700..1400], &r[1400..]);
    c.frame(1_000_300, S, C, 500, ACK, a);
    c.frame(1_000_310, S, C, 500 + 1400, ACK, d); // arrives early
    c.frame(1_000_320, S, C, 500 + 700, ACK, b); // fills the hole
    c.frame(1_000_330, S, C, 500 + 700, ACK, b); // and again
    let (rows, st) = run(&c.f);
    assert_eq!(rows.len(), 1);
    let e = &rows[0].3;
    assert_eq!((e.bytes_in, e.bytes_out, e.departure_ns), (REQ.len() as u64, r.len() as u64, 1_000_320_000));
    assert_eq!(e.flags, 0);
    assert_eq!((st.retransmitted_segments, st.out_of_order_segments), (2, 1));
}

#[test]
fn capture_starting_mid_connection_skips_the_partial_exchange() {
    let mut c = Cap::new(65535);
    let r = resp(300);
    c.frame(1_000_000, S, C, 7000, ACK, &r[100..]); // the tail of a response
    c.frame(1_000_100, C, S, 100, ACK, REQ);
    c.frame(1_000_200, S, C, 7000 + (r.len() - 100) as u32, ACK, &r);
    let (rows, st) = run(&c.f);
    assert_eq!(rows.len(), 1);
    assert_eq!(rows[0].0, "10.0.0.2:80");
    assert!(rows[0].3.flags & flag::MID_STREAM != 0);
    assert!(rows[0].3.flags & flag::INFERRED == 0, "flags {:#x}", rows[0].3.flags);
    assert_eq!(st.connections_mid_stream, 1);
}

#[test]
fn short_snapshot_length_still_delimits_exchanges() {
    for snap in [96usize, 128, 256, 65535] {
        let mut c = Cap::new(snap);
        handshake(&mut c);
        let mut seq_c = 100u32;
        let mut seq_s = 500u32;
        let mut t = 1_000_100u64;
        for i in 0..5 {
            let req = format!("GET /page/{i}?session=abcdef0123456789abcdef HTTP/1.1\r\nHost: example\r\nUser-Agent: t\r\n\r\n");
            c.frame(t, C, S, seq_c, ACK, req.as_bytes());
            seq_c += req.len() as u32;
            let r = resp(3000 + i * 10);
            for (k, part) in r.chunks(1448).enumerate() {
                c.frame(t + 100 + k as u64 * 10, S, C, seq_s, ACK, part);
                seq_s += part.len() as u32;
            }
            t += 1000;
        }
        c.frame(t, C, S, seq_c, FIN | ACK, b"");
        c.frame(t + 1, S, C, seq_s, FIN | ACK, b"");
        let (rows, _) = run(&c.f);
        assert_eq!(rows.len(), 5, "snaplen {snap}");
        for (i, (_, _, _, e)) in rows.iter().enumerate() {
            let parts = (3000 + i * 10).div_ceil(1448) as u64;
            let last = 1_000_100 + i as u64 * 1000 + 100 + (parts - 1) * 10;
            assert_eq!(e.departure_ns, last as i64 * 1000, "snaplen {snap} row {i}");
            assert_eq!(e.bytes_out, resp(3000 + i * 10).len() as u64);
            assert!(e.label.starts_with("GET /page/{id}"), "{}", e.label);
            if snap >= 256 {
                assert_eq!(e.status, Status::Http(200));
            }
        }
    }
}

#[test]
fn non_tcp_and_garbage_frames_are_skipped() {
    let mut c = Cap::new(65535);
    c.raw(1, &[0u8; 10]); // too short for Ethernet
    let mut arp = vec![0u8; 12];
    arp.extend_from_slice(&[0x08, 0x06]);
    arp.extend_from_slice(&[0; 28]);
    c.raw(2, &arp);
    handshake(&mut c);
    c.frame(1_000_100, C, S, 100, ACK, REQ);
    c.frame(1_000_200, S, C, 500, ACK, &resp(5));
    let (rows, _) = run(&c.f);
    assert_eq!(rows.len(), 1);
}

#[test]
fn unanswered_request_at_end_of_capture_is_flagged_not_dropped() {
    let mut c = Cap::new(65535);
    handshake(&mut c);
    c.frame(1_000_100, C, S, 100, ACK, REQ);
    c.frame(1_000_900, C, S, 100 + REQ.len() as u32, ACK, b"");
    let (rows, st) = run(&c.f);
    assert_eq!(rows.len(), 1);
    assert!(rows[0].3.flags & flag::NO_RESPONSE != 0);
    assert_eq!(st.exchanges_no_response, 1);
}

/// Stable-toolchain fuzzing: mutate valid inputs at random for a bounded time
/// (TIERSCOPE_FUZZ_SECS, default 3 s) through both fuzz entry points; nothing may panic.
#[test]
fn mutated_inputs_never_panic() {
    use rand::{Rng, SeedableRng};
    let secs: f64 = std::env::var("TIERSCOPE_FUZZ_SECS").ok().and_then(|v| v.parse().ok()).unwrap_or(3.0);
    let mut rng = rand::rngs::SmallRng::seed_from_u64(std::env::var("TIERSCOPE_FUZZ_SEED").ok().and_then(|v| v.parse().ok()).unwrap_or(4));
    // seeds: a capture and parser scripts for each protocol
    let mut cap = Cap::new(65535);
    handshake(&mut cap);
    cap.frame(1_000_100, C, S, 100, ACK, REQ);
    cap.frame(1_000_200, S, C, 500, ACK, &resp(40));
    let mut pg = vec![1u8 | 4];
    for (ctl, m) in [
        (0u8, vec![0, 0, 0, 16, 0, 3, 0, 0, b'u', b's', b'e', b'r', 0, b'u', 0, 0]),
        (1, b"R\0\0\0\x08\0\0\0\0Z\0\0\0\x05I".to_vec()),
        (0, b"Q\0\0\0\x0dSELECT 1;\0".to_vec()),
        (1, b"C\0\0\0\x0bSELECT 1\0Z\0\0\0\x05I".to_vec()),
    ] {
        pg.push(ctl);
        pg.push(m.len() as u8);
        pg.extend(m);
    }
    let mut my = vec![2u8];
    for (ctl, m) in [
        (0u8, b"\x09\0\0\0\x03SELECT 1".to_vec()),
        (1, b"\x01\0\0\x01\x01\x05\0\0\x02\x03def\x05\0\0\x03\xfe\0\0\x02\0\x02\0\0\x04\x011\x05\0\0\x05\xfe\0\0\x02\0".to_vec()),
    ] {
        my.push(ctl);
        my.push(m.len() as u8);
        my.extend(m);
    }
    let mut http = vec![4u8]; // parser 0 (HTTP), flag 4: the stream starts at a message
    for (ctl, m) in [(0u8, REQ.to_vec()), (1, resp(20)), (2 | (3 << 2), b"POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nab".to_vec())] {
        http.push(ctl);
        http.push(m.len() as u8);
        http.extend(m);
    }
    let seeds: Vec<(bool, Vec<u8>)> = vec![(true, cap.f.clone()), (false, pg), (false, my), (false, http)];
    let t0 = std::time::Instant::now();
    let mut runs = 0u64;
    while t0.elapsed().as_secs_f64() < secs {
        let (is_cap, seed) = &seeds[rng.gen_range(0..seeds.len())];
        let mut d = seed.clone();
        for _ in 0..rng.gen_range(1..8) {
            match rng.gen_range(0..5) {
                0 if !d.is_empty() => {
                    let i = rng.gen_range(0..d.len());
                    d[i] = rng.gen();
                }
                1 if !d.is_empty() => {
                    let i = rng.gen_range(0..d.len());
                    d.truncate(i);
                }
                2 => {
                    let i = rng.gen_range(0..=d.len());
                    let n = rng.gen_range(1..16);
                    for _ in 0..n {
                        d.insert(i, rng.gen());
                    }
                }
                3 if d.len() > 4 => {
                    let i = rng.gen_range(0..d.len() - 4);
                    let v: u32 = rng.gen();
                    d[i..i + 4].copy_from_slice(&v.to_le_bytes());
                }
                _ if !d.is_empty() => {
                    let i = rng.gen_range(0..d.len());
                    let j = rng.gen_range(i..d.len());
                    let chunk = d[i..j].to_vec();
                    d.splice(i..i, chunk);
                }
                _ => {}
            }
        }
        if *is_cap {
            fuzzing::capture(&d);
        } else {
            fuzzing::parsers(&d);
        }
        runs += 1;
    }
    eprintln!("mutated_inputs_never_panic: {runs} inputs in {secs} s");
    assert!(runs > 100);
}
