//! HTTP/1.x: requests and responses on one connection, paired in order (FIFO, as RFC 9112 requires,
//! so pipelined requests pair correctly and carry the `pipelined` flag).
//!
//! Message ends come from the framing: Content-Length, chunked transfer coding, no body (HEAD,
//! 1xx, 204, 304), or the connection's close. When the framing is lost (a header cut by the
//! snapshot length, a missing packet), the response runs until the client's next request or the
//! next segment starting with `HTTP/1.` (the direction change), flagged `delimited_by_turn`.

use super::exchange::{flag, Ctx, Exchange, Pending, Protocol, Status};
use super::label::{http_label, url_decode};

const MAX_HEAD: usize = 64 * 1024;
const KIND_HEAD: u8 = 1;

#[derive(Debug, Clone, Copy, PartialEq)]
enum Chunk {
    Size { val: u64, ext: bool, digits: u8 },
    Data(u64),
    DataEnd,
    Trailer { empty: bool },
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum St {
    Idle,
    Head,
    Body(u64),
    Chunked(Chunk),
    UntilClose,
    Lost,
}

#[derive(Debug)]
struct Side {
    st: St,
    buf: Vec<u8>,
}

impl Side {
    fn new() -> Self {
        Side { st: St::Idle, buf: Vec::new() }
    }
}

pub struct Http {
    req: Side,
    resp: Side,
    building: Option<Exchange>,
    pending: Pending,
    /// the connection switched protocols (101): nothing more to parse
    upgraded: bool,
}

const METHODS: [&[u8]; 9] = [b"GET ", b"POST ", b"PUT ", b"HEAD ", b"DELETE ", b"OPTIONS ", b"PATCH ", b"TRACE ", b"CONNECT "];

/// Does `d` begin with an HTTP request line?
pub fn starts_request(d: &[u8]) -> bool {
    METHODS.iter().any(|m| d.len() >= m.len() && &d[..m.len()] == *m)
}

/// Does `d` begin with an HTTP response's status line?
pub fn starts_response(d: &[u8]) -> bool {
    d.len() >= 7 && &d[..7] == b"HTTP/1."
}

/// Feed chunked-body bytes; returns (bytes consumed, body complete).
fn chunk_feed(c: &mut Chunk, d: &[u8]) -> (usize, bool) {
    let mut i = 0;
    while i < d.len() {
        match c {
            Chunk::Size { val, ext, digits } => {
                let b = d[i];
                i += 1;
                if b == b'\n' {
                    if *val == 0 {
                        *c = Chunk::Trailer { empty: true };
                    } else {
                        *c = Chunk::Data(*val);
                    }
                } else if !*ext {
                    if let Some(h) = (b as char).to_digit(16) {
                        if *digits < 16 {
                            *val = (*val << 4) | h as u64;
                            *digits += 1;
                        }
                    } else if b == b';' || b == b' ' || b == b'\t' {
                        *ext = true;
                    }
                }
            }
            Chunk::Data(n) => {
                let take = (*n).min((d.len() - i) as u64);
                *n -= take;
                i += take as usize;
                if *n == 0 {
                    *c = Chunk::DataEnd;
                }
            }
            Chunk::DataEnd => {
                let b = d[i];
                i += 1;
                if b == b'\n' {
                    *c = Chunk::Size { val: 0, ext: false, digits: 0 };
                }
            }
            Chunk::Trailer { empty } => {
                let b = d[i];
                i += 1;
                if b == b'\n' {
                    if *empty {
                        return (i, true);
                    }
                    *empty = true;
                } else if b != b'\r' {
                    *empty = false;
                }
            }
        }
    }
    (i, false)
}

/// The blank line ending a head: one searcher for the whole run (building one per call cost as
/// much as the search on short heads).
static HEAD_END: std::sync::LazyLock<memchr::memmem::Finder<'static>> = std::sync::LazyLock::new(|| memchr::memmem::Finder::new(b"\r\n\r\n"));

/// Accumulate head bytes; returns (bytes of `d` consumed, Some(head length) when the blank line
/// ending the head was found). Parse from `head_bytes(buf, d, len)`.
fn head_feed(buf: &mut Vec<u8>, d: &[u8]) -> (usize, Option<usize>) {
    if buf.is_empty() {
        if let Some(p) = HEAD_END.find(d) {
            return (p + 4, Some(p + 4));
        }
        let take = d.len().min(MAX_HEAD);
        buf.extend_from_slice(&d[..take]);
        return (take, None);
    }
    let old = buf.len();
    let from = old.saturating_sub(3);
    let take = d.len().min(MAX_HEAD.saturating_sub(old).max(1));
    buf.extend_from_slice(&d[..take]);
    if let Some(p) = HEAD_END.find(&buf[from..]) {
        let end = from + p + 4;
        buf.truncate(end);
        return (end - old, Some(end));
    }
    (take, None)
}

struct Head<'a> {
    first: &'a [u8],
    content_length: Option<u64>,
    chunked: bool,
    request_id: Option<&'a [u8]>,
}

