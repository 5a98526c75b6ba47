//! Streaming reader for capture files as tcpdump writes them: classic pcap (micro- or nanosecond,
//! either byte order) and pcapng (Section Header, Interface Description, Enhanced and Simple
//! Packet blocks; other blocks are skipped and counted).
//!
//! The reader keeps one large buffer (`BUF_SIZE`) and hands out packets as slices into it, so the
//! hot path allocates nothing; memory does not grow with the file. A damaged or cut file ends the
//! stream early with a `stop_reason` (what was wrong, at which byte offset) instead of an error, so
//! the caller keeps every packet read before the damage.

use std::io::Read;

/// Why a capture cannot be read at all. (Damage after the file header is not an error: the
/// stream ends early with a `stop_reason` and keeps the packets read before it.)
#[derive(Debug, thiserror::Error)]
pub enum CaptureError {
    /// The file could not be opened (the I/O error is part of the message, not a source, so
    /// the CLI's `{err:#}` says it once).
    #[error("cannot open capture {name}: {error}")]
    Open { name: String, error: std::io::Error },
    /// Fewer than 4 bytes: not even a magic number.
    #[error("{name}: not a capture file: {len} bytes, expected a pcap or pcapng header")]
    TooShort { name: String, len: usize },
    /// A pcap magic number but not the whole 24-byte file header.
    #[error("{name}: truncated pcap file header ({len} of 24 bytes)")]
    TruncatedHeader { name: String, len: usize },
    /// Neither pcap nor pcapng; `head` is the first bytes in hex.
    #[error(
        "{name}: not a capture file: starts with bytes {head}, expected the pcap magic a1b2c3d4/a1b23c4d \
         (either byte order) or the pcapng section header 0a0d0d0a"
    )]
    BadMagic { name: String, head: String },
    /// Reading the file header failed.
    #[error(transparent)]
    Read(#[from] std::io::Error),
}

const BUF_SIZE: usize = 4 << 20;
/// A record claiming more than this many captured bytes is taken as corruption (tcpdump's
/// maximum snapshot length is 262144).
const MAX_RECORD: usize = 1 << 20;

/// One captured packet, borrowed from the reader's buffer.
#[derive(Debug, Clone, Copy)]
pub struct Packet<'a> {
    /// Capture time, nanoseconds since the Unix epoch.
    pub ts_ns: i64,
    /// Length of the packet on the wire (>= data.len() when the snapshot length cut it).
    pub orig_len: u32,
    /// Link-layer header type (LINKTYPE_*).
    pub linktype: u32,
    pub data: &'a [u8],
}

