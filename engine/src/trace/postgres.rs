//! PostgreSQL frontend/backend protocol v3.
//!
//! * Startup (StartupMessage, SSLRequest/GSSENCRequest answered `N`, authentication, parameter
//!   status) up to the first ReadyForQuery is not a request. An `S`/`G` answer means TLS: the
//!   connection is counted and skipped.
//! * Simple query: one request per `Query`, ended by `ReadyForQuery`.
//! * Extended query: `Parse`/`Bind`/`Describe`/`Execute`/`Close`/`Flush` up to `Sync` are one
//!   request, ended by the `ReadyForQuery` answering that `Sync`. Named statements are remembered
//!   per connection so an `Execute` of a statement prepared earlier gets its SQL fingerprint.
//! * Errors: `ErrorResponse` sets the status to the SQLSTATE (`42P01`...); otherwise `OK`.

use std::collections::HashMap;
use std::rc::Rc;

use super::exchange::{flag, Ctx, Exchange, Pending, Protocol, Status};
use super::framer::{end_message, pg_plausible, Framer, Input, Mode, Step};
use super::label::{sql_fingerprint, Dialect, FingerprintCache};

pub const CLIENT_TYPES: &[u8] = b"BCDEFHPQSXdcfp";
pub const SERVER_TYPES: &[u8] = b"RKSZTDCENI123nstGHWAVvcd";
const SQL_CAP: usize = 4096;

const SSL_REQUEST: u32 = 80877103;
const GSSENC_REQUEST: u32 = 80877104;
const CANCEL_REQUEST: u32 = 80877102;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    /// waiting for the startup message (or an SSL request)
    Startup,
    /// authentication and parameter status, until the first ReadyForQuery
    Auth,
    Ready,
    /// TLS or a cancel request: nothing to decode
    Opaque,
}

#[derive(Default)]
struct Batch {
    ex: Option<Exchange>,
    parse_label: Option<Rc<str>>,
    exec_label: Option<Rc<str>>,
    closes: bool,
}

pub struct Pg {
    c: Framer,
    s: Framer,
    phase: Phase,
    pending: Pending,
    /// a simple Query or FunctionCall being received
    cur: Option<Exchange>,
    batch: Batch,
    /// prepared statement name -> SQL fingerprint
    stmts: HashMap<Vec<u8>, Rc<str>>,
    /// the unnamed statement's fingerprint
    unnamed: Option<Rc<str>>,
    /// Parse texts repeat on a connection (one Parse per Sync with the unnamed statement)
    fingerprints: FingerprintCache,
    c_first: bool,
    s_first: bool,
}

impl Pg {
    /// `saw_start`: the connection's SYN was in the capture, so the startup phase follows.
    pub fn new(saw_start: bool) -> Self {
        let mut c = Framer::new(if saw_start { Mode::PgUntyped } else { Mode::PgTyped }, CLIENT_TYPES);
        let s = Framer::new(Mode::PgTyped, SERVER_TYPES);
        c.lost = false;
        Pg {
            c,
            s,
            phase: if saw_start { Phase::Startup } else { Phase::Ready },
            pending: Pending::default(),
            cur: None,
            batch: Batch::default(),
            stmts: HashMap::new(),
            unnamed: None,
            fingerprints: FingerprintCache::new(Dialect::Postgres),
            c_first: !saw_start,
            s_first: !saw_start,
        }
    }

    /// Does a client's first payload look like PostgreSQL (startup, SSL request, or a typed message)?
    pub fn sniff_client(d: &[u8]) -> bool {
        if d.len() >= 8 {
            let l = u32::from_be_bytes([d[0], d[1], d[2], d[3]]);
            let code = u32::from_be_bytes([d[4], d[5], d[6], d[7]]);
            if (8..=10_000).contains(&l) && matches!(code, 196608 | SSL_REQUEST | GSSENC_REQUEST | CANCEL_REQUEST) {
                return true;
            }
        }
        d.len() >= 5 && matches!(d[0], b'Q' | b'P') && pg_plausible(d, CLIENT_TYPES)
    }

    fn start_request(&mut self, ctx: &mut Ctx, arrival: i64) -> Exchange {
        if self.s.lost || self.s.mid_message() {
            // the previous response's framing was lost: it ended with its last byte seen
            self.pending.finish_answered_by_turn(ctx);
            self.s.reset();
        }
        Exchange::new(arrival, 0)
    }