fn parse_head(h: &[u8]) -> Head<'_> {
    let mut lines = memchr::memchr_iter(b'\n', h);
    let first_end = lines.next().unwrap_or(h.len());
    let first = &h[..first_end];
    let first = first.strip_suffix(b"\r").unwrap_or(first);
    let mut head = Head { first, content_length: None, chunked: false, request_id: None };
    let mut start = first_end + 1;
    while start <= h.len() {
        let end = lines.next().unwrap_or(h.len());
        let line = &h[start..end];
        start = end + 1;
        let line = line.strip_suffix(b"\r").unwrap_or(line);
        let Some(colon) = memchr::memchr(b':', line) else { continue };
        let name = &line[..colon];
        // only three header names matter: compare lengths before bytes
        match name.len() {
            14 if name.eq_ignore_ascii_case(b"content-length") => {
                let value = trim(&line[colon + 1..]);
                head.content_length = std::str::from_utf8(value).ok().and_then(|v| v.parse().ok());
            }
            17 if name.eq_ignore_ascii_case(b"transfer-encoding") => {
                let value = trim(&line[colon + 1..]);
                head.chunked = value.windows(7).any(|w| w.eq_ignore_ascii_case(b"chunked"));
            }
            12 if name.eq_ignore_ascii_case(b"x-request-id") => head.request_id = Some(trim(&line[colon + 1..])),
            _ => {}
        }
    }
    head
}

fn trim(v: &[u8]) -> &[u8] {
    let s = v.iter().position(|b| !b.is_ascii_whitespace()).unwrap_or(v.len());
    let e = v.iter().rposition(|b| !b.is_ascii_whitespace()).map(|p| p + 1).unwrap_or(s);
    &v[s..e.max(s)]
}

fn status_code(first: &[u8]) -> Option<u16> {
    // HTTP/1.1 200 OK
    let sp = first.iter().position(|&b| b == b' ')?;
    let code = first.get(sp + 1..sp + 4)?;
    if code.iter().all(|b| b.is_ascii_digit()) {
        Some(code.iter().fold(0u16, |a, &b| a * 10 + (b - b'0') as u16))
    } else {
        None
    }
}

impl Http {
    pub fn new() -> Self {
        Http { req: Side::new(), resp: Side::new(), building: None, pending: Pending::default(), upgraded: false }
    }

    fn credit_in(&mut self, n: u64) {
        if let Some(b) = self.building.as_mut() {
            b.bytes_in += n;
        } else if let Some(b) = self.pending.q.back_mut() {
            if b.bytes_out == 0 {
                b.bytes_in += n;
            }
        }
    }

    fn complete_request(&mut self, ctx: &mut Ctx) {
        if let Some(b) = self.building.take() {
            self.pending.push(b, ctx);
        }
        self.req.st = St::Idle;
    }