#[derive(Debug, Clone, Copy)]
struct Interface {
    linktype: u32,
    /// timestamp units per second
    units_per_s: u64,
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum Format {
    Pcap { swapped: bool, nanos: bool, linktype: u32 },
    PcapNg { swapped: bool },
}

/// What the reader met besides packets.
#[derive(Debug, Default, Clone)]
pub struct ReaderStats {
    pub packets: u64,
    pub bytes: u64,
    /// pcapng blocks that are not packets (statistics, name resolution, custom...)
    pub skipped_blocks: u64,
    /// packets on an interface that was never described (pcapng)
    pub unknown_interface: u64,
    /// packets whose record says caplen > origlen (kept, origlen raised to caplen)
    pub bad_lengths: u64,
}

pub struct CaptureReader<R: Read> {
    src: R,
    buf: Vec<u8>,
    start: usize,
    end: usize,
    eof: bool,
    /// file offset of buf[start]
    offset: u64,
    format: Format,
    interfaces: Vec<Interface>,
    pub stats: ReaderStats,
    /// Why reading stopped before the end of the file (truncation, corruption, I/O error).
    pub stop_reason: Option<String>,
    /// Reading stopped at damage inside the file (a corrupt record or block, an I/O error), not at
    /// a file merely cut short (what a killed tcpdump leaves): the caller should fail, keeping
    /// the packets before it.
    pub damaged: bool,
    /// Timestamp resolution of the file in nanoseconds (1000 for microsecond pcap).
    pub ts_precision_ns: u64,
    name: String,
}

#[inline]
fn u32_at(b: &[u8], swapped: bool) -> u32 {
    let v = u32::from_le_bytes([b[0], b[1], b[2], b[3]]);
    if swapped {
        v.swap_bytes()
    } else {
        v
    }
}

#[inline]
fn u16_at(b: &[u8], swapped: bool) -> u16 {
    let v = u16::from_le_bytes([b[0], b[1]]);
    if swapped {
        v.swap_bytes()
    } else {
        v
    }
}

impl<R: Read> CaptureReader<R> {
    /// Open a capture: reads and checks the file header. `name` is used in messages.
    pub fn new(src: R, name: &str) -> Result<Self, CaptureError> {
        let mut r = CaptureReader {
            src,
            buf: vec![0u8; BUF_SIZE],
            start: 0,
            end: 0,
            eof: false,
            offset: 0,
            format: Format::Pcap { swapped: false, nanos: false, linktype: 1 },
            interfaces: Vec::new(),
            stats: ReaderStats::default(),
            stop_reason: None,
            damaged: false,
            ts_precision_ns: 1000,
            name: name.to_string(),
        };
        r.fill(24)?;
        let avail = r.end - r.start;
        if avail < 4 {
            return Err(CaptureError::TooShort { name: name.to_string(), len: avail });
        }
        let magic = u32::from_le_bytes(r.buf[0..4].try_into().unwrap());
        match magic {
            0xa1b2c3d4 | 0xd4c3b2a1 | 0xa1b23c4d | 0x4d3cb2a1 => {
                if avail < 24 {
                    return Err(CaptureError::TruncatedHeader { name: name.to_string(), len: avail });
                }
                let swapped = magic == 0xd4c3b2a1 || magic == 0x4d3cb2a1;
                let nanos = magic == 0xa1b23c4d || magic == 0x4d3cb2a1;
                let linktype = u32_at(&r.buf[20..24], swapped) & 0x0fff_ffff;
                r.format = Format::Pcap { swapped, nanos, linktype };
                r.ts_precision_ns = if nanos { 1 } else { 1000 };
                r.consume(24);
            }
            0x0a0d0d0a => {
                r.format = Format::PcapNg { swapped: false };
                // the section header block is parsed by next()
            }
            _ => {
                let head: Vec<String> = r.buf[..avail.min(8)].iter().map(|b| format!("{b:02x}")).collect();
                return Err(CaptureError::BadMagic { name: name.to_string(), head: head.join(" ") });
            }
        }
        Ok(r)
    }

    #[inline]
    fn consume(&mut self, n: usize) {
        self.start += n;
        self.offset += n as u64;
    }

    /// Make at least `n` bytes available from `start` (fewer only at end of file).
    fn fill(&mut self, n: usize) -> std::io::Result<()> {
        if self.end - self.start >= n {
            return Ok(());
        }
        if n > self.buf.len() {
            self.buf.resize(n.next_power_of_two(), 0);
        }
        if self.start + n > self.buf.len() {
            self.buf.copy_within(self.start..self.end, 0);
            self.end -= self.start;
            self.start = 0;
        }
        while self.end - self.start < n && !self.eof {
            match self.src.read(&mut self.buf[self.end..]) {
                Ok(0) => self.eof = true,
                Ok(k) => self.end += k,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }

    /// Stop at damage inside the file (see `damaged`).
    fn corrupt(&mut self, why: String) {
        if self.stop_reason.is_none() {
            self.damaged = true;
        }
        self.stop(why);
    }

    fn stop(&mut self, why: String) {
        if self.stop_reason.is_none() {
            self.stop_reason = Some(format!("{}: {}", self.name, why));
        }
        self.eof = true;
        self.start = self.end;
    }

    /// Ensure `n` bytes or record why not. Returns false at a clean or unclean end.
    #[inline]
    fn need(&mut self, n: usize, what: &str) -> bool {
        // the common case, inline: the bytes are already buffered
        if self.end - self.start >= n {
            return true;
        }
        self.need_slow(n, what)
    }

    #[cold]
    fn need_slow(&mut self, n: usize, what: &str) -> bool {
        if let Err(e) = self.fill(n) {
            self.corrupt(format!("read error at byte {}: {e}", self.offset));
            return false;
        }
        let avail = self.end - self.start;
        if avail >= n {
            return true;
        }
        if avail > 0 {
            let at = self.offset;
            self.stop(format!("file truncated at byte {}: {} needs {} bytes, only {} left; packets before it are kept", at, what, n, avail));
        }
        false
    }

    /// The next packet, or None at the end (see `stop_reason` for an early end).
    pub fn next_packet(&mut self) -> Option<Packet<'_>> {
        match self.format {
            Format::Pcap { swapped, nanos, linktype } => self.next_pcap(swapped, nanos, linktype),
            Format::PcapNg { .. } => self.next_pcapng(),
        }
    }

    fn next_pcap(&mut self, swapped: bool, nanos: bool, linktype: u32) -> Option<Packet<'_>> {
        if !self.need(16, "a packet record header") {
            return None;
        }
        let h = &self.buf[self.start..self.start + 16];
        let sec = u32_at(&h[0..4], swapped) as i64;
        let frac = u32_at(&h[4..8], swapped) as i64;
        let caplen = u32_at(&h[8..12], swapped) as usize;
        let mut orig = u32_at(&h[12..16], swapped);
        if caplen > MAX_RECORD || (!nanos && frac >= 1_000_000) || (nanos && frac >= 1_000_000_000) {
            let at = self.offset;
            self.corrupt(format!(
                "corrupted packet record at byte {} (captured length {}, fraction {}): cannot find the next \
                 record; packets before it are kept",
                at, caplen, frac
            ));
            return None;
        }
        if !self.need(16 + caplen, "a packet record") {
            return None;
        }
        if (orig as usize) < caplen {
            self.stats.bad_lengths += 1;
            orig = caplen as u32;
        }
        let ts_ns = sec * 1_000_000_000 + if nanos { frac } else { frac * 1000 };
        let s = self.start + 16;
        self.consume(16 + caplen);
        self.stats.packets += 1;
        self.stats.bytes += caplen as u64;
        Some(Packet { ts_ns, orig_len: orig, linktype, data: &self.buf[s..s + caplen] })
    }

