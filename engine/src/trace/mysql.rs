//! MySQL / MariaDB client/server protocol.
//!
//! * Handshake (greeting, handshake response, authentication switches) up to the first OK is not
//!   a request; an SSL request switches the connection to TLS (counted, skipped). The greeting and
//!   the client's capabilities say whether result sets end with EOF packets (CLIENT_DEPRECATE_EOF).
//! * Command phase: every client packet with sequence id 0 starts a command. COM_QUERY,
//!   COM_STMT_PREPARE (the statement id from its answer is remembered with the SQL fingerprint),
//!   COM_STMT_EXECUTE (labelled with the prepared statement's fingerprint), and the small commands
//!   (PING, INIT_DB, ...) are requests; COM_STMT_CLOSE, COM_STMT_SEND_LONG_DATA and COM_QUIT have
//!   no answer and are only counted.
//! * Responses: OK, ERR (status = error number), or a result set (column count, column
//!   definitions, optional EOF, rows, EOF/OK terminator), following SERVER_MORE_RESULTS_EXISTS.

use std::collections::HashMap;

use super::exchange::{flag, Ctx, Exchange, Pending, Protocol, Status};
use super::framer::{end_message, Framer, Input, Mode, Step};
use super::label::{sql_fingerprint, Dialect};

const SQL_CAP: usize = 4096;
const SERVER_CAP: usize = 64;
const CLIENT_SSL: u32 = 0x0800;
const CLIENT_DEPRECATE_EOF: u32 = 1 << 24;
const MORE_RESULTS: u16 = 0x0008;

// what response a command expects (Exchange::kind)
const K_QUERY: u8 = 1;
const K_PREPARE: u8 = 2;
const K_SIMPLE: u8 = 3;
const K_FETCH: u8 = 4;
const K_FIELDS: u8 = 5;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    Handshake { greeting: bool, client_resp: bool },
    Command,
    Opaque,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Resp {
    First,
    Cols(u64),
    ColsEof,
    Rows,
    PrepParams(u16, u16),
    PrepParamsEof(u16),
    PrepCols(u16),
    PrepColsEof,
}

pub struct My {
    c: Framer,
    s: Framer,
    phase: Phase,
    server_caps: u32,
    deprecate_eof: Option<bool>,
    pending: Pending,
    resp: Resp,
    /// statement id -> SQL fingerprint
    stmts: HashMap<u32, String>,
    c_first: bool,
    s_first: bool,
}

/// Known command bytes (for recognising a command packet when the handshake was not captured).
fn known_command(b: u8) -> bool {
    matches!(b, 0x01..=0x04 | 0x0e | 0x11 | 0x16..=0x1c | 0x1f)
}

fn lenenc(b: &[u8], o: &mut usize) -> Option<u64> {
    let f = *b.get(*o)?;
    *o += 1;
    let n = match f {
        0..=0xfa => return Some(f as u64),
        0xfc => 2,
        0xfd => 3,
        0xfe => 8,
        _ => return None,
    };
    let s = b.get(*o..*o + n)?;
    *o += n;
    let mut v = [0u8; 8];
    v[..n].copy_from_slice(s);
    Some(u64::from_le_bytes(v))
}

fn le16(b: &[u8], o: usize) -> Option<u16> {
    Some(u16::from_le_bytes([*b.get(o)?, *b.get(o + 1)?]))
}

impl My {
    pub fn new(saw_start: bool) -> Self {
        My {
            c: Framer::new(Mode::My, b""),
            s: Framer::new(Mode::My, b""),
            phase: if saw_start { Phase::Handshake { greeting: false, client_resp: false } } else { Phase::Command },
            server_caps: 0,
            deprecate_eof: None,
            pending: Pending::default(),
            resp: Resp::First,
            stmts: HashMap::new(),
            c_first: !saw_start,
            s_first: !saw_start,
        }
    }