    fn close_batch(&mut self, ctx: &mut Ctx, extra_flags: u16) {
        let b = std::mem::take(&mut self.batch);
        if let Some(mut ex) = b.ex {
            ex.label = if let Some(l) = b.exec_label {
                l.to_string()
            } else if let Some(p) = b.parse_label {
                if extra_flags & flag::DELIMITED_BY_TURN != 0 {
                    p.to_string() // cut before its Bind/Execute could be seen
                } else {
                    format!("PREPARE {p}")
                }
            } else if b.closes {
                "CLOSE".into()
            } else {
                "SYNC".into()
            };
            ex.flags |= extra_flags;
            self.pending.push(ex, ctx);
        }
    }

    fn client_start(&mut self, ctx: &mut Ctx) {
        let (typ, wire, ts) = (self.c.typ, self.c.wire as u64, self.c.msg_ts);
        if self.c.mode == Mode::PgUntyped {
            self.c.cap = 8;
        }
        if self.phase == Phase::Auth && self.c.mode == Mode::PgTyped && typ != b'p' {
            // A query after authentication: the server's ReadyForQuery was sent but not seen
            // (cut by the snapshot length along with the parameter status messages).
            self.phase = Phase::Ready;
            self.s.reset();
        }
        if self.phase != Phase::Ready || self.c.mode != Mode::PgTyped {
            return;
        }
        match typ {
            b'Q' | b'F' => {
                let mut ex = self.start_request(ctx, ts);
                ex.bytes_in = wire;
                self.cur = Some(ex);
                self.c.cap = if typ == b'Q' { SQL_CAP } else { 0 };
            }
            b'P' | b'B' | b'D' | b'E' | b'C' | b'H' | b'S' => {
                if self.batch.ex.is_none() {
                    self.batch.ex = Some(self.start_request(ctx, ts));
                }
                if let Some(b) = self.batch.ex.as_mut() {
                    b.bytes_in += wire;
                }
                self.c.cap = match typ {
                    b'P' => SQL_CAP,
                    b'B' => 512,
                    _ => 0,
                };
            }
            b'd' | b'c' | b'f' => {
                if let Some(e) = self.pending.q.back_mut() {
                    e.bytes_in += wire;
                }
            }
            b'X' => ctx.counters.no_response_commands += 1,
            _ => {}
        }
    }

    fn client_end(&mut self, ctx: &mut Ctx, body: &[u8], cut: bool) {
        if self.c.mode == Mode::PgUntyped {
            let code = if body.len() >= 4 { u32::from_be_bytes([body[0], body[1], body[2], body[3]]) } else { 0 };
            match code {
                SSL_REQUEST | GSSENC_REQUEST => self.s.mode = Mode::PgByte,
                CANCEL_REQUEST => {
                    ctx.counters.no_response_commands += 1;
                    self.phase = Phase::Opaque;
                }
                _ => {
                    self.c.mode = Mode::PgTyped;
                    self.phase = Phase::Auth;
                }
            }
            return;
        }
        if self.phase != Phase::Ready {
            return;
        }
        match self.c.typ {
            b'Q' => {
                if let Some(mut ex) = self.cur.take() {
                    let sql = cstr(body);
                    let (label, rid) = sql_fingerprint(sql, Dialect::Postgres, cut && sql.len() == body.len());
                    ex.label = label;
                    ex.request_id = rid;
                    if cut {
                        ex.flags |= flag::TRUNCATED;
                    }
                    self.pending.push(ex, ctx);
                }
            }
            b'F' => {
                if let Some(mut ex) = self.cur.take() {
                    ex.label = "FUNCTION CALL".into();
                    self.pending.push(ex, ctx);
                }
            }
            b'P' => {
                let name = cstr(body);
                let rest = body.get(name.len() + 1..).unwrap_or(b"");
                let sql = cstr(rest);
                let (label, rid) = self.fingerprints.fingerprint(sql, cut && sql.len() == rest.len());
                if let Some(b) = self.batch.ex.as_mut() {
                    if b.request_id.is_none() {
                        b.request_id = rid;
                    }
                    if cut {
                        b.flags |= flag::TRUNCATED;
                    }
                }
                if name.is_empty() {
                    // the unnamed statement: the common case (one Parse per Sync), kept without a map
                    self.unnamed = Some(label.clone());
                } else if self.stmts.len() < 10_000 || self.stmts.contains_key(name) {
                    self.stmts.insert(name.to_vec(), label.clone());
                }
                if self.batch.parse_label.is_none() {
                    self.batch.parse_label = Some(label);
                }
            }
            b'B' => {
                let portal = cstr(body);
                let stmt = cstr(body.get(portal.len() + 1..).unwrap_or(b""));
                if self.batch.exec_label.is_none() {
                    let known = if stmt.is_empty() { self.unnamed.as_ref() } else { self.stmts.get(stmt) };
                    self.batch.exec_label = Some(match known {
                        Some(l) => l.clone(),
                        None if stmt.is_empty() => "EXECUTE (unnamed statement)".into(),
                        None => format!("EXECUTE {}", String::from_utf8_lossy(stmt)).into(),
                    });
                }
            }
            b'C' => self.batch.closes = true,
            b'S' => self.close_batch(ctx, 0),
            _ => {}
        }
    }
}

