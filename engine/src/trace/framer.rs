//! Length-prefixed message framing over a byte stream with holes, shared by the PostgreSQL and
//! MySQL parsers.
//!
//! Input arrives as captured bytes followed by `gap` bytes that were on the wire but not in the
//! capture. A gap inside a message body is skipped (the length is known); a gap inside a header
//! loses the framing (`Step::Lost`) until the parser resets it at a direction change.

/// Captured bytes plus a count of uncaptured bytes that follow them.
pub struct Input<'a> {
    pub d: &'a [u8],
    pub gap: u32,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// PostgreSQL typed message: type byte + 4-byte big-endian length (including itself)
    PgTyped,
    /// PostgreSQL startup-phase message: 4-byte length, no type
    PgUntyped,
    /// PostgreSQL SSL/GSS negotiation reply: one byte
    PgByte,
    /// MySQL packet: 3-byte little-endian length + sequence id
    My,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    /// need more input
    More,
    /// a message header is complete: `typ`, `seq`, `len`, `wire` are set; set `cap` now
    Start,
    /// the message's body is complete: `body` holds its first `cap` bytes, `cut` if some were
    /// not captured
    End,
    /// the framing is lost (a header was not captured, or a header is implausible)
    Lost,
}

pub const PG_MAX: u32 = 1 << 30;

pub struct Framer {
    pub mode: Mode,
    valid: &'static [u8],
    hdr: [u8; 5],
    hdr_len: u8,
    in_body: bool,
    pub typ: u8,
    pub seq: u8,
    /// body length in bytes
    pub len: u32,
    /// bytes of the message on the wire (header + body)
    pub wire: u32,
    body_left: u32,
    pub body: Vec<u8>,
    pub cap: usize,
    pub cut: bool,
    /// capture time of the message's first byte
    pub msg_ts: i64,
    pub lost: bool,
    /// MySQL: this packet continues a previous 16 MiB packet
    pub cont: bool,
    next_cont: bool,
    /// bytes passed over while the framing was lost (callers credit them and reset this)
    pub skipped: u64,
}

impl Framer {
    pub fn new(mode: Mode, valid: &'static [u8]) -> Self {
        Framer {
            mode,
            valid,
            hdr: [0; 5],
            hdr_len: 0,
            in_body: false,
            typ: 0,
            seq: 0,
            len: 0,
            wire: 0,
            body_left: 0,
            body: Vec::new(),
            cap: 0,
            cut: false,
            msg_ts: 0,
            lost: false,
            cont: false,
            next_cont: false,
            skipped: 0,
        }
    }

    /// Forget any partial message: the next byte starts a message header.
    pub fn reset(&mut self) {
        self.hdr_len = 0;
        self.in_body = false;
        self.lost = false;
        self.next_cont = false;
    }

    fn hdr_need(&self) -> u8 {
        match self.mode {
            Mode::PgTyped => 5,
            Mode::PgUntyped | Mode::My => 4,
            Mode::PgByte => 1,
        }
    }

    /// Is the message currently being read between its header and its end?
    pub fn mid_message(&self) -> bool {
        self.in_body || self.hdr_len > 0
    }

