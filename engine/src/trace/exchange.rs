//! The unit the tracer emits: one request/response exchange seen at one server, and the queue of
//! exchanges waiting for their response on one connection.
//!
//! Protocol parsers receive the two byte streams of a connection in capture order, one segment at
//! a time (`Ctx` carries the segment's capture time), push an `Exchange` when a request begins,
//! and finish the oldest one when its response ends: responses on HTTP/1.1, PostgreSQL and MySQL
//! connections come back in request order, so FIFO pairing is exact, also for pipelined requests.

use std::collections::VecDeque;

/// Flags carried by each exchange (written as the `flags` column, comma separated).
pub mod flag {
    /// the connection's start was not in the capture
    pub const MID_STREAM: u16 = 1 << 0;
    /// sent while an earlier request on the connection was still unanswered
    pub const PIPELINED: u16 = 1 << 1;
    /// part of the payload was not captured (snapshot length): the label is cut
    pub const TRUNCATED: u16 = 1 << 2;
    /// the end of the response was taken from the direction change (next request) or the close,
    /// because the message framing was lost (snapshot length, missing packets)
    pub const DELIMITED_BY_TURN: u16 = 1 << 3;
    /// no response seen before the connection closed or the capture ended; departure = last packet
    pub const NO_RESPONSE: u16 = 1 << 4;
    /// which side is the server was guessed (no SYN, no server map entry)
    pub const ROLE_GUESSED: u16 = 1 << 5;
    /// bytes of this exchange were missing from the capture (lost packets, not snapshot length)
    pub const GAP: u16 = 1 << 6;
    /// the response had no length and ended with the connection
    pub const UNTIL_CLOSE: u16 = 1 << 7;
    /// the request arrived before the connection was ready (handshake) or the protocol state was guessed
    pub const STATE_GUESSED: u16 = 1 << 8;

    pub const NAMES: [(u16, &str); 9] = [
        (MID_STREAM, "mid_stream"),
        (PIPELINED, "pipelined"),
        (TRUNCATED, "truncated"),
        (DELIMITED_BY_TURN, "delimited_by_turn"),
        (NO_RESPONSE, "no_response"),
        (ROLE_GUESSED, "role_guessed"),
        (GAP, "gap"),
        (UNTIL_CLOSE, "until_close"),
        (STATE_GUESSED, "state_guessed"),
    ];

    /// Flags that make a row's times or pairing an inference rather than an observation.
    pub const INFERRED: u16 = DELIMITED_BY_TURN | NO_RESPONSE | ROLE_GUESSED | GAP | STATE_GUESSED;
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Status {
    /// no response (yet)
    None,
    /// an HTTP status code
    Http(u16),
    /// a SQL statement completed
    Ok,
    /// a PostgreSQL SQLSTATE (5 characters)
    SqlState([u8; 5]),
    /// a MySQL/MariaDB error number
    MyErr(u16),
}

impl Status {
    pub fn text(&self) -> Option<String> {
        match self {
            Status::None => None,
            Status::Http(c) => Some(c.to_string()),
            Status::Ok => Some("OK".into()),
            Status::SqlState(s) => Some(String::from_utf8_lossy(s).into_owned()),
            Status::MyErr(n) => Some(n.to_string()),
        }
    }
    pub fn is_error(&self) -> bool {
        matches!(self, Status::SqlState(_) | Status::MyErr(_))
    }
}

#[derive(Debug, Clone)]
pub struct Exchange {
    /// capture time of the packet holding the request's first byte
    pub arrival_ns: i64,
    /// capture time of the packet holding the response's last byte
    pub departure_ns: i64,
    /// packet number at which the request was complete
    pub req_done_pkt: u64,
    pub label: String,
    pub request_id: Option<String>,
    pub status: Status,
    pub bytes_in: u64,
    pub bytes_out: u64,
    pub flags: u16,
    /// protocol-specific: what response to expect (MySQL command, HTTP HEAD...)
    pub kind: u8,
    /// protocol-specific: e.g. a MySQL statement id
    pub aux: u32,
    /// capture time of the last response byte seen so far
    pub last_resp_ns: i64,
}

impl Exchange {
    pub fn new(arrival_ns: i64, flags: u16) -> Self {
        Exchange {
            arrival_ns,
            departure_ns: arrival_ns,
            req_done_pkt: 0,
            label: String::new(),
            request_id: None,
            status: Status::None,
            bytes_in: 0,
            bytes_out: 0,
            flags,
            kind: 0,
            aux: 0,
            last_resp_ns: 0,
        }
    }
}

/// What every protocol parser takes, for one connection, in capture order.
pub trait Protocol {
    /// Bytes from the client: `data` as captured, then `missing` bytes that were on the wire but
    /// cut by the snapshot length.
    fn client(&mut self, ctx: &mut Ctx, data: &[u8], missing: u32);
    /// Bytes from the server, as `client`.
    fn server(&mut self, ctx: &mut Ctx, data: &[u8], missing: u32);
    /// The connection closed (FIN/RST) or the capture ended.
    fn close(&mut self, ctx: &mut Ctx, last_ts: i64);
    /// The exchange that bytes from this side belong to now: the request being read (client), or
    /// the oldest one waiting for its response (server).
    fn exchange_for_gap(&mut self, from_client: bool) -> Option<&mut Exchange>;