    fn next_pcapng(&mut self) -> Option<Packet<'_>> {
        loop {
            if !self.need(12, "a pcapng block header") {
                return None;
            }
            let Format::PcapNg { mut swapped } = self.format else { unreachable!() };
            let btype_raw = u32::from_le_bytes(self.buf[self.start..self.start + 4].try_into().unwrap());
            if btype_raw == 0x0a0d0d0a {
                // Section header: byte order from its magic.
                let bom = u32::from_le_bytes(self.buf[self.start + 8..self.start + 12].try_into().unwrap());
                swapped = match bom {
                    0x1a2b3c4d => false,
                    0x4d3c2b1a => true,
                    _ => {
                        let at = self.offset;
                        self.corrupt(format!("corrupted pcapng section header at byte {at}: byte-order magic {bom:08x}"));
                        return None;
                    }
                };
                self.format = Format::PcapNg { swapped };
                self.interfaces.clear();
            }
            let btype = u32_at(&self.buf[self.start..self.start + 4], swapped);
            let blen = u32_at(&self.buf[self.start + 4..self.start + 8], swapped) as usize;
            if blen < 12 || !blen.is_multiple_of(4) || blen > MAX_RECORD + 64 {
                let at = self.offset;
                self.corrupt(format!("corrupted pcapng block at byte {at} (type {btype:#x}, length {blen}); packets before it are kept"));
                return None;
            }
            if !self.need(blen, "a pcapng block") {
                return None;
            }
            let s = self.start;
            let body = s + 8..s + blen - 4;
            match btype {
                0x0a0d0d0a => {
                    self.consume(blen);
                }
                1 => {
                    // Interface Description Block
                    let b = &self.buf[body.clone()];
                    if b.len() < 8 {
                        let at = self.offset;
                        self.corrupt(format!("corrupted pcapng interface block at byte {at}"));
                        return None;
                    }
                    let linktype = u16_at(&b[0..2], swapped) as u32;
                    let mut units_per_s = 1_000_000u64;
                    let mut o = 8;
                    while o + 4 <= b.len() {
                        let code = u16_at(&b[o..o + 2], swapped);
                        let len = u16_at(&b[o + 2..o + 4], swapped) as usize;
                        if code == 0 || o + 4 + len > b.len() {
                            break;
                        }
                        if code == 9 && len >= 1 {
                            let v = b[o + 4];
                            let exp = (v & 0x7f) as u32;
                            units_per_s = if v & 0x80 == 0 {
                                10u64.checked_pow(exp).unwrap_or(1_000_000_000)
                            } else {
                                1u64.checked_shl(exp).unwrap_or(1 << 30)
                            };
                        }
                        o += 4 + ((len + 3) & !3);
                    }
                    if units_per_s == 0 {
                        units_per_s = 1_000_000;
                    }
                    if self.interfaces.is_empty() {
                        self.ts_precision_ns = (1_000_000_000 / units_per_s).max(1);
                    }
                    self.interfaces.push(Interface { linktype, units_per_s });
                    self.consume(blen);
                }
                6 | 2 => {
                    // Enhanced Packet Block (6); obsolete Packet Block (2) has the same layout
                    // except a 16-bit interface id followed by a 16-bit drops count.
                    let b = &self.buf[body.clone()];
                    if b.len() < 20 {
                        let at = self.offset;
                        self.corrupt(format!("corrupted pcapng packet block at byte {at}"));
                        return None;
                    }
                    let iface = if btype == 6 { u32_at(&b[0..4], swapped) } else { u16_at(&b[0..2], swapped) as u32 } as usize;
                    let hi = u32_at(&b[4..8], swapped) as u64;
                    let lo = u32_at(&b[8..12], swapped) as u64;
                    let caplen = u32_at(&b[12..16], swapped) as usize;
                    let mut orig = u32_at(&b[16..20], swapped);
                    if 20 + caplen > b.len() {
                        let at = self.offset;
                        self.corrupt(format!("corrupted pcapng packet block at byte {at}: captured length {caplen} exceeds the block"));
                        return None;
                    }
                    let Some(ifc) = self.interfaces.get(iface).copied() else {
                        self.stats.unknown_interface += 1;
                        self.consume(blen);
                        continue;
                    };
                    if (orig as usize) < caplen {
                        self.stats.bad_lengths += 1;
                        orig = caplen as u32;
                    }
                    let ts_ns = units_to_ns((hi << 32) | lo, ifc.units_per_s);
                    let d = body.start + 20;
                    self.consume(blen);
                    self.stats.packets += 1;
                    self.stats.bytes += caplen as u64;
                    return Some(Packet { ts_ns, orig_len: orig, linktype: ifc.linktype, data: &self.buf[d..d + caplen] });
                }
                3 => {
                    // Simple Packet Block: interface 0, no timestamp (we keep the last one: 0).
                    let b = &self.buf[body.clone()];
                    if b.len() < 4 {
                        self.consume(blen);
                        continue;
                    }
                    let orig = u32_at(&b[0..4], swapped);
                    let Some(ifc) = self.interfaces.first().copied() else {
                        self.stats.unknown_interface += 1;
                        self.consume(blen);
                        continue;
                    };
                    let caplen = (orig as usize).min(b.len() - 4);
                    let d = body.start + 4;
                    self.consume(blen);
                    self.stats.packets += 1;
                    self.stats.bytes += caplen as u64;
                    return Some(Packet { ts_ns: 0, orig_len: orig, linktype: ifc.linktype, data: &self.buf[d..d + caplen] });
                }
                _ => {
                    self.stats.skipped_blocks += 1;
                    self.consume(blen);
                }
            }
        }
    }
}