/// The bytes up to the first NUL (all of `b` when there is none).
fn cstr(b: &[u8]) -> &[u8] {
    match memchr::memchr(0, b) {
        Some(p) => &b[..p],
        None => b,
    }
}

/// The `C` field (SQLSTATE) of an ErrorResponse body.
fn sqlstate(body: &[u8]) -> Option<[u8; 5]> {
    let mut o = 0;
    while o < body.len() && body[o] != 0 {
        let field = body[o];
        let v = cstr(&body[o + 1..]);
        if field == b'C' && v.len() == 5 {
            return Some([v[0], v[1], v[2], v[3], v[4]]);
        }
        o += 1 + v.len() + 1;
    }
    None
}

impl Protocol for Pg {
    fn client(&mut self, ctx: &mut Ctx, data: &[u8], missing: u32) {
        if self.phase == Phase::Opaque {
            return;
        }
        if self.c_first {
            self.c_first = false;
            if Self::sniff_client(data) && data.len() >= 8 && data[0] == 0 {
                self.c.mode = Mode::PgUntyped;
                self.phase = Phase::Startup;
            } else if !pg_plausible(data, CLIENT_TYPES) {
                self.c.lost = true;
            }
        }
        if self.c.lost && !self.c.mid_message() && pg_plausible(data, CLIENT_TYPES) {
            self.c.reset();
            ctx.counters.resynced += 1;
        }
        let mut inp = Input::new(data, missing);
        loop {
            match self.c.step(&mut inp, ctx.ts) {
                Step::More => break,
                Step::Lost => {
                    ctx.counters.framing_lost += 1;
                    if let Some(b) = self.batch.ex.as_mut() {
                        b.flags |= flag::TRUNCATED;
                    }
                }
                Step::Start => self.client_start(ctx),
                Step::End => end_message(self, |p| &mut p.c, inp.kept, |p, body, cut| p.client_end(ctx, body, cut)),
            }
        }
        let skipped = std::mem::take(&mut self.c.skipped);
        if skipped > 0 {
            match self.cur.as_mut().or(self.batch.ex.as_mut()) {
                Some(e) => e.bytes_in += skipped,
                None => ctx.counters.unparsed_bytes += skipped,
            }
        }
    }