    /// The head of the request being built is in `h` (possibly cut when `cut`).
    fn request_head(&mut self, h: &[u8], cut: bool) -> St {
        let head = parse_head(h);
        let mut parts = head.first.splitn(3, |&b| b == b' ');
        let method = parts.next().unwrap_or(b"");
        let target = parts.next();
        // the request line itself was cut when no line end was captured
        let line_cut = cut && !h.contains(&b'\n');
        let Some(b) = self.building.as_mut() else { return St::Lost };
        b.label = http_label(method, target.unwrap_or(b""), line_cut);
        if cut {
            b.flags |= flag::TRUNCATED;
        }
        b.request_id = head.request_id.map(url_decode);
        if method == b"HEAD" {
            b.kind = KIND_HEAD;
        }
        if head.chunked {
            St::Chunked(Chunk::Size { val: 0, ext: false, digits: 0 })
        } else {
            match head.content_length {
                Some(n) if n > 0 => St::Body(n),
                _ => St::Idle,
            }
        }
    }

    fn finish(&mut self, ctx: &mut Ctx) {
        self.pending.finish_front(ctx);
        self.resp.st = St::Idle;
    }

    fn response_head(&mut self, h: &[u8], cut: bool, ctx: &mut Ctx) -> St {
        let head = parse_head(h);
        let code = status_code(head.first);
        let Some(front) = self.pending.front() else { return St::Lost };
        if let Some(c) = code {
            front.status = Status::Http(c);
        }
        if front.request_id.is_none() {
            front.request_id = head.request_id.map(url_decode);
        }
        let is_head = front.kind == KIND_HEAD;
        let no_body = is_head || matches!(code, Some(204) | Some(304));
        match code {
            Some(101) => {
                self.upgraded = true;
                self.finish(ctx);
                return St::Lost;
            }
            Some(c) if (100..200).contains(&c) => return St::Idle, // interim response: the final one follows
            _ => {}
        }
        if no_body {
            self.finish(ctx);
            return St::Idle;
        }
        if cut {
            return St::Lost;
        }
        if head.chunked {
            St::Chunked(Chunk::Size { val: 0, ext: false, digits: 0 })
        } else {
            match head.content_length {
                Some(0) => {
                    self.finish(ctx);
                    St::Idle
                }
                Some(n) => St::Body(n),
                None => {
                    if let Some(f) = self.pending.front() {
                        f.flags |= flag::UNTIL_CLOSE;
                    }
                    St::UntilClose
                }
            }
        }
    }
}

