//! Link, IP and TCP header decoding: from a captured frame to a TCP segment, without copying.
//!
//! Link types: Ethernet (1, with 802.1Q/802.1ad tags), Linux cooked SLL (113) and SLL2 (276),
//! raw IP (101, 12, 14, 228, 229) and BSD loopback (0, 108). IPv4 (non-first fragments are
//! skipped and counted) and IPv6 (hop-by-hop, routing, destination-options headers skipped).

/// An endpoint address; IPv4 is stored as an IPv4-mapped IPv6 address.
pub type Ip = [u8; 16];

#[derive(Debug, Clone, Copy)]
pub struct Segment<'a> {
    /// Addresses as big-endian integers (`Ip` bytes via `to_be_bytes`): kept in registers on
    /// the per-packet path, where byte arrays went through memory.
    pub src: u128,
    pub dst: u128,
    pub sport: u16,
    pub dport: u16,
    pub seq: u32,
    pub flags: u8,
    /// The captured part of the TCP payload.
    pub payload: &'a [u8],
    /// The payload length on the wire (>= payload.len(); larger when the snapshot length cut it).
    pub wire_len: u32,
}

pub const FIN: u8 = 0x01;
pub const SYN: u8 = 0x02;
pub const RST: u8 = 0x04;
pub const ACK: u8 = 0x10;

/// Why a packet did not yield a TCP segment.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Skip {
    /// a link type the tracer does not decode
    LinkType,
    /// neither IPv4 nor IPv6 (ARP, LLDP...)
    NotIp,
    /// IP but not TCP (UDP, ICMP...)
    NotTcp,
    /// a non-first IPv4 fragment or an IPv6 fragment
    Fragment,
    /// headers cut by the snapshot length or inconsistent lengths
    Malformed,
}

#[inline]
fn be16(b: &[u8], o: usize) -> u16 {
    u16::from_be_bytes([b[o], b[o + 1]])
}

#[inline]
fn be32(b: &[u8], o: usize) -> u32 {
    u32::from_be_bytes([b[o], b[o + 1], b[o + 2], b[o + 3]])
}

/// Decode one captured frame. `orig_len` is the frame's length on the wire.
#[inline(always)]
pub fn decode(linktype: u32, data: &[u8], orig_len: u32) -> Result<Segment<'_>, Skip> {
    let (l3, ethertype) = match linktype {
        1 => {
            if data.len() < 14 {
                return Err(Skip::Malformed);
            }
            let mut o = 12;
            let mut et = be16(data, o);
            while et == 0x8100 || et == 0x88a8 {
                o += 4;
                if data.len() < o + 2 {
                    return Err(Skip::Malformed);
                }
                et = be16(data, o);
            }
            (o + 2, et)
        }
        113 => {
            if data.len() < 16 {
                return Err(Skip::Malformed);
            }
            (16, be16(data, 14))
        }
        276 => {
            if data.len() < 20 {
                return Err(Skip::Malformed);
            }
            (20, be16(data, 0))
        }
        101 | 12 | 14 => {
            let v = data.first().map(|b| b >> 4).ok_or(Skip::Malformed)?;
            (0, if v == 6 { 0x86dd } else { 0x0800 })
        }
        228 => (0, 0x0800),
        229 => (0, 0x86dd),
        0 | 108 => {
            if data.len() < 4 {
                return Err(Skip::Malformed);
            }
            let fam = u32::from_le_bytes([data[0], data[1], data[2], data[3]]);
            let fam = if fam > 0xffff { fam.swap_bytes() } else { fam };
            (
                4,
                if fam == 2 {
                    0x0800
                } else if matches!(fam, 10 | 24 | 28 | 30) {
                    0x86dd
                } else {
                    0
                },
            )
        }
        _ => return Err(Skip::LinkType),
    };
    let wire_l3 = (orig_len as usize).saturating_sub(l3);
    let ip = data.get(l3..).ok_or(Skip::Malformed)?;
    match ethertype {
        0x0800 => ipv4(ip, wire_l3),
        0x86dd => ipv6(ip, wire_l3),
        _ => Err(Skip::NotIp),
    }
}

#[inline(always)]
fn ipv4(ip: &[u8], wire_len: usize) -> Result<Segment<'_>, Skip> {
    if ip.len() < 20 || ip[0] >> 4 != 4 {
        return Err(Skip::Malformed);
    }
    let ihl = ((ip[0] & 0x0f) as usize) * 4;
    if ihl < 20 || ip.len() < ihl {
        return Err(Skip::Malformed);
    }
    let mut total = be16(ip, 2) as usize;
    if total == 0 {
        total = wire_len; // TSO: length left to the NIC
    }
    if total < ihl {
        return Err(Skip::Malformed);
    }
    let frag = be16(ip, 6);
    if frag & 0x1fff != 0 {
        return Err(Skip::Fragment);
    }
    if ip[9] != 6 {
        return Err(Skip::NotTcp);
    }
    // IPv4-mapped IPv6: ::ffff:a.b.c.d
    let mapped = |o: usize| (0xffff_u128 << 32) | be32(ip, o) as u128;
    let (src, dst) = (mapped(12), mapped(16));
    let captured_end = ip.len().min(total);
    tcp(&ip[ihl..captured_end], total - ihl, src, dst)
}