    fn server(&mut self, ctx: &mut Ctx, data: &[u8], missing: u32) {
        if self.phase == Phase::Opaque {
            return;
        }
        // A direction change: a client message cut by the snapshot length ends here.
        if self.c.lost || (self.c.mid_message() && self.phase == Phase::Ready) {
            if let Some(mut ex) = self.cur.take() {
                ex.flags |= flag::TRUNCATED | flag::DELIMITED_BY_TURN;
                if ex.label.is_empty() {
                    ex.label = "? [truncated]".into();
                }
                self.pending.push(ex, ctx);
            }
            if self.batch.ex.is_some() {
                self.close_batch(ctx, flag::TRUNCATED | flag::DELIMITED_BY_TURN);
            }
            self.c.reset();
        }
        if self.s_first {
            self.s_first = false;
            if !pg_plausible(data, SERVER_TYPES) {
                self.s.lost = true;
            }
        }
        if self.s.lost && pg_plausible(data, SERVER_TYPES) {
            self.s.reset();
            ctx.counters.resynced += 1;
        }
        let mut inp = Input::new(data, missing);
        loop {
            match self.s.step(&mut inp, ctx.ts) {
                Step::More => break,
                Step::Lost => ctx.counters.framing_lost += 1,
                Step::Start => {
                    let t = self.s.typ;
                    if self.s.mode == Mode::PgByte {
                        self.s.mode = Mode::PgTyped;
                        if t == b'N' {
                            continue; // TLS refused: the client sends its startup message next
                        }
                        ctx.counters.tls_connections += 1;
                        self.phase = Phase::Opaque;
                        return;
                    }
                    if self.phase == Phase::Ready {
                        let wire = self.s.wire as u64;
                        if !self.pending.credit_out(wire, ctx.ts) {
                            if let Some(b) = self.batch.ex.as_mut() {
                                b.bytes_out += wire;
                            }
                        }
                    }
                    self.s.cap = if t == b'E' { 512 } else { 0 };
                }
                Step::End => {
                    let t = self.s.typ;
                    match (self.phase, t) {
                        (Phase::Ready, b'E') => {
                            let code = sqlstate(self.s.body_of(&inp));
                            if let Some(f) = self.pending.front() {
                                if !f.status.is_error() {
                                    f.status = code.map(Status::SqlState).unwrap_or(Status::SqlState(*b"?????"));
                                }
                            }
                        }
                        (Phase::Ready, b'Z') => {
                            if let Some(f) = self.pending.front() {
                                if f.status == Status::None {
                                    f.status = Status::Ok;
                                }
                                self.pending.finish_front(ctx);
                            } else {
                                ctx.counters.responses_without_request += 1;
                            }
                        }
                        (Phase::Ready, b'C' | b'D' | b's' | b'I') => {
                            // the statement ran: OK unless an error follows (kept if the
                            // ReadyForQuery is cut away by the snapshot length)
                            if let Some(f) = self.pending.front() {
                                if f.status == Status::None {
                                    f.status = Status::Ok;
                                }
                            }
                        }
                        (Phase::Auth | Phase::Startup, b'Z') => self.phase = Phase::Ready,
                        _ => {}
                    }
                }
            }
        }
        let skipped = std::mem::take(&mut self.s.skipped);
        if skipped > 0 && (self.phase != Phase::Ready || !self.pending.credit_out(skipped, ctx.ts)) {
            ctx.counters.unparsed_bytes += skipped;
        }
    }

    fn close(&mut self, ctx: &mut Ctx, last_ts: i64) {
        if let Some(ex) = self.cur.take() {
            self.pending.push(ex, ctx);
        }
        self.close_batch(ctx, 0);
        self.pending.drain_at_close(ctx, last_ts, flag::DELIMITED_BY_TURN);
    }

    fn exchange_for_gap(&mut self, from_client: bool) -> Option<&mut Exchange> {
        if from_client {
            self.cur.as_mut().or(self.batch.ex.as_mut())
        } else {
            self.pending.q.front_mut()
        }
    }
}

#[cfg(test)]
pub mod tests {
    use super::super::exchange::ProtoCounters;
    use super::*;

    pub fn msg(t: u8, body: &[u8]) -> Vec<u8> {
        let mut m = vec![t];
        m.extend_from_slice(&(body.len() as u32 + 4).to_be_bytes());
        m.extend_from_slice(body);
        m
    }

    fn startup() -> Vec<u8> {
        let body = b"\x00\x03\x00\x00user\0u\0\0";
        let mut m = (body.len() as u32 + 4).to_be_bytes().to_vec();
        m.extend_from_slice(body);
        m
    }

    struct T {
        p: Pg,
        out: Vec<Exchange>,
        c: ProtoCounters,
        ts: i64,
    }
    impl T {
        fn new(saw_start: bool) -> Self {
            T { p: Pg::new(saw_start), out: vec![], c: ProtoCounters::default(), ts: 0 }
        }
        fn send(&mut self, client: bool, d: &[u8], missing: u32) {
            self.ts += 10;
            let mut ctx = Ctx { ts: self.ts, pkt: self.ts as u64, conn_flags: 0, out: &mut self.out, counters: &mut self.c };
            if client {
                self.p.client(&mut ctx, d, missing)
            } else {
                self.p.server(&mut ctx, d, missing)
            }
        }
    }

    fn ready() -> Vec<u8> {
        msg(b'Z', b"I")
    }