impl Protocol for Http {
    /// Bytes from the client, in order; `missing` more bytes followed on the wire uncaptured.
    fn client(&mut self, ctx: &mut Ctx, data: &[u8], missing: u32) {
        if self.upgraded {
            return;
        }
        let mut d = data;
        if self.req.st == St::Lost && starts_request(d) {
            self.complete_request(ctx);
            ctx.counters.resynced += 1;
        }
        while !d.is_empty() {
            match self.req.st {
                St::Idle => {
                    if !starts_request(d) {
                        ctx.counters.unparsed_bytes += d.len() as u64;
                        if self.building.is_none() && self.pending.q.is_empty() {
                            // mid-stream start: the rest of a request we did not see
                        } else {
                            ctx.counters.framing_lost += 1;
                        }
                        self.req.st = St::Lost;
                        break;
                    }
                    // A new request: a response whose framing was lost ends here.
                    if self.resp.st == St::Lost || self.resp.st == St::UntilClose {
                        self.pending.finish_answered_by_turn(ctx);
                        self.resp.st = St::Idle;
                    }
                    self.building = Some(Exchange::new(ctx.ts, 0));
                    self.req.buf.clear();
                    self.req.st = St::Head;
                }
                St::Head => {
                    let mut buf = std::mem::take(&mut self.req.buf);
                    let (used, done) = head_feed(&mut buf, d);
                    self.credit_in(used as u64);
                    if let Some(len) = done {
                        let st = if buf.is_empty() { self.request_head(&d[..len], false) } else { self.request_head(&buf[..len], false) };
                        buf.clear();
                        self.req.st = st;
                        if st == St::Idle {
                            self.complete_request(ctx);
                        }
                    } else if buf.len() >= MAX_HEAD {
                        let st = self.request_head(&buf, true);
                        let _ = st;
                        self.complete_request(ctx);
                        self.req.st = St::Lost;
                        ctx.counters.framing_lost += 1;
                        buf.clear();
                    }
                    self.req.buf = buf;
                    d = &d[used..];
                }
                St::Body(n) => {
                    let take = n.min(d.len() as u64);
                    self.credit_in(take);
                    d = &d[take as usize..];
                    if n == take {
                        self.complete_request(ctx);
                    } else {
                        self.req.st = St::Body(n - take);
                    }
                }
                St::Chunked(mut c) => {
                    let (used, done) = chunk_feed(&mut c, d);
                    self.credit_in(used as u64);
                    d = &d[used..];
                    if done {
                        self.complete_request(ctx);
                    } else {
                        self.req.st = St::Chunked(c);
                    }
                }
                St::UntilClose | St::Lost => {
                    self.credit_in(d.len() as u64);
                    break;
                }
            }
        }
        if missing == 0 {
            return;
        }
        let m = missing as u64;
        match self.req.st {
            St::Head => {
                let buf = std::mem::take(&mut self.req.buf);
                self.request_head(&buf, true);
                self.credit_in(m);
                self.complete_request(ctx);
                self.req.st = St::Lost;
            }
            St::Body(n) => {
                let take = n.min(m);
                self.credit_in(take);
                if n == take {
                    self.complete_request(ctx);
                    if m > take {
                        self.req.st = St::Lost;
                        ctx.counters.framing_lost += 1;
                    }
                } else {
                    self.req.st = St::Body(n - take);
                }
            }
            St::Chunked(_) => {
                self.credit_in(m);
                if let Some(b) = self.building.as_mut() {
                    b.flags |= flag::GAP;
                }
                self.complete_request(ctx);
                self.req.st = St::Lost;
                ctx.counters.framing_lost += 1;
            }
            St::Idle => {
                ctx.counters.unparsed_bytes += m;
                self.req.st = St::Lost;
                ctx.counters.framing_lost += 1;
            }
            St::UntilClose | St::Lost => self.credit_in(m),
        }
    }