#[inline(always)]
fn ipv6(ip: &[u8], _wire_len: usize) -> Result<Segment<'_>, Skip> {
    if ip.len() < 40 || ip[0] >> 4 != 6 {
        return Err(Skip::Malformed);
    }
    let payload_len = be16(ip, 4) as usize;
    let mut next = ip[6];
    let src = u128::from_be_bytes(ip[8..24].try_into().unwrap());
    let dst = u128::from_be_bytes(ip[24..40].try_into().unwrap());
    let mut o = 40;
    let end_wire = 40 + payload_len;
    loop {
        match next {
            6 => break,
            0 | 43 | 60 => {
                if ip.len() < o + 2 {
                    return Err(Skip::Malformed);
                }
                next = ip[o];
                o += (ip[o + 1] as usize + 1) * 8;
            }
            44 => return Err(Skip::Fragment),
            _ => return Err(Skip::NotTcp),
        }
    }
    if o > end_wire || o > ip.len() {
        return Err(Skip::Malformed);
    }
    let captured_end = ip.len().min(end_wire);
    tcp(&ip[o..captured_end], end_wire - o, src, dst)
}

#[inline(always)]
fn tcp(t: &[u8], wire_len: usize, src: u128, dst: u128) -> Result<Segment<'_>, Skip> {
    if t.len() < 20 {
        return Err(Skip::Malformed);
    }
    let off = ((t[12] >> 4) as usize) * 4;
    if off < 20 || t.len() < off || wire_len < off {
        return Err(Skip::Malformed);
    }
    Ok(Segment {
        src,
        dst,
        sport: be16(t, 0),
        dport: be16(t, 2),
        seq: be32(t, 4),
        flags: t[13],
        payload: &t[off..],
        wire_len: (wire_len - off) as u32,
    })
}

/// `a.b.c.d` for IPv4-mapped addresses, RFC 5952 text otherwise.
pub fn ip_text(ip: &Ip) -> String {
    if ip[..10].iter().all(|&b| b == 0) && ip[10] == 0xff && ip[11] == 0xff {
        std::net::Ipv4Addr::new(ip[12], ip[13], ip[14], ip[15]).to_string()
    } else {
        std::net::Ipv6Addr::from(*ip).to_string()
    }
}

/// `addr:port`, with brackets around IPv6 addresses.
pub fn endpoint_text(ip: &Ip, port: u16) -> String {
    let t = ip_text(ip);
    if t.contains(':') {
        format!("[{t}]:{port}")
    } else {
        format!("{t}:{port}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    pub fn eth_ipv4_tcp(sport: u16, dport: u16, seq: u32, flags: u8, payload: &[u8]) -> Vec<u8> {
        let mut f = vec![0u8; 12];
        f.extend_from_slice(&[0x08, 0x00]);
        let total = 20 + 20 + payload.len();
        f.extend_from_slice(&[0x45, 0, (total >> 8) as u8, total as u8, 0, 0, 0x40, 0, 64, 6, 0, 0, 10, 0, 0, 1, 10, 0, 0, 2]);
        f.extend_from_slice(&sport.to_be_bytes());
        f.extend_from_slice(&dport.to_be_bytes());
        f.extend_from_slice(&seq.to_be_bytes());
        f.extend_from_slice(&[0, 0, 0, 0, 0x50, flags, 0xff, 0xff, 0, 0, 0, 0]);
        f.extend_from_slice(payload);
        f
    }

    #[test]
    fn decodes_ethernet_ipv4_tcp_and_trims_padding() {
        let mut f = eth_ipv4_tcp(40000, 80, 7, ACK, b"GET");
        f.extend_from_slice(&[0; 6]); // Ethernet padding
        let s = decode(1, &f, f.len() as u32).unwrap();
        assert_eq!((s.sport, s.dport, s.seq, s.payload, s.wire_len), (40000, 80, 7, &b"GET"[..], 3));
        assert_eq!(endpoint_text(&s.src.to_be_bytes(), s.sport), "10.0.0.1:40000");
    }

    #[test]
    fn snapshot_cut_payload_keeps_wire_length() {
        let f = eth_ipv4_tcp(1, 2, 0, ACK, &[b'x'; 500]);
        let s = decode(1, &f[..100], f.len() as u32).unwrap();
        assert_eq!((s.payload.len(), s.wire_len), (46, 500));
    }

    #[test]
    fn non_tcp_and_garbage_are_classified() {
        let mut f = eth_ipv4_tcp(1, 2, 0, ACK, b"");
        f[14 + 9] = 17;
        assert_eq!(decode(1, &f, f.len() as u32).unwrap_err(), Skip::NotTcp);
        f[12] = 0x08;
        f[13] = 0x06;
        assert_eq!(decode(1, &f, f.len() as u32).unwrap_err(), Skip::NotIp);
        let g = eth_ipv4_tcp(1, 2, 0, ACK, b"");
        assert_eq!(decode(1, &g[..20], 60).unwrap_err(), Skip::Malformed);
        assert_eq!(decode(147, &f, 60).unwrap_err(), Skip::LinkType);
    }

    #[test]
    fn decodes_sll2_ipv6() {
        let mut f = vec![0x86, 0xdd, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0];
        let mut ip = vec![0x60, 0, 0, 0, 0, 24, 6, 64];
        ip.extend_from_slice(&[0; 15]);
        ip.push(1);
        ip.extend_from_slice(&[0; 15]);
        ip.push(1);
        ip.extend_from_slice(&[0x1f, 0x90, 0x9c, 0x40, 0, 0, 0, 9, 0, 0, 0, 0, 0x50, 0x18, 0, 0, 0, 0, 0, 0]);
        ip.extend_from_slice(b"HTTP");
        f.extend_from_slice(&ip);
        let s = decode(276, &f, f.len() as u32).unwrap();
        assert_eq!((s.sport, s.dport, s.payload), (8080, 40000, &b"HTTP"[..]));
        assert_eq!(endpoint_text(&s.src.to_be_bytes(), s.sport), "[::1]:8080");
    }
}