    /// Does a server's first payload look like a MySQL greeting?
    pub fn sniff_server(d: &[u8]) -> bool {
        d.len() > 5 && d[3] == 0 && (d[4] == 10 || d[4] == 9) && (u32::from_le_bytes([d[0], d[1], d[2], 0]) as usize) < 1024
    }

    /// Does a client's payload look like a MySQL command packet (mid-stream)?
    pub fn sniff_client(d: &[u8]) -> bool {
        d.len() > 4 && d[3] == 0 && known_command(d[4]) && {
            let l = u32::from_le_bytes([d[0], d[1], d[2], 0]) as usize;
            l >= 1 && (l + 4 == d.len() || (d[4] == 0x03 && l + 4 > d.len()))
        }
    }

    fn client_start(&mut self, ctx: &mut Ctx) {
        self.c.cap = SQL_CAP;
        if self.phase != Phase::Command {
            return;
        }
        if self.c.seq == 0 && !self.c.cont {
            if self.s.lost || self.s.mid_message() || self.resp != Resp::First {
                // the previous response's framing was lost: it ended with its last byte seen
                self.pending.finish_answered_by_turn(ctx);
                self.s.reset();
                self.resp = Resp::First;
            }
        } else if let Some(e) = self.pending.q.back_mut() {
            e.bytes_in += self.c.wire as u64;
        }
    }

    fn client_end(&mut self, ctx: &mut Ctx, body: &[u8], cut: bool) {
        match self.phase {
            Phase::Handshake { greeting, client_resp: false } if greeting || self.c.seq == 1 => {
                let caps = if body.len() >= 4 { u32::from_le_bytes([body[0], body[1], body[2], body[3]]) } else { 0 };
                if caps & CLIENT_SSL != 0 && self.c.len == 32 {
                    ctx.counters.tls_connections += 1;
                    self.phase = Phase::Opaque;
                    return;
                }
                if greeting {
                    self.deprecate_eof = Some(caps & self.server_caps & CLIENT_DEPRECATE_EOF != 0);
                }
                self.phase = Phase::Handshake { greeting, client_resp: true };
                return;
            }
            Phase::Command => {}
            _ => return,
        }
        if self.c.seq != 0 || self.c.cont || body.is_empty() {
            return;
        }
        let cmd = body[0];
        let mut ex = Exchange::new(self.c.msg_ts, 0);
        ex.bytes_in = self.c.wire as u64;
        let sql = &body[1..];
        let sql_cut = cut && body.len() < self.c.len as usize;
        if cut {
            ex.flags |= flag::TRUNCATED;
        }
        match cmd {
            0x01 | 0x18 | 0x19 => {
                ctx.counters.no_response_commands += 1;
                if cmd == 0x19 && body.len() >= 5 {
                    self.stmts.remove(&u32::from_le_bytes([body[1], body[2], body[3], body[4]]));
                }
                return;
            }
            0x03 => {
                let (l, rid) = sql_fingerprint(sql, Dialect::MySql, sql_cut);
                ex.label = l;
                ex.request_id = rid;
                ex.kind = K_QUERY;
            }
            0x16 => {
                let (l, rid) = sql_fingerprint(sql, Dialect::MySql, sql_cut);
                ex.label = format!("PREPARE {l}");
                ex.request_id = rid;
                ex.kind = K_PREPARE;
            }
            0x17 | 0x1c => {
                let id = if body.len() >= 5 { u32::from_le_bytes([body[1], body[2], body[3], body[4]]) } else { 0 };
                ex.label = match self.stmts.get(&id) {
                    Some(l) => l.clone(),
                    None => format!("EXECUTE stmt {id}"),
                };
                if cmd == 0x1c {
                    ex.label = format!("FETCH {}", ex.label);
                }
                ex.aux = id;
                ex.kind = if cmd == 0x17 { K_QUERY } else { K_FETCH };
            }
            0x04 => {
                ex.label = "FIELD LIST".into();
                ex.kind = K_FIELDS;
            }
            _ => {
                ex.label = match cmd {
                    0x02 => "INIT DB",
                    0x0e => "PING",
                    0x1a => "RESET STMT",
                    0x1b => "SET OPTION",
                    0x11 => "CHANGE USER",
                    0x1f => "RESET CONNECTION",
                    0x09 => "STATISTICS",
                    _ => "",
                }
                .into();
                if ex.label.is_empty() {
                    ex.label = format!("COMMAND {cmd:#04x}");
                }
                ex.kind = K_SIMPLE;
            }
        }
        self.pending.push(ex, ctx);
    }