    /// Bytes from the server, in order; `missing` more bytes followed on the wire uncaptured.
    fn server(&mut self, ctx: &mut Ctx, data: &[u8], missing: u32) {
        if self.upgraded {
            return;
        }
        if let Some(b) = self.building.take() {
            // the server answers before the request was complete (early error, 100-continue)
            self.pending.push(b, ctx);
        }
        let mut d = data;
        if self.resp.st == St::Lost && starts_response(d) {
            self.pending.finish_answered_by_turn(ctx);
            self.resp.st = St::Idle;
            ctx.counters.resynced += 1;
        }
        while !d.is_empty() {
            match self.resp.st {
                St::Idle => {
                    if self.pending.q.is_empty() {
                        ctx.counters.responses_without_request += starts_response(d) as u64;
                        ctx.counters.unparsed_bytes += d.len() as u64;
                        self.resp.st = St::Lost;
                        break;
                    }
                    if !starts_response(d) {
                        ctx.counters.framing_lost += 1;
                        self.resp.st = St::Lost;
                        continue;
                    }
                    self.resp.buf.clear();
                    self.resp.st = St::Head;
                }
                St::Head => {
                    let mut buf = std::mem::take(&mut self.resp.buf);
                    let (used, done) = head_feed(&mut buf, d);
                    self.pending.credit_out(used as u64, ctx.ts);
                    if let Some(len) = done {
                        let st = if buf.is_empty() { self.response_head(&d[..len], false, ctx) } else { self.response_head(&buf[..len], false, ctx) };
                        buf.clear();
                        self.resp.st = st;
                    } else if buf.len() >= MAX_HEAD {
                        self.resp.st = St::Lost;
                        ctx.counters.framing_lost += 1;
                        buf.clear();
                    }
                    self.resp.buf = buf;
                    d = &d[used..];
                }
                St::Body(n) => {
                    let take = n.min(d.len() as u64);
                    self.pending.credit_out(take, ctx.ts);
                    d = &d[take as usize..];
                    if n == take {
                        self.finish(ctx);
                    } else {
                        self.resp.st = St::Body(n - take);
                    }
                }
                St::Chunked(mut c) => {
                    let (used, done) = chunk_feed(&mut c, d);
                    self.pending.credit_out(used as u64, ctx.ts);
                    d = &d[used..];
                    if done {
                        self.finish(ctx);
                    } else {
                        self.resp.st = St::Chunked(c);
                    }
                }
                St::UntilClose | St::Lost => {
                    if !self.pending.credit_out(d.len() as u64, ctx.ts) {
                        ctx.counters.unparsed_bytes += d.len() as u64;
                    }
                    break;
                }
            }
        }
        if missing == 0 {
            return;
        }
        let m = missing as u64;
        match self.resp.st {
            St::Head => {
                self.pending.credit_out(m, ctx.ts);
                let buf = std::mem::take(&mut self.resp.buf);
                let st = self.response_head(&buf, true, ctx);
                self.resp.buf = buf;
                self.resp.buf.clear();
                self.resp.st = st;
                if st == St::Lost {
                    ctx.counters.framing_lost += 1;
                }
            }
            St::Body(n) => {
                let take = n.min(m);
                self.pending.credit_out(take, ctx.ts);
                if n == take {
                    self.finish(ctx);
                    if m > take {
                        self.resp.st = St::Lost;
                        self.pending.credit_out(m - take, ctx.ts);
                        ctx.counters.framing_lost += 1;
                    }
                } else {
                    self.resp.st = St::Body(n - take);
                }
            }
            St::Chunked(_) | St::Idle => {
                if !self.pending.credit_out(m, ctx.ts) {
                    ctx.counters.unparsed_bytes += m;
                }
                self.resp.st = St::Lost;
                ctx.counters.framing_lost += 1;
            }
            St::UntilClose | St::Lost => {
                if !self.pending.credit_out(m, ctx.ts) {
                    ctx.counters.unparsed_bytes += m;
                }
            }
        }
    }

    /// The connection closed (FIN/RST) or the capture ended.
    fn close(&mut self, ctx: &mut Ctx, last_ts: i64) {
        if let Some(b) = self.building.take() {
            self.pending.push(b, ctx);
        }
        let flag = if self.resp.st == St::UntilClose { flag::UNTIL_CLOSE } else { flag::DELIMITED_BY_TURN };
        self.pending.drain_at_close(ctx, last_ts, flag);
    }

