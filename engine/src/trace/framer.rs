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
    /// Set by `Framer::step` at `Step::End` when the message's whole body lay in `d`: the kept
    /// body bytes (the first `cap`), borrowed from the input instead of copied into
    /// `Framer::body`. `None`: the body is in `Framer::body`. Read it with `Framer::body_of`.
    pub kept: Option<&'a [u8]>,
}

impl<'a> Input<'a> {
    pub fn new(d: &'a [u8], gap: u32) -> Self {
        Input { d, gap, kept: None }
    }
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

/// A set of message type bytes: one bit test instead of a scan of the list, once per message.
#[derive(Clone, Copy)]
struct ByteSet([u64; 4]);

impl ByteSet {
    fn of(bytes: &[u8]) -> Self {
        let mut s = [0u64; 4];
        for &b in bytes {
            s[(b >> 6) as usize] |= 1 << (b & 63);
        }
        ByteSet(s)
    }

    #[inline]
    fn contains(&self, b: u8) -> bool {
        self.0[(b >> 6) as usize] & (1 << (b & 63)) != 0
    }
}

pub struct Framer {
    pub mode: Mode,
    valid: ByteSet,
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
            valid: ByteSet::of(valid),
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

    /// Decode a complete message header (`self.hdr_need()` bytes) and start the body.
    #[inline]
    fn header(&mut self, h: &[u8]) -> Step {
        // an implausible header stays counted as read (mid_message()) until reset()
        self.hdr_len = h.len() as u8;
        match self.mode {
            Mode::PgTyped => {
                let l = u32::from_be_bytes([h[1], h[2], h[3], h[4]]);
                if !(4..=PG_MAX).contains(&l) || !self.valid.contains(h[0]) {
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
        Step::Start
    }

    /// The body of the message that just ended (`Step::End`): from the input when it lay there
    /// whole, else the bytes gathered across segments. Not tied to `self`'s borrow in the first
    /// case, so callers take `inp.kept` themselves when they need `&mut self` meanwhile.
    pub fn body_of<'s>(&'s self, inp: &Input<'s>) -> &'s [u8] {
        inp.kept.unwrap_or(&self.body)
    }

    /// Did the message that just ended lose body bytes (a gap, or more than `cap` bytes)?
    pub fn body_cut(&self, kept_len: usize) -> bool {
        self.cut || kept_len < self.len as usize
    }

    pub fn step<'a>(&mut self, inp: &mut Input<'a>, ts: i64) -> Step {
        inp.kept = None;
        if self.lost {
            self.skipped += inp.d.len() as u64 + inp.gap as u64;
            inp.d = &[];
            inp.gap = 0;
            return Step::More;
        }
        if !self.in_body {
            let need = self.hdr_need();
            if self.hdr_len == 0 && inp.d.len() >= need as usize {
                // fast path: the whole header is in this segment, decode it in place
                self.msg_ts = ts;
                let (h, rest) = inp.d.split_at(need as usize);
                inp.d = rest;
                return self.header(h);
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
            return self.header(&h[..need as usize]);
        }
        if self.body_left == self.len && inp.d.len() >= self.body_left as usize {
            // fast path: the whole body is in this segment; keep it where it is
            let (b, rest) = inp.d.split_at(self.body_left as usize);
            inp.d = rest;
            inp.kept = Some(&b[..self.cap.min(b.len())]);
            self.body_left = 0;
            self.in_body = false;
            return Step::End;
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

/// Hand the body of the message that just ended (`Step::End`) to `end`, with whether bytes of it
/// were lost: in place when the segment held it whole (`kept`), else the framer's own buffer, lent
/// out for the call (so `end` may take `&mut` of the parser that owns the framer) and put back so
/// its allocation is reused.
pub fn end_message<P>(p: &mut P, framer: fn(&mut P) -> &mut Framer, kept: Option<&[u8]>, end: impl FnOnce(&mut P, &[u8], bool)) {
    match kept {
        Some(body) => {
            let cut = framer(p).body_cut(body.len());
            end(p, body, cut)
        }
        None => {
            let f = framer(p);
            let body = std::mem::take(&mut f.body);
            let cut = f.body_cut(body.len());
            end(p, &body, cut);
            framer(p).body = body;
        }
    }
}

/// Does `d` look like it starts at a PostgreSQL typed message boundary? Checks up to 8 chained
/// headers that lie inside `d`.
pub fn pg_plausible(d: &[u8], valid: &[u8]) -> bool {
    let mut o = 0usize;
    for hop in 0..8 {
        if o + 5 > d.len() {
            return hop > 0;
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
        let mut inp = Input::new(b"Q\0\0\0\x0cSELEC", 0);
        assert_eq!(f.step(&mut inp, 1), Step::Start);
        f.cap = 4;
        assert_eq!(f.step(&mut inp, 1), Step::More);
        let mut inp = Input::new(b"T 1", 0);
        assert_eq!(f.step(&mut inp, 2), Step::End);
        assert_eq!((f.typ, f.wire, &f.body[..], f.msg_ts), (b'Q', 13, &b"SELE"[..], 1));
        // a gap inside the body is skipped
        let mut inp = Input::new(b"Z\0\0\0\x05", 1);
        assert_eq!(f.step(&mut inp, 3), Step::Start);
        f.cap = 1;
        assert_eq!(f.step(&mut inp, 3), Step::End);
        assert!(f.cut);
        // a gap inside a header loses the framing
        let mut inp = Input::new(b"Z\0", 10);
        assert_eq!(f.step(&mut inp, 4), Step::Lost);
    }

    #[test]
    fn mysql_packets_and_continuations() {
        let mut f = Framer::new(Mode::My, b"");
        let mut inp = Input::new(&[3, 0, 0, 0, 3, b'a', b'b', 0xff, 0xff, 0xff, 1], 0);
        assert_eq!(f.step(&mut inp, 1), Step::Start);
        assert_eq!((f.len, f.seq, f.cont), (3, 0, false));
        assert_eq!(f.step(&mut inp, 1), Step::End);
        assert_eq!(f.step(&mut inp, 1), Step::Start);
        assert_eq!(f.len, 0xff_ffff);
        let mut inp = Input::new(&[], 0xff_ffff);
        assert_eq!(f.step(&mut inp, 1), Step::End);
        let mut inp = Input::new(&[0, 0, 0, 2], 0);
        assert_eq!(f.step(&mut inp, 1), Step::Start);
        assert!(f.cont);
    }

    /// Every (Step, type, kept body, cut) the framer reports for `d` cut into pieces of `piece` bytes.
    fn steps(d: &[u8], piece: usize, cap: usize) -> Vec<(Step, u8, Vec<u8>, bool)> {
        let mut f = Framer::new(Mode::PgTyped, b"QPBZ");
        let mut seen = Vec::new();
        for chunk in d.chunks(piece) {
            let mut inp = Input::new(chunk, 0);
            loop {
                let st = f.step(&mut inp, 0);
                match st {
                    Step::More => break,
                    Step::Start => f.cap = cap,
                    _ => {}
                }
                let body = if st == Step::End { f.body_of(&inp).to_vec() } else { Vec::new() };
                seen.push((st, f.typ, body.clone(), st == Step::End && f.body_cut(body.len())));
            }
        }
        seen
    }

    #[test]
    fn whole_and_split_messages_give_the_same_bodies() {
        let d = [&b"Q\0\0\0\x0dSELECT 1\0"[..], b"Z\0\0\0\x05I", b"P\0\0\0\x04", b"B\0\0\0\x0babcdefg"].concat();
        for cap in [0, 3, 100] {
            let whole = steps(&d, d.len(), cap);
            assert_eq!(whole.iter().filter(|s| s.0 == Step::End).count(), 4);
            for piece in 1..d.len() {
                assert_eq!(steps(&d, piece, cap), whole, "pieces of {piece}, cap {cap}");
            }
        }
    }

    #[test]
    fn plausibility_checks_chained_headers() {
        assert!(pg_plausible(b"Z\0\0\0\x05IC\0\0\0\x04", b"ZC"));
        assert!(!pg_plausible(b"Z\0\0\0\x05IX\0\0\0\x04", b"ZC"));
        assert!(!pg_plausible(b"hello world", b"ZC"));
    }
}