    fn server_end(&mut self, ctx: &mut Ctx, b: &[u8]) {
        let len = self.s.len as usize;
        match self.phase {
            Phase::Handshake { greeting: false, client_resp } if self.s.seq == 0 && b.first().is_some_and(|&v| v == 10 || v == 9) => {
                // greeting: version\0, thread id, 8 auth bytes, filler, caps low, charset, status, caps high
                if let Some(nul) = memchr::memchr(0, &b[1..]) {
                    let o = 1 + nul + 1 + 4 + 8 + 1;
                    let lo = le16(b, o).unwrap_or(0) as u32;
                    let hi = le16(b, o + 5).unwrap_or(0) as u32;
                    self.server_caps = lo | (hi << 16);
                }
                self.phase = Phase::Handshake { greeting: true, client_resp };
                return;
            }
            Phase::Handshake { client_resp: true, .. } => {
                if b.first() == Some(&0x00) {
                    self.phase = Phase::Command;
                }
                return;
            }
            Phase::Command => {}
            _ => return,
        }
        if self.s.cont {
            return;
        }
        let Some(front) = self.pending.q.front_mut() else {
            if self.resp == Resp::First {
                ctx.counters.responses_without_request += 1;
            }
            return;
        };
        let b0 = b.first().copied().unwrap_or(0);
        let is_eof = b0 == 0xfe && len < 9;
        let mut done = false;
        let terminator_more = |b: &[u8]| -> bool {
            // EOF packet: fe warnings(2) status(2); OK packet with fe header: fe lenenc lenenc status(2)
            let status = if len == 5 {
                le16(b, 3)
            } else {
                let mut o = 1;
                lenenc(b, &mut o).and_then(|_| lenenc(b, &mut o)).and_then(|_| le16(b, o))
            };
            status.unwrap_or(0) & MORE_RESULTS != 0
        };
        match self.resp {
            Resp::First => match b0 {
                0x00 if front.kind == K_PREPARE && len >= 9 => {
                    let id = u32::from_le_bytes([b[1], b[2], b[3], b[4]]);
                    let ncols = le16(b, 5).unwrap_or(0);
                    let nparams = le16(b, 7).unwrap_or(0);
                    let fp = front.label.strip_prefix("PREPARE ").unwrap_or(&front.label).to_string();
                    if self.stmts.len() < 100_000 {
                        self.stmts.insert(id, fp);
                    }
                    front.status = Status::Ok;
                    if nparams > 0 {
                        self.resp = Resp::PrepParams(nparams, ncols);
                    } else if ncols > 0 {
                        self.resp = Resp::PrepCols(ncols);
                    } else {
                        done = true;
                    }
                }
                0x00 => {
                    if !front.status.is_error() {
                        front.status = Status::Ok;
                    }
                    let mut o = 1;
                    let status = lenenc(b, &mut o).and_then(|_| lenenc(b, &mut o)).and_then(|_| le16(b, o)).unwrap_or(0);
                    done = status & MORE_RESULTS == 0;
                }
                0xff => {
                    front.status = Status::MyErr(le16(b, 1).unwrap_or(0));
                    done = true;
                }
                0xfe if is_eof => {
                    if !front.status.is_error() {
                        front.status = Status::Ok;
                    }
                    done = true;
                }
                0xfb => {
                    // LOCAL INFILE request: the client sends the file, the server then answers OK
                }
                _ if front.kind == K_FETCH || front.kind == K_FIELDS => {
                    self.resp = Resp::Rows;
                }
                _ => {
                    let mut o = 0;
                    let n = lenenc(b, &mut o).unwrap_or(0);
                    self.resp = if n == 0 { Resp::Rows } else { Resp::Cols(n) };
                    if front.status == Status::None {
                        front.status = Status::Ok; // a result set: OK unless an ERR ends it
                    }
                }
            },
            Resp::Cols(n) => {
                self.resp = if n > 1 {
                    Resp::Cols(n - 1)
                } else if self.deprecate_eof == Some(true) {
                    Resp::Rows
                } else {
                    Resp::ColsEof
                };
            }
            Resp::ColsEof if is_eof && (len == 5 || self.deprecate_eof == Some(false)) => self.resp = Resp::Rows,
            Resp::ColsEof | Resp::Rows => {
                if is_eof {
                    if !front.status.is_error() {
                        front.status = Status::Ok;
                    }
                    if terminator_more(b) {
                        self.resp = Resp::First;
                    } else {
                        done = true;
                    }
                } else if b0 == 0xff {
                    front.status = Status::MyErr(le16(b, 1).unwrap_or(0));
                    done = true;
                } else {
                    self.resp = Resp::Rows;
                }
            }
            Resp::PrepParams(np, nc) => {
                self.resp = if np > 1 {
                    Resp::PrepParams(np - 1, nc)
                } else if self.deprecate_eof == Some(true) {
                    if nc > 0 {
                        Resp::PrepCols(nc)
                    } else {
                        done = true;
                        Resp::First
                    }
                } else {
                    Resp::PrepParamsEof(nc)
                };
            }
            Resp::PrepParamsEof(nc) => {
                if is_eof {
                    if nc > 0 {
                        self.resp = Resp::PrepCols(nc);
                    } else {
                        done = true;
                    }
                } else if nc > 1 {
                    self.resp = Resp::PrepCols(nc - 1); // no EOF after all: this was a column
                } else if nc == 1 {
                    self.resp = Resp::PrepColsEof;
                } else {
                    done = true;
                }
            }
            Resp::PrepCols(nc) => {
                if nc > 1 {
                    self.resp = Resp::PrepCols(nc - 1);
                } else if self.deprecate_eof == Some(true) {
                    done = true;
                } else {
                    self.resp = Resp::PrepColsEof;
                }
            }
            Resp::PrepColsEof => done = true,
        }
        if done {
            self.resp = Resp::First;
            self.pending.finish_front(ctx);
        }
    }
}