    #[test]
    fn startup_ssl_refusal_auth_not_counted_then_simple_and_extended() {
        let mut t = T::new(true);
        t.send(true, &[0, 0, 0, 8, 4, 0xd2, 0x16, 0x2f], 0); // SSLRequest
        t.send(false, b"N", 0);
        t.send(true, &startup(), 0);
        let mut auth = msg(b'R', &[0, 0, 0, 0]);
        auth.extend(msg(b'S', b"a\0b\0"));
        auth.extend(msg(b'K', &[0; 8]));
        auth.extend(ready());
        t.send(false, &auth, 0);
        assert!(t.out.is_empty());
        t.send(true, &msg(b'Q', b"SELECT 1 /*request_id='q1'*/\0"), 0);
        let mut r = msg(b'T', b"x");
        r.extend(msg(b'D', b"y"));
        r.extend(msg(b'C', b"SELECT 1\0"));
        t.send(false, &r, 0);
        t.send(false, &ready(), 0);
        assert_eq!(t.out.len(), 1);
        assert_eq!((t.out[0].label.as_str(), t.out[0].status, t.out[0].arrival_ns, t.out[0].departure_ns), ("SELECT ?", Status::Ok, 50, 70));
        assert_eq!(t.out[0].request_id.as_deref(), Some("q1"));
        // extended: P B D E S in one segment; an error
        let mut e = msg(b'P', b"\0SELECT * FROM nope WHERE a = $1\0\0\0");
        e.extend(msg(b'B', b"\0\0\0\0\0\0\0\0"));
        e.extend(msg(b'D', b"P\0"));
        e.extend(msg(b'E', b"\0\0\0\0\0"));
        e.extend(msg(b'S', b""));
        t.send(true, &e, 0);
        let mut r = msg(b'E', b"SERROR\0C42P01\0Mrelation does not exist\0\0");
        r.extend(ready());
        t.send(false, &r, 0);
        assert_eq!(t.out.len(), 2);
        assert_eq!(t.out[1].label, "SELECT * FROM nope WHERE a = ?");
        assert_eq!(t.out[1].status, Status::SqlState(*b"42P01"));
        assert_eq!(t.out[1].bytes_in, e.len() as u64);
        assert_eq!(t.out[1].bytes_out, r.len() as u64);
    }

    #[test]
    fn named_statement_execute_gets_its_sql() {
        let mut t = T::new(false);
        let mut p = msg(b'P', b"s1\0UPDATE t SET a = $1\0\0\0");
        p.extend(msg(b'S', b""));
        t.send(true, &p, 0);
        let mut r = msg(b'1', b"");
        r.extend(ready());
        t.send(false, &r, 0);
        let mut b = msg(b'B', b"\0s1\0\0\0\0\0\0\0");
        b.extend(msg(b'E', b"\0\0\0\0\0"));
        b.extend(msg(b'S', b""));
        t.send(true, &b, 0);
        t.send(false, &ready(), 0);
        assert_eq!(t.out[0].label, "PREPARE UPDATE t SET a = ?");
        assert_eq!(t.out[1].label, "UPDATE t SET a = ?");
    }

    #[test]
    fn snapshot_cut_batch_is_closed_at_the_direction_change() {
        let mut t = T::new(false);
        let mut e = msg(b'P', &[b"\0SELECT ".as_ref(), &[b'x'; 300], b"\0\0\0"].concat());
        e.extend(msg(b'B', b"\0\0\0\0\0\0\0\0"));
        e.extend(msg(b'E', b"\0\0\0\0\0"));
        e.extend(msg(b'S', b""));
        let keep = 200;
        t.send(true, &e[..keep], (e.len() - keep) as u32);
        t.send(false, &[msg(b'1', b""), msg(b'2', b""), msg(b'C', b"SELECT\0"), ready()].concat(), 0);
        assert_eq!(t.out.len(), 1);
        assert!(t.out[0].label.starts_with("SELECT xxx") && t.out[0].label.ends_with("[truncated]"), "{}", t.out[0].label);
        assert_eq!(t.out[0].status, Status::Ok);
        // the next request parses normally
        t.send(true, &msg(b'Q', b"BEGIN\0"), 0);
        t.send(false, &ready(), 0);
        assert_eq!(t.out[1].label, "BEGIN");
    }

    #[test]
    fn mid_stream_skips_the_tail_of_a_response() {
        let mut t = T::new(false);
        t.send(false, b"garbage tail of a data row", 0);
        t.send(true, &msg(b'Q', b"SELECT 2\0"), 0);
        t.send(false, &[msg(b'C', b"SELECT 1\0"), ready()].concat(), 0);
        assert_eq!(t.out.len(), 1);
        assert_eq!(t.out[0].label, "SELECT ?");
    }
}