    /// Bytes lost from the capture in one direction (a hole that was never filled): the exchange
    /// they belong to is flagged `GAP`, and they are passed over like uncaptured bytes.
    fn gap(&mut self, ctx: &mut Ctx, from_client: bool, n: u32) {
        if let Some(e) = self.exchange_for_gap(from_client) {
            e.flags |= flag::GAP;
        }
        if from_client {
            self.client(ctx, &[], n)
        } else {
            self.server(ctx, &[], n)
        }
    }

    /// One segment's payload (or a gap of `missing` bytes) from either side.
    fn feed(&mut self, ctx: &mut Ctx, from_client: bool, data: &[u8], missing: u32, is_gap: bool) {
        if is_gap {
            self.gap(ctx, from_client, missing)
        } else if from_client {
            self.client(ctx, data, missing)
        } else {
            self.server(ctx, data, missing)
        }
    }
}

/// Per-segment context handed to the protocol parsers.
pub struct Ctx<'a> {
    /// capture time of the current packet
    pub ts: i64,
    /// number of the current packet in the capture
    pub pkt: u64,
    /// flags every exchange of this connection carries (mid_stream, role_guessed)
    pub conn_flags: u16,
    /// finished exchanges
    pub out: &'a mut Vec<Exchange>,
    pub counters: &'a mut ProtoCounters,
}

/// What the protocol parsers met that did not become a row.
#[derive(Debug, Default, Clone)]
pub struct ProtoCounters {
    /// responses whose request was not in the capture (mid-stream starts)
    pub responses_without_request: u64,
    /// times a parser lost the message framing (cut headers, missing packets, bad bytes)
    pub framing_lost: u64,
    /// times the framing was found again at a segment start
    pub resynced: u64,
    /// bytes a parser could not attribute to any exchange
    pub unparsed_bytes: u64,
    /// client messages that need no response (COM_STMT_CLOSE, COM_QUIT, Terminate...)
    pub no_response_commands: u64,
    /// connections switched to TLS (not decoded)
    pub tls_connections: u64,
    /// pipelined requests seen
    pub pipelined: u64,
}

/// Exchanges on one connection waiting for (the end of) their response, oldest first.
#[derive(Debug, Default)]
pub struct Pending {
    pub q: VecDeque<Exchange>,
}

impl Pending {
    /// Queue a request whose bytes are complete.
    pub fn push(&mut self, mut ex: Exchange, ctx: &mut Ctx) {
        ex.req_done_pkt = ctx.pkt;
        if self.q.iter().any(|e| e.bytes_out == 0) {
            ex.flags |= flag::PIPELINED;
            ctx.counters.pipelined += 1;
        }
        self.q.push_back(ex);
    }

    #[inline]
    pub fn front(&mut self) -> Option<&mut Exchange> {
        self.q.front_mut()
    }

    /// Credit response bytes to the oldest exchange (false when none is waiting).
    #[inline]
    pub fn credit_out(&mut self, n: u64, ts: i64) -> bool {
        match self.q.front_mut() {
            Some(e) => {
                e.bytes_out += n;
                e.last_resp_ns = ts;
                true
            }
            None => false,
        }
    }

    /// The oldest exchange's response ended in the current packet.
    pub fn finish_front(&mut self, ctx: &mut Ctx) {
        if let Some(mut e) = self.q.pop_front() {
            e.departure_ns = ctx.ts;
            e.flags |= ctx.conn_flags;
            ctx.out.push(e);
        }
    }

    /// Responses whose framing was lost end where their last byte was seen: finish every waiting
    /// exchange that has response bytes, flagged as delimited by the direction change.
    pub fn finish_answered_by_turn(&mut self, ctx: &mut Ctx) {
        while let Some(e) = self.q.front() {
            if e.bytes_out == 0 {
                break;
            }
            let mut e = self.q.pop_front().unwrap();
            e.departure_ns = e.last_resp_ns;
            e.flags |= flag::DELIMITED_BY_TURN | ctx.conn_flags;
            ctx.out.push(e);
        }
    }

    /// The connection ended (close or end of capture): emit everything still waiting.
    pub fn drain_at_close(&mut self, ctx: &mut Ctx, last_ts: i64, answered_flag: u16) {
        while let Some(mut e) = self.q.pop_front() {
            if e.bytes_out > 0 {
                e.departure_ns = e.last_resp_ns;
                e.flags |= answered_flag;
            } else {
                e.departure_ns = last_ts.max(e.arrival_ns);
                e.flags |= flag::NO_RESPONSE;
                e.status = Status::None;
            }
            e.flags |= ctx.conn_flags;
            ctx.out.push(e);
        }
    }
}