impl Protocol for My {
    fn client(&mut self, ctx: &mut Ctx, data: &[u8], missing: u32) {
        if self.phase == Phase::Opaque {
            return;
        }
        if self.c_first {
            self.c_first = false;
            if !Self::sniff_client(data) {
                self.c.lost = true;
            }
        }
        if self.c.lost && Self::sniff_client(data) {
            self.c.reset();
            ctx.counters.resynced += 1;
        }
        let mut inp = Input::new(data, missing);
        loop {
            match self.c.step(&mut inp, ctx.ts) {
                Step::More => break,
                Step::Lost => ctx.counters.framing_lost += 1,
                Step::Start => self.client_start(ctx),
                Step::End => end_message(self, |p| &mut p.c, inp.kept, |p, body, cut| p.client_end(ctx, body, cut)),
            }
        }
        let skipped = std::mem::take(&mut self.c.skipped);
        if skipped > 0 {
            match self.pending.q.back_mut() {
                Some(e) if self.phase == Phase::Command => e.bytes_in += skipped,
                _ => ctx.counters.unparsed_bytes += skipped,
            }
        }
    }

    fn server(&mut self, ctx: &mut Ctx, data: &[u8], missing: u32) {
        if self.phase == Phase::Opaque {
            return;
        }
        if self.c.lost || (self.c.mid_message() && self.phase == Phase::Command) {
            self.c.reset(); // a direction change: the client's next bytes start a packet
        }
        if self.s_first {
            self.s_first = false;
            if Self::sniff_server(data) {
                self.phase = Phase::Handshake { greeting: false, client_resp: false };
            } else if self.pending.q.is_empty() {
                self.s.lost = true; // the tail of a response whose command was not captured
            }
        }
        let mut inp = Input::new(data, missing);
        loop {
            match self.s.step(&mut inp, ctx.ts) {
                Step::More => break,
                Step::Lost => ctx.counters.framing_lost += 1,
                Step::Start => {
                    self.s.cap = SERVER_CAP;
                    if self.phase == Phase::Command && !self.pending.credit_out(self.s.wire as u64, ctx.ts) {
                        ctx.counters.unparsed_bytes += self.s.wire as u64;
                    }
                }
                Step::End => end_message(self, |p| &mut p.s, inp.kept, |p, body, _| p.server_end(ctx, body)),
            }
        }
        let skipped = std::mem::take(&mut self.s.skipped);
        if skipped > 0 && (self.phase != Phase::Command || !self.pending.credit_out(skipped, ctx.ts)) {
            ctx.counters.unparsed_bytes += skipped;
        }
    }