#[inline]
fn units_to_ns(units: u64, units_per_s: u64) -> i64 {
    match units_per_s {
        1_000_000 => (units * 1000) as i64,
        1_000_000_000 => units as i64,
        u => ((units as u128 * 1_000_000_000u128) / u as u128) as i64,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pcap_file(nanos: bool, records: &[(u32, u32, &[u8])]) -> Vec<u8> {
        let mut f = Vec::new();
        f.extend_from_slice(&(if nanos { 0xa1b23c4du32 } else { 0xa1b2c3d4u32 }).to_le_bytes());
        f.extend_from_slice(&2u16.to_le_bytes());
        f.extend_from_slice(&4u16.to_le_bytes());
        f.extend_from_slice(&[0; 8]);
        f.extend_from_slice(&65535u32.to_le_bytes());
        f.extend_from_slice(&1u32.to_le_bytes());
        for (s, frac, data) in records {
            f.extend_from_slice(&s.to_le_bytes());
            f.extend_from_slice(&frac.to_le_bytes());
            f.extend_from_slice(&(data.len() as u32).to_le_bytes());
            f.extend_from_slice(&(data.len() as u32 + 10).to_le_bytes());
            f.extend_from_slice(data);
        }
        f
    }

    #[test]
    fn reads_pcap_records_and_times() {
        let f = pcap_file(false, &[(10, 5, b"abc"), (11, 999_999, b"de")]);
        let mut r = CaptureReader::new(&f[..], "t").unwrap();
        let p = r.next_packet().unwrap();
        assert_eq!((p.ts_ns, p.orig_len, p.data), (10_000_005_000, 13, &b"abc"[..]));
        let p = r.next_packet().unwrap();
        assert_eq!(p.ts_ns, 11_999_999_000);
        assert!(r.next_packet().is_none());
        assert!(r.stop_reason.is_none());
    }

    #[test]
    fn truncated_pcap_keeps_earlier_packets_and_says_where() {
        let f = pcap_file(true, &[(1, 7, b"abc"), (2, 8, b"defgh")]);
        let cut = &f[..f.len() - 2];
        let mut r = CaptureReader::new(cut, "t").unwrap();
        assert_eq!(r.next_packet().unwrap().ts_ns, 1_000_000_007);
        assert!(r.next_packet().is_none());
        let why = r.stop_reason.clone().unwrap();
        assert!(why.contains("truncated at byte 43"), "{why}");
        assert!(!r.damaged); // a file cut short (a killed tcpdump) is not damage
    }

    #[test]
    fn rejects_non_capture_with_its_first_bytes() {
        let err = CaptureReader::new(&b"hello world, not a capture"[..], "x.txt").err().unwrap().to_string();
        assert!(err.contains("not a capture file") && err.contains("68 65 6c 6c"), "{err}");
    }

    #[test]
    fn corrupted_record_length_stops_with_message() {
        let mut f = pcap_file(false, &[(1, 0, b"abc")]);
        f.extend_from_slice(&[1, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 0xff, 0x7f, 0, 0, 0, 0]);
        let mut r = CaptureReader::new(&f[..], "t").unwrap();
        assert!(r.next_packet().is_some());
        assert!(r.next_packet().is_none());
        assert!(r.damaged);
        assert!(r.stop_reason.unwrap().contains("corrupted packet record"));
    }

    #[test]
    fn caplen_near_u32_max_is_damage_after_the_packets_before_it() {
        let mut f = pcap_file(false, &[(1, 0, b"abc"), (2, 0, b"de")]);
        f.extend_from_slice(&[3, 0, 0, 0, 0, 0, 0, 0, 0xf0, 0xff, 0xff, 0xff, 0xf0, 0xff, 0xff, 0xff]);
        f.extend_from_slice(&[0u8; 64]);
        let mut r = CaptureReader::new(&f[..], "t").unwrap();
        assert!(r.next_packet().is_some() && r.next_packet().is_some());
        assert!(r.next_packet().is_none());
        assert_eq!(r.stats.packets, 2);
        assert!(r.damaged);
        let why = r.stop_reason.unwrap();
        assert!(why.contains("corrupted packet record at byte 61") && why.contains("4294967280"), "{why}");
    }

    #[test]
    fn reads_pcapng_with_nanosecond_interface() {
        let mut f = Vec::new();
        // SHB
        let shb_body: Vec<u8> = [0x1a2b3c4du32.to_le_bytes().to_vec(), vec![1, 0, 0, 0], (-1i64).to_le_bytes().to_vec()].concat();
        block(&mut f, 0x0a0d0d0a, &shb_body);
        // IDB linktype 113, tsresol 9
        let mut idb = vec![113, 0, 0, 0, 0, 0, 4, 0];
        idb.extend_from_slice(&[9, 0, 1, 0, 9, 0, 0, 0, 0, 0, 0, 0]);
        block(&mut f, 1, &idb);
        // EPB
        let ts: u64 = 1_700_000_000_123_456_789;
        let mut epb = Vec::new();
        epb.extend_from_slice(&0u32.to_le_bytes());
        epb.extend_from_slice(&((ts >> 32) as u32).to_le_bytes());
        epb.extend_from_slice(&(ts as u32).to_le_bytes());
        epb.extend_from_slice(&3u32.to_le_bytes());
        epb.extend_from_slice(&60u32.to_le_bytes());
        epb.extend_from_slice(&[7, 8, 9, 0]);
        block(&mut f, 6, &epb);
        block(&mut f, 5, &[0; 8]); // statistics: skipped
        let mut r = CaptureReader::new(&f[..], "t").unwrap();
        let p = r.next_packet().unwrap();
        assert_eq!((p.ts_ns, p.linktype, p.orig_len, p.data), (ts as i64, 113, 60, &[7u8, 8, 9][..]));
        assert!(r.next_packet().is_none());
        assert_eq!(r.stats.skipped_blocks, 1);
        assert_eq!(r.ts_precision_ns, 1);
    }

    fn block(f: &mut Vec<u8>, t: u32, body: &[u8]) {
        let len = 12 + body.len() as u32;
        f.extend_from_slice(&t.to_le_bytes());
        f.extend_from_slice(&len.to_le_bytes());
        f.extend_from_slice(body);
        f.extend_from_slice(&len.to_le_bytes());
    }
}