    fn exchange_for_gap(&mut self, from_client: bool) -> Option<&mut Exchange> {
        if from_client {
            self.building.as_mut().or(self.pending.q.back_mut())
        } else {
            self.pending.q.front_mut()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::exchange::ProtoCounters;
    use super::*;

    struct H {
        p: Http,
        out: Vec<Exchange>,
        c: ProtoCounters,
        ts: i64,
    }

    impl H {
        fn new() -> Self {
            H { p: Http::new(), out: vec![], c: ProtoCounters::default(), ts: 0 }
        }
        fn send(&mut self, from_client: bool, d: &[u8], missing: u32) {
            self.ts += 1000;
            let mut ctx = Ctx { ts: self.ts, pkt: self.ts as u64, conn_flags: 0, out: &mut self.out, counters: &mut self.c };
            if from_client {
                self.p.client(&mut ctx, d, missing)
            } else {
                self.p.server(&mut ctx, d, missing)
            }
        }
        fn close(&mut self) {
            let mut ctx = Ctx { ts: self.ts, pkt: 0, conn_flags: 0, out: &mut self.out, counters: &mut self.c };
            self.p.close(&mut ctx, self.ts);
        }
    }

    #[test]
    fn keepalive_content_length_pairs_and_times() {
        let mut h = H::new();
        h.send(true, b"GET /a/1 HTTP/1.1\r\nHost: x\r\nX-Request-Id: r1\r\n\r\n", 0);
        h.send(false, b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\n01234", 0);
        h.send(false, b"56789", 0);
        h.send(true, b"POST /b HTTP/1.1\r\nContent-Length: 3\r\n\r\nabc", 0);
        h.send(false, b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n\r\n", 0);
        assert_eq!(h.out.len(), 2);
        let a = &h.out[0];
        assert_eq!((a.label.as_str(), a.arrival_ns, a.departure_ns, a.status), ("GET /a/{id}", 1000, 3000, Status::Http(200)));
        assert_eq!(a.request_id.as_deref(), Some("r1"));
        assert_eq!(a.bytes_out, 39 + 10);
        let b = &h.out[1];
        assert_eq!((b.label.as_str(), b.status, b.bytes_in), ("POST /b", Status::Http(404), 42));
    }

    #[test]
    fn chunked_head_204_and_1xx() {
        let mut h = H::new();
        h.send(true, b"HEAD / HTTP/1.1\r\n\r\nGET /c HTTP/1.1\r\n\r\nDELETE /d HTTP/1.1\r\n\r\n", 0);
        h.send(false, b"HTTP/1.1 200 OK\r\nContent-Length: 99\r\n\r\n", 0);
        h.send(false, b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n4\r\nabcd\r\n", 0);
        assert_eq!(h.out.len(), 1);
        h.send(false, b"0\r\n\r\nHTTP/1.1 204 No Content\r\n\r\n", 0);
        assert_eq!(h.out.len(), 3);
        assert!(h.out[1].flags & flag::PIPELINED != 0 && h.out[2].flags & flag::PIPELINED != 0);
        assert_eq!(h.out[1].status, Status::Http(200));
        assert_eq!(h.out[1].departure_ns, 4000);
        assert_eq!(h.out[2].status, Status::Http(204));
    }

    #[test]
    fn snapshot_cut_response_is_delimited_by_next_request() {
        let mut h = H::new();
        h.send(true, b"GET /x?id=5 HTTP/1.1\r\nHost: a\r\n\r\n", 0);
        h.send(false, b"HTTP/1.1 200 OK\r\nServer: ngi", 900);
        h.send(false, b"", 1400);
        h.send(true, b"GET /y HTTP/1.1\r\nHo", 10);
        h.send(false, b"HTTP/1.1 503 Service Unavailable\r\nCon", 100);
        h.close();
        assert_eq!(h.out.len(), 2);
        let a = &h.out[0];
        assert_eq!((a.status, a.departure_ns, a.bytes_out), (Status::Http(200), 3000, 28 + 900 + 1400));
        assert!(a.flags & flag::DELIMITED_BY_TURN != 0);
        assert_eq!(h.out[1].label, "GET /y");
        assert_eq!(h.out[1].status, Status::Http(503));
        assert!(h.out[1].flags & flag::TRUNCATED != 0);
    }

    #[test]
    fn mid_stream_response_without_request_is_counted_and_skipped() {
        let mut h = H::new();
        h.send(false, b"ody rest of an earlier response", 0);
        h.send(true, b"GET /z HTTP/1.1\r\n\r\n", 0);
        h.send(false, b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok", 0);
        assert_eq!(h.out.len(), 1);
        assert_eq!(h.out[0].label, "GET /z");
        assert_eq!(h.c.unparsed_bytes, 31);
    }

    #[test]
    fn unanswered_request_at_close_is_flagged() {
        let mut h = H::new();
        h.send(true, b"GET /slow HTTP/1.1\r\n\r\n", 0);
        h.ts += 5000;
        h.close();
        assert_eq!(h.out.len(), 1);
        assert!(h.out[0].flags & flag::NO_RESPONSE != 0);
        assert_eq!(h.out[0].status, Status::None);
    }
}