    fn close(&mut self, ctx: &mut Ctx, last_ts: i64) {
        self.pending.drain_at_close(ctx, last_ts, flag::DELIMITED_BY_TURN);
    }

    fn exchange_for_gap(&mut self, from_client: bool) -> Option<&mut Exchange> {
        if from_client {
            self.pending.q.back_mut()
        } else {
            self.pending.q.front_mut()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::exchange::ProtoCounters;
    use super::*;

    fn pkt(seq: u8, body: &[u8]) -> Vec<u8> {
        let l = body.len() as u32;
        let mut p = vec![l as u8, (l >> 8) as u8, (l >> 16) as u8, seq];
        p.extend_from_slice(body);
        p
    }

    struct T {
        p: My,
        out: Vec<Exchange>,
        c: ProtoCounters,
        ts: i64,
    }
    impl T {
        fn send(&mut self, client: bool, d: &[u8]) {
            self.ts += 10;
            let mut ctx = Ctx { ts: self.ts, pkt: self.ts as u64, conn_flags: 0, out: &mut self.out, counters: &mut self.c };
            if client {
                self.p.client(&mut ctx, d, 0)
            } else {
                self.p.server(&mut ctx, d, 0)
            }
        }
    }

    fn greeting(deprecate: bool) -> Vec<u8> {
        let mut g = vec![10];
        g.extend_from_slice(b"10.11.6-MariaDB\0");
        g.extend_from_slice(&[1, 0, 0, 0]);
        g.extend_from_slice(&[b'a'; 8]);
        g.push(0);
        let caps: u32 = 0xf7fe | if deprecate { CLIENT_DEPRECATE_EOF } else { 0 };
        g.extend_from_slice(&(caps as u16).to_le_bytes());
        g.push(8);
        g.extend_from_slice(&[2, 0]);
        g.extend_from_slice(&((caps >> 16) as u16).to_le_bytes());
        g.extend_from_slice(&[0; 11]);
        pkt(0, &g)
    }

    fn handshake(t: &mut T, deprecate: bool) {
        t.send(false, &greeting(deprecate));
        let caps: u32 = 0x000fa685 | if deprecate { CLIENT_DEPRECATE_EOF } else { 0 };
        let mut r = caps.to_le_bytes().to_vec();
        r.extend_from_slice(&[0; 28]);
        r.extend_from_slice(b"root\0\0");
        t.send(true, &pkt(1, &r));
        t.send(false, &pkt(2, &[0, 0, 0, 2, 0, 0, 0]));
    }

    fn coldef() -> Vec<u8> {
        let mut c = vec![3];
        c.extend_from_slice(b"def");
        c.extend_from_slice(&[0; 20]);
        c
    }

    #[test]
    fn query_result_set_with_eof_and_error() {
        let mut t = T { p: My::new(true), out: vec![], c: ProtoCounters::default(), ts: 0 };
        handshake(&mut t, false);
        assert!(t.out.is_empty());
        t.send(true, &pkt(0, b"\x03SELECT id, name FROM users WHERE id = 5"));
        let mut r = pkt(1, &[2]);
        r.extend(pkt(2, &coldef()));
        r.extend(pkt(3, &coldef()));
        r.extend(pkt(4, &[0xfe, 0, 0, 2, 0]));
        r.extend(pkt(5, b"\x015\x03bob"));
        t.send(false, &r);
        assert!(t.out.is_empty());
        t.send(false, &pkt(6, &[0xfe, 0, 0, 2, 0]));
        assert_eq!(t.out.len(), 1);
        assert_eq!((t.out[0].label.as_str(), t.out[0].status, t.out[0].departure_ns), ("SELECT id, name FROM users WHERE id = ?", Status::Ok, 60));
        assert_eq!(t.out[0].bytes_out, (r.len() + 9) as u64);
        t.send(true, &pkt(0, b"\x03SELEC nonsense"));
        t.send(false, &pkt(1, b"\xff\x28\x04#42000You have an error"));
        assert_eq!(t.out[1].status, Status::MyErr(1064));
    }

    #[test]
    fn prepared_statement_prepare_execute_close_deprecate_eof() {
        let mut t = T { p: My::new(true), out: vec![], c: ProtoCounters::default(), ts: 0 };
        handshake(&mut t, true);
        t.send(true, &pkt(0, b"\x16SELECT name FROM users WHERE id = ?"));
        let mut r = pkt(1, &[0, 7, 0, 0, 0, 1, 0, 1, 0, 0, 0, 0]);
        r.extend(pkt(2, &coldef()));
        r.extend(pkt(3, &coldef()));
        t.send(false, &r);
        assert_eq!(t.out.len(), 1);
        assert_eq!(t.out[0].label, "PREPARE SELECT name FROM users WHERE id = ?");
        t.send(true, &pkt(0, &[0x17, 7, 0, 0, 0, 0, 1, 0, 0, 0, 0, 1, 3, 0, 5, 0, 0, 0, 0, 0, 0, 0]));
        let mut r = pkt(1, &[1]);
        r.extend(pkt(2, &coldef()));
        r.extend(pkt(3, &[0, 0, 3, b'b', b'o', b'b']));
        r.extend(pkt(4, &[0xfe, 0, 0, 2, 0, 0, 0]));
        t.send(false, &r);
        assert_eq!(t.out.len(), 2);
        assert_eq!((t.out[1].label.as_str(), t.out[1].status), ("SELECT name FROM users WHERE id = ?", Status::Ok));
        t.send(true, &pkt(0, &[0x19, 7, 0, 0, 0]));
        t.send(true, &pkt(0, &[0x01]));
        assert_eq!(t.out.len(), 2);
        assert_eq!(t.c.no_response_commands, 2);
    }

    #[test]
    fn multi_results_follow_more_results_flag() {
        let mut t = T { p: My::new(false), out: vec![], c: ProtoCounters::default(), ts: 0 };
        t.send(true, &pkt(0, b"\x03CALL p()"));
        t.send(false, &pkt(1, &[0, 0, 0, 0x0a, 0, 0, 0]));
        assert!(t.out.is_empty());
        t.send(false, &pkt(2, &[0, 1, 0, 0x02, 0, 0, 0]));
        assert_eq!(t.out.len(), 1);
        assert_eq!(t.out[0].label, "CALL p()");
    }
}