    pub fn step(&mut self, inp: &mut Input, ts: i64) -> Step {
        if self.lost {
            self.skipped += inp.d.len() as u64 + inp.gap as u64;
            inp.d = &[];
            inp.gap = 0;
            return Step::More;
        }
        if !self.in_body {
            let need = self.hdr_need();
            if self.hdr_len == 0 && inp.d.len() >= need as usize {
                // fast path: the whole header is in this segment
                self.msg_ts = ts;
                self.hdr[..need as usize].copy_from_slice(&inp.d[..need as usize]);
                self.hdr_len = need;
                inp.d = &inp.d[need as usize..];
            }
            while self.hdr_len < need {
                if let Some((&b, rest)) = inp.d.split_first() {
                    if self.hdr_len == 0 {
                        self.msg_ts = ts;
                    }
                    self.hdr[self.hdr_len as usize] = b;
                    self.hdr_len += 1;
                    inp.d = rest;
                } else if inp.gap > 0 {
                    self.lost = true;
                    self.skipped += self.hdr_len as u64;
                    self.hdr_len = 0;
                    return Step::Lost;
                } else {
                    return Step::More;
                }
            }
            let h = self.hdr;
            match self.mode {
                Mode::PgTyped => {
                    let l = u32::from_be_bytes([h[1], h[2], h[3], h[4]]);
                    if l < 4 || l > PG_MAX || !self.valid.contains(&h[0]) {
                        self.lost = true;
                        return Step::Lost;
                    }
                    self.typ = h[0];
                    self.len = l - 4;
                    self.wire = l + 1;
                }
                Mode::PgUntyped => {
                    let l = u32::from_be_bytes([h[0], h[1], h[2], h[3]]);
                    if !(8..=10_000).contains(&l) {
                        self.lost = true;
                        return Step::Lost;
                    }
                    self.typ = 0;
                    self.len = l - 4;
                    self.wire = l;
                }
                Mode::PgByte => {
                    self.typ = h[0];
                    self.len = 0;
                    self.wire = 1;
                }
                Mode::My => {
                    let l = u32::from_le_bytes([h[0], h[1], h[2], 0]);
                    self.typ = 0;
                    self.seq = h[3];
                    self.len = l;
                    self.wire = l + 4;
                    self.cont = self.next_cont;
                    self.next_cont = l == 0xff_ffff;
                }
            }
            self.hdr_len = 0;
            self.in_body = true;
            self.body_left = self.len;
            self.body.clear();
            self.cut = false;
            self.cap = 0;
            return Step::Start;
        }
        while self.body_left > 0 {
            if !inp.d.is_empty() {
                let take = (self.body_left as usize).min(inp.d.len());
                let keep = take.min(self.cap.saturating_sub(self.body.len()));
                if keep > 0 {
                    self.body.extend_from_slice(&inp.d[..keep]);
                }
                inp.d = &inp.d[take..];
                self.body_left -= take as u32;
            } else if inp.gap > 0 {
                let take = self.body_left.min(inp.gap);
                inp.gap -= take;
                self.body_left -= take;
                if self.body.len() < self.cap {
                    self.cut = true;
                }
            } else {
                return Step::More;
            }
        }
        self.in_body = false;
        Step::End
    }
}

/// Does `d` look like it starts at a PostgreSQL typed message boundary? Checks up to 8 chained
/// headers that lie inside `d`.
pub fn pg_plausible(d: &[u8], valid: &[u8]) -> bool {
    let mut o = 0usize;
    for hop in 0..8 {
        if o + 5 > d.len() {
            return hop > 0 || false;
        }
        let l = u32::from_be_bytes([d[o + 1], d[o + 2], d[o + 3], d[o + 4]]);
        if !valid.contains(&d[o]) || !(4..=(1 << 24)).contains(&l) {
            return false;
        }
        o += l as usize + 1;
        if o == d.len() {
            return true;
        }
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pg_messages_across_segments_and_gaps() {
        let mut f = Framer::new(Mode::PgTyped, b"QZ");
        let mut inp = Input { d: b"Q\0\0\0\x0cSELEC", gap: 0 };
        assert_eq!(f.step(&mut inp, 1), Step::Start);
        f.cap = 4;
        assert_eq!(f.step(&mut inp, 1), Step::More);
        let mut inp = Input { d: b"T 1", gap: 0 };
        assert_eq!(f.step(&mut inp, 2), Step::End);
        assert_eq!((f.typ, f.wire, &f.body[..], f.msg_ts), (b'Q', 13, &b"SELE"[..], 1));
        // a gap inside the body is skipped
        let mut inp = Input { d: b"Z\0\0\0\x05", gap: 1 };
        assert_eq!(f.step(&mut inp, 3), Step::Start);
        f.cap = 1;
        assert_eq!(f.step(&mut inp, 3), Step::End);
        assert!(f.cut);
        // a gap inside a header loses the framing
        let mut inp = Input { d: b"Z\0", gap: 10 };
        assert_eq!(f.step(&mut inp, 4), Step::Lost);
    }

    #[test]
    fn mysql_packets_and_continuations() {
        let mut f = Framer::new(Mode::My, b"");
        let mut inp = Input { d: &[3, 0, 0, 0, 3, b'a', b'b', 0xff, 0xff, 0xff, 1], gap: 0 };
        assert_eq!(f.step(&mut inp, 1), Step::Start);
        assert_eq!((f.len, f.seq, f.cont), (3, 0, false));
        assert_eq!(f.step(&mut inp, 1), Step::End);
        assert_eq!(f.step(&mut inp, 1), Step::Start);
        assert_eq!(f.len, 0xff_ffff);
        let mut inp = Input { d: &[], gap: 0xff_ffff };
        assert_eq!(f.step(&mut inp, 1), Step::End);
        let mut inp = Input { d: &[0, 0, 0, 2], gap: 0 };
        assert_eq!(f.step(&mut inp, 1), Step::Start);
        assert!(f.cont);
    }

    #[test]
    fn plausibility_checks_chained_headers() {
        assert!(pg_plausible(b"Z\0\0\0\x05IC\0\0\0\x04", b"ZC"));
        assert!(!pg_plausible(b"Z\0\0\0\x05IX\0\0\0\x04", b"ZC"));
        assert!(!pg_plausible(b"hello world", b"ZC"));
    }
}
