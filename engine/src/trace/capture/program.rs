//! The eBPF capture program: the classic filter tcpdump compiles (`tcpdump -ddd`) translated
//! instruction by instruction to eBPF, followed by the capture itself (a record reserved in a
//! ring buffer map, the time, the lengths and the packet's first bytes copied in, submitted
//! without waking the reader). The program runs on the TC hook (`tcx`) and always lets the
//! packet go on (`TCX_NEXT`): it only looks.
//!
//! The translation follows the kernel's own (`bpf_convert_filter`): A is R0, X is R7, the
//! context (the `__sk_buff`) R6, the scratch words M[0..15] the stack below the frame pointer.
//! A packet load reads the packet directly (R8 and R9 hold `data` and `data_end` while the filter
//! runs: a bounds check, one load, a byte swap) when its bytes are in the linear part, and is
//! eBPF's `LD_ABS`/`LD_IND` otherwise, which reads the rest of the packet and keeps the classic
//! meaning of a load past its end (the program stops, nothing captured). `LD_ABS` is a call into
//! the kernel, and the lab's filter makes about a dozen loads per packet: half the program's time
//! before (docs/performance.md). A classic `RET k` becomes "accept k bytes": R9 = k, then the
//! capture, which takes min(k, snapshot length, packet length) bytes, or none.

use super::Insn;

/// A classic instruction this translation does not take (ancillary loads, `BPF_RET|BPF_X` and
/// the like are not what tcpdump emits for the lab's filters); the capture then falls back to
/// the packet socket, which runs the classic program as it is.
#[derive(Debug, PartialEq, thiserror::Error)]
pub enum TranslateError {
    #[error("classic instruction {index} (code {code:#06x}) has no eBPF translation here")]
    Unsupported { index: usize, code: u16 },
    #[error("classic instruction {index} loads from offset {k:#x} (an ancillary or negative offset)")]
    Ancillary { index: usize, k: u32 },
    #[error("classic instruction {index} jumps past the program's end")]
    JumpOut { index: usize },
    #[error("the translated program is too long ({0} instructions)")]
    TooLong(usize),
}

/// One eBPF instruction (`struct bpf_insn`).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct EInsn {
    pub code: u8,
    pub dst: u8,
    pub src: u8,
    pub off: i16,
    pub imm: i32,
}

impl EInsn {
    pub fn encode(&self) -> u64 {
        (self.code as u64)
            | (((self.dst & 0xf) | ((self.src & 0xf) << 4)) as u64) << 8
            | ((self.off as u16 as u64) << 16)
            | ((self.imm as u32 as u64) << 32)
    }
}

// classes (eBPF) and fields shared with classic BPF
const LD: u8 = 0x00;
const LDX: u8 = 0x01;
const ST: u8 = 0x02;
const STX: u8 = 0x03;
const ALU: u8 = 0x04;
const JMP: u8 = 0x05;
const JMP32: u8 = 0x06;
const ALU64: u8 = 0x07;
const W: u8 = 0x00;
const DW: u8 = 0x18;
const IMM: u8 = 0x00;
const ABS: u8 = 0x20;
const IND: u8 = 0x40;
const MEM: u8 = 0x60;
const K: u8 = 0x00;
const X: u8 = 0x08;
const MOV: u8 = 0xb0;
const ADD: u8 = 0x00;
const JA: u8 = 0x00;
const JEQ: u8 = 0x10;
const JLE: u8 = 0xb0;
const JGT: u8 = 0x20;
const CALL: u8 = 0x80;
const EXIT: u8 = 0x90;
// classic-only fields
const C_RET: u16 = 0x06;
const C_MISC: u16 = 0x07;
const C_LEN: u16 = 0x80;
const C_MSH: u16 = 0xa0;

// registers
const R0: u8 = 0; // A
const R1: u8 = 1;
const R2: u8 = 2;
const R3: u8 = 3;
const R4: u8 = 4;
const R6: u8 = 6; // the __sk_buff
const R7: u8 = 7; // X
const R8: u8 = 8; // the packet's `data` while the filter runs; then the reserved record
const R9: u8 = 9; // the packet's `data_end` while the filter runs; then the bytes it accepts
const R10: u8 = 10;

// helpers (include/uapi/linux/bpf.h)
const MAP_LOOKUP_ELEM: i32 = 1;
const SKB_LOAD_BYTES: i32 = 26;
const RINGBUF_SUBMIT: i32 = 132;
const RINGBUF_DISCARD: i32 = 133;
const RINGBUF_RESERVE: i32 = 131;
const KTIME_GET_TAI_NS: i32 = 208;
const RB_NO_WAKEUP: i32 = 1;
const PSEUDO_MAP_FD: u8 = 1;
/// TCX_NEXT: the packet goes on to the next program or the stack, as if nothing had run.
const TCX_NEXT: i32 = -1;

/// A record in the ring: the capture time (CLOCK_TAI, ns), the bytes copied, the packet's length,
/// then the bytes.
pub const RECORD_HEADER: usize = 16;

/// Bytes reserved per record for a snapshot length (the header, the bytes, 8-byte aligned).
fn record_size(snaplen: u32) -> u32 {
    (RECORD_HEADER as u32 + snaplen + 7) & !7
}

fn i(code: u8, dst: u8, src: u8, off: i16, imm: i32) -> EInsn {
    EInsn { code, dst, src, off, imm }
}

fn scratch(k: u32) -> i16 {
    -4 * (k as i16 + 1)
}

/// Where MSH keeps A while it loads (below the scratch words and the drop path's key).
const SAVED_A: i16 = -80;
// `struct __sk_buff`'s `data` and `data_end`
const SKB_DATA: i16 = 76;
const SKB_DATA_END: i16 = 80;
const END_TO_BE: u8 = 0xd8; // BPF_END | BPF_TO_BE
/// The largest offset (X + k, k) a direct load takes; past it the helper does (the verifier's
/// MAX_PACKET_OFF is 0xffff).
const DIRECT_MAX: u32 = 0x7fff;

/// A (R0) = the packet's `size` bytes at k (ABS) or X + k (IND), in network order: read directly
/// when they are in the linear part, else by `LD_ABS`/`LD_IND` (non-linear data, or past the end).
fn packet_load(out: &mut Vec<EInsn>, mode: u8, size: u8, k: u32) {
    let width = match size {
        0x00 => 4,
        0x08 => 2,
        _ => 1,
    };
    let helper = i(LD | mode | size, 0, if mode == IND { R7 } else { 0 }, 0, k as i32);
    if k + width > DIRECT_MAX {
        out.push(helper);
        return;
    }
    let mut to_helper = Vec::new();
    let base = if mode == IND {
        // X bounded first: the verifier adds only a bounded scalar to a packet pointer
        to_helper.push(out.len());
        out.push(i(JMP | JGT | K, R7, 0, 0, DIRECT_MAX as i32));
        out.push(i(ALU64 | MOV | X, R3, R8, 0, 0));
        out.push(i(ALU64 | ADD | X, R3, R7, 0, 0));
        R3
    } else {
        R8
    };
    out.push(i(ALU64 | MOV | X, R2, base, 0, 0));
    out.push(i(ALU64 | ADD | K, R2, 0, 0, (k + width) as i32));
    to_helper.push(out.len());
    out.push(i(JMP | JGT | X, R2, R9, 0, 0));
    out.push(i(LDX | MEM | size, R0, base, k as i16, 0));
    if width > 1 {
        out.push(i(ALU | END_TO_BE, R0, 0, 0, 8 * width as i32));
    }
    out.push(i(JMP | JA, 0, 0, 1, 0));
    for at in to_helper {
        out[at].off = (out.len() - at - 1) as i16;
    }
    out.push(helper);
}

/// The capture program: `classic` (its accept values already capped) translated, then the
/// capture into the ring buffer map `ring` (its drops counted in slot 0 of the per-CPU array map
/// `drops`). Returns the instructions.
pub fn capture_program(classic: &[Insn], snaplen: u32, ring: i32, drops: i32) -> Result<Vec<EInsn>, TranslateError> {
    let mut out: Vec<EInsn> = Vec::with_capacity(classic.len() * 2 + 64);
    // prologue: the context kept, A and X zero, the scratch words zero (the verifier reads no
    // uninitialised stack)
    out.push(i(ALU64 | MOV | X, R6, 1, 0, 0));
    out.push(i(ALU | MOV | K, R0, 0, 0, 0));
    out.push(i(ALU | MOV | K, R7, 0, 0, 0));
    out.push(i(LDX | MEM | W, R8, R6, SKB_DATA, 0));
    out.push(i(LDX | MEM | W, R9, R6, SKB_DATA_END, 0));
    let uses_scratch = classic.iter().any(|c| matches!((c.code & 7, c.code & 0xe0), (0 | 1, 0x60) | (2 | 3, _)));
    if uses_scratch {
        for k in 0..16 {
            out.push(i(ST | MEM | W, R10, 0, scratch(k), 0));
        }
    }
    // (eBPF index of a jump, classic target index); usize::MAX: the capture
    let mut fixups: Vec<(usize, usize)> = Vec::new();
    let mut start = Vec::with_capacity(classic.len());
    const CAPTURE: usize = usize::MAX;
    for (idx, c) in classic.iter().enumerate() {
        start.push(out.len());
        let code = c.code;
        let class = code & 7;
        let unsupported = || TranslateError::Unsupported { index: idx, code };
        let size = (code & 0x18) as u8;
        let mode = code & 0xe0;
        match class {
            0 | 1 if mode == ABS as u16 || mode == IND as u16 || mode == C_MSH => {
                if c.k >= 0x8000_0000 {
                    return Err(TranslateError::Ancillary { index: idx, k: c.k });
                }
                if class == 1 && mode != C_MSH {
                    return Err(unsupported());
                }
                if mode == C_MSH {
                    // X = 4 * (P[k] & 0xf), A kept on the stack across the load
                    if size != 0x10 {
                        return Err(unsupported());
                    }
                    out.push(i(STX | MEM | W, R10, R0, SAVED_A, 0));
                    packet_load(&mut out, ABS, 0x10, c.k);
                    out.push(i(ALU | 0x50 | K, R0, 0, 0, 0xf));
                    out.push(i(ALU | 0x60 | K, R0, 0, 0, 2));
                    out.push(i(ALU64 | MOV | X, R7, R0, 0, 0));
                    out.push(i(LDX | MEM | W, R0, R10, SAVED_A, 0));
                } else {
                    packet_load(&mut out, mode as u8, size, c.k);
                }
            }
            0 | 1 => {
                let dst = if class == 0 { R0 } else { R7 };
                if size != 0 {
                    return Err(unsupported());
                }
                match mode {
                    0x00 => out.push(i(ALU | MOV | K, dst, 0, 0, c.k as i32)),
                    0x60 if c.k < 16 => out.push(i(LDX | MEM | W, dst, R10, scratch(c.k), 0)),
                    C_LEN => out.push(i(LDX | MEM | W, dst, R6, 0, 0)), // __sk_buff.len
                    _ => return Err(unsupported()),
                }
            }
            2 | 3 if c.k < 16 && code & !7 == 0 => {
                let src = if class == 2 { R0 } else { R7 };
                out.push(i(STX | MEM | W, R10, src, scratch(c.k), 0));
            }
            4 => {
                // the op and K/X bits are the same in eBPF's 32-bit ALU class
                let op = (code & 0xf0) as u8;
                if op > 0xa0 {
                    return Err(unsupported());
                }
                let src = if code & 0x08 != 0 { R7 } else { 0 };
                out.push(i(ALU | op | (code & 0x08) as u8, R0, src, 0, c.k as i32));
            }
            5 => {
                let op = (code & 0xf0) as u8;
                let target = |off: u8| {
                    let t = idx + 1 + off as usize;
                    if t >= classic.len() {
                        Err(TranslateError::JumpOut { index: idx })
                    } else {
                        Ok(t)
                    }
                };
                if op == JA {
                    let t = idx + 1 + c.k as usize;
                    if t >= classic.len() {
                        return Err(TranslateError::JumpOut { index: idx });
                    }
                    fixups.push((out.len(), t));
                    out.push(i(JMP | JA, 0, 0, 0, 0));
                } else if op <= 0x40 {
                    // unsigned 32-bit compares of A: eBPF's JMP32 class, same op and K/X bits
                    let (t, f) = (target(c.jt)?, target(c.jf)?);
                    let src = if code & 0x08 != 0 { R7 } else { 0 };
                    fixups.push((out.len(), t));
                    out.push(i(JMP32 | op | (code & 0x08) as u8, R0, src, 0, c.k as i32));
                    if f != idx + 1 {
                        fixups.push((out.len(), f));
                        out.push(i(JMP | JA, 0, 0, 0, 0));
                    }
                } else {
                    return Err(unsupported());
                }
            }
            6 => {
                match code {
                    C_RET => out.push(i(ALU | MOV | K, R9, 0, 0, c.k as i32)),
                    0x16 => out.push(i(ALU | MOV | X, R9, R0, 0, 0)), // RET A
                    _ => return Err(unsupported()),
                }
                fixups.push((out.len(), CAPTURE));
                out.push(i(JMP | JA, 0, 0, 0, 0));
            }
            7 => match code {
                C_MISC => out.push(i(ALU | MOV | X, R7, R0, 0, 0)), // TAX
                0x87 => out.push(i(ALU | MOV | X, R0, R7, 0, 0)),   // TXA
                _ => return Err(unsupported()),
            },
            _ => return Err(unsupported()),
        }
    }
    // the kernel's checker refuses a classic program that can run off its end; so does this
    if let Some(last) = classic.last().filter(|c| c.code & 7 != 6) {
        return Err(TranslateError::Unsupported { index: classic.len() - 1, code: last.code });
    }
    let capture_at = out.len();
    capture(&mut out, snaplen, ring, drops);
    for (at, target) in fixups {
        let to = if target == CAPTURE { capture_at } else { start[target] };
        let off = to as i64 - at as i64 - 1;
        out[at].off = i16::try_from(off).map_err(|_| TranslateError::TooLong(out.len()))?;
    }
    Ok(out)
}

fn ld_map(out: &mut Vec<EInsn>, dst: u8, fd: i32) {
    out.push(i(LD | IMM | DW, dst, PSEUDO_MAP_FD, 0, fd));
    out.push(i(0, 0, 0, 0, 0));
}

/// The record sizes the program reserves (the ring takes only constant sizes): the smallest class
/// that holds a packet's bytes, so that a large snapshot length does not reserve its whole size
/// for every small packet.
fn size_classes(snaplen: u32) -> Vec<u32> {
    let mut c: Vec<u32> = (6..17).map(|b| 1u32 << b).filter(|&c| c < snaplen).collect();
    c.push(snaplen);
    c
}

/// R9 bytes accepted (0: none): min(R9, packet length, snapshot length) bytes into a record of
/// the smallest size class that holds them.
fn capture(out: &mut Vec<EInsn>, snaplen: u32, ring: i32, drops: i32) {
    let mut pass_jumps = Vec::new();
    let mut drop_jumps = Vec::new();
    // R9 = min(R9, skb->len), then min(R9, snaplen) (a constant: the verifier then knows the copy
    // fits the record), then none at all if 0
    out.push(i(LDX | MEM | W, R2, R6, 0, 0));
    out.push(i(JMP | JLE | X, R9, R2, 1, 0));
    out.push(i(ALU64 | MOV | X, R9, R2, 0, 0));
    out.push(i(JMP | JLE | K, R9, 0, 1, snaplen as i32));
    out.push(i(ALU64 | MOV | K, R9, 0, 0, snaplen as i32));
    pass_jumps.push(out.len());
    out.push(i(JMP | JLE | K, R9, 0, 0, 0));
    let classes = size_classes(snaplen);
    for (n, &class) in classes.iter().enumerate() {
        let bigger = (n + 1 < classes.len()).then(|| {
            out.push(i(JMP | JGT | K, R9, 0, 0, class as i32));
            out.len() - 1
        });
        ld_map(out, R1, ring);
        out.push(i(ALU64 | MOV | K, R2, 0, 0, record_size(class) as i32));
        out.push(i(ALU64 | MOV | K, R3, 0, 0, 0));
        out.push(i(JMP | CALL, 0, 0, 0, RINGBUF_RESERVE));
        drop_jumps.push(out.len());
        out.push(i(JMP | JEQ | K, R0, 0, 0, 0));
        // the record: time, bytes copied, packet length, the bytes
        out.push(i(ALU64 | MOV | X, R8, R0, 0, 0));
        out.push(i(JMP | CALL, 0, 0, 0, KTIME_GET_TAI_NS));
        out.push(i(STX | MEM | DW, R8, R0, 0, 0));
        out.push(i(STX | MEM | W, R8, R9, 8, 0));
        out.push(i(LDX | MEM | W, R2, R6, 0, 0));
        out.push(i(STX | MEM | W, R8, R2, 12, 0));
        out.push(i(ALU64 | MOV | X, R1, R6, 0, 0));
        out.push(i(ALU64 | MOV | K, R2, 0, 0, 0));
        out.push(i(ALU64 | MOV | X, R3, R8, 0, 0));
        out.push(i(ALU64 | ADD | K, R3, 0, 0, RECORD_HEADER as i32));
        out.push(i(ALU64 | MOV | X, R4, R9, 0, 0));
        out.push(i(JMP | CALL, 0, 0, 0, SKB_LOAD_BYTES));
        out.push(i(ALU64 | MOV | X, R1, R8, 0, 0));
        out.push(i(ALU64 | MOV | K, R2, 0, 0, RB_NO_WAKEUP));
        out.push(i(JMP | JEQ | K, R0, 0, 2, 0));
        out.push(i(JMP | CALL, 0, 0, 0, RINGBUF_DISCARD));
        out.push(i(JMP | JA, 0, 0, 1, 0));
        out.push(i(JMP | CALL, 0, 0, 0, RINGBUF_SUBMIT));
        pass_jumps.push(out.len());
        out.push(i(JMP | JA, 0, 0, 0, 0));
        if let Some(at) = bigger {
            out[at].off = (out.len() - at - 1) as i16;
        }
    }
    // the ring is full: count the packet in drops[0] (this CPU's slot)
    let dropped = out.len();
    out.push(i(ST | MEM | W, R10, 0, -72, 0));
    out.push(i(ALU64 | MOV | X, R2, R10, 0, 0));
    out.push(i(ALU64 | ADD | K, R2, 0, 0, -72));
    ld_map(out, R1, drops);
    out.push(i(JMP | CALL, 0, 0, 0, MAP_LOOKUP_ELEM));
    pass_jumps.push(out.len());
    out.push(i(JMP | JEQ | K, R0, 0, 0, 0));
    out.push(i(LDX | MEM | DW, R1, R0, 0, 0));
    out.push(i(ALU64 | ADD | K, R1, 0, 0, 1));
    out.push(i(STX | MEM | DW, R0, R1, 0, 0));
    let pass = out.len();
    out.push(i(ALU64 | MOV | K, R0, 0, 0, TCX_NEXT));
    out.push(i(JMP | EXIT, 0, 0, 0, 0));
    for at in pass_jumps {
        out[at].off = (pass - at - 1) as i16;
    }
    for at in drop_jumps {
        out[at].off = (dropped - at - 1) as i16;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::trace::capture::parse_bpf;

    #[test]
    fn jumps_land_on_the_translated_targets() {
        // ldh [12]; jeq #0x800 jt 2 jf 3 (via offsets); ret #0; ret #100
        let c = parse_bpf("4,40 0 0 12,21 1 0 2048,6 0 0 0,6 0 0 100").unwrap();
        let p = capture_program(&c, 512, 3, 4).unwrap();
        // prologue 5 (no scratch), ldh 7, jeq 1 (+ no ja: jf is the next instruction), ret 2, ret 2
        assert_eq!(p[3], i(LDX | MEM | W, R8, R6, SKB_DATA, 0));
        assert_eq!(p[4], i(LDX | MEM | W, R9, R6, SKB_DATA_END, 0));
        assert_eq!(p[11], i(LD | ABS | 0x08, 0, 0, 0, 12));
        assert_eq!(p[12].code, JMP32 | JEQ | K);
        assert_eq!(12 + 1 + p[12].off as usize, 15, "jt lands on `ret #100`");
        assert_eq!(p[15], i(ALU | MOV | K, R9, 0, 0, 100));
        let cap = 17;
        assert_eq!(14 + 1 + p[14].off as usize, cap);
        assert_eq!(16 + 1 + p[16].off as usize, cap);
        assert_eq!(p.last().unwrap().code, JMP | EXIT);
    }

    #[test]
    fn a_load_reads_the_linear_part_directly_else_the_helper() {
        // ldh [12]: bounds check of data + 14 against data_end, a direct load, to big-endian, and
        // over the helper that follows; the bounds check's failure lands on the helper
        let mut p = Vec::new();
        packet_load(&mut p, ABS, 0x08, 12);
        assert_eq!(
            p,
            vec![
                i(ALU64 | MOV | X, R2, R8, 0, 0),
                i(ALU64 | ADD | K, R2, 0, 0, 14),
                i(JMP | JGT | X, R2, R9, 3, 0),
                i(LDX | MEM | 0x08, R0, R8, 12, 0),
                i(ALU | END_TO_BE, R0, 0, 0, 16),
                i(JMP | JA, 0, 0, 1, 0),
                i(LD | ABS | 0x08, 0, 0, 0, 12),
            ]
        );
        // ldb [x + 13]: X bounded first (else the helper), the pointer data + X, no byte swap
        let mut p = Vec::new();
        packet_load(&mut p, IND, 0x10, 13);
        assert_eq!(p[0], i(JMP | JGT | K, R7, 0, 7, DIRECT_MAX as i32));
        assert_eq!(p[2], i(ALU64 | ADD | X, R3, R7, 0, 0));
        assert_eq!(p[4], i(ALU64 | ADD | K, R2, 0, 0, 14));
        assert_eq!(p[5], i(JMP | JGT | X, R2, R9, 2, 0));
        assert_eq!(p[6], i(LDX | MEM | 0x10, R0, R3, 13, 0));
        assert_eq!(p[7], i(JMP | JA, 0, 0, 1, 0));
        assert_eq!(p[8], i(LD | IND | 0x10, 0, R7, 0, 13));
        // an offset past the direct loads' reach: the helper only
        let mut p = Vec::new();
        packet_load(&mut p, ABS, W, 0x7ffe);
        assert_eq!(p, vec![i(LD | ABS | W, 0, 0, 0, 0x7ffe)]);
    }

    #[test]
    fn scratch_and_msh_and_refusals() {
        // ldxb 4*([14]&0xf); st M[3]; ld M[3]; ret a
        let c = parse_bpf("4,177 0 0 14,2 0 0 3,96 0 0 3,22 0 0 0").unwrap();
        let p = capture_program(&c, 64, 3, 4).unwrap();
        assert!(p.iter().any(|e| *e == i(STX | MEM | W, R10, R0, -16, 0)));
        assert!(p.iter().any(|e| *e == i(LDX | MEM | W, R0, R10, -16, 0)));
        assert_eq!(p.iter().filter(|e| e.code == ST | MEM | W && e.dst == R10 && e.off >= -64).count(), 16);
        let anc = parse_bpf("2,32 0 0 4294963200,6 0 0 1").unwrap();
        assert_eq!(capture_program(&anc, 64, 3, 4), Err(TranslateError::Ancillary { index: 0, k: 4_294_963_200 }));
        let out = parse_bpf("1,21 5 0 1").unwrap();
        assert_eq!(capture_program(&out, 64, 3, 4), Err(TranslateError::JumpOut { index: 0 }));
    }

    #[test]
    fn encodes_as_the_kernel_reads_it() {
        // mov64 r6, r1 -> bf 16 00 00 00 00 00 00
        assert_eq!(i(ALU64 | MOV | X, R6, 1, 0, 0).encode().to_le_bytes(), [0xbf, 0x16, 0, 0, 0, 0, 0, 0]);
        // r0 = -1 -> b7 00 00 00 ff ff ff ff
        assert_eq!(i(ALU64 | MOV | K, R0, 0, 0, -1).encode().to_le_bytes(), [0xb7, 0, 0, 0, 0xff, 0xff, 0xff, 0xff]);
        assert_eq!(record_size(512), 528);
        assert_eq!(record_size(13), 32);
        assert_eq!(size_classes(512), vec![64, 128, 256, 512]);
        assert_eq!(size_classes(300), vec![64, 128, 256, 300]);
        assert_eq!(size_classes(262_144).last(), Some(&262_144));
        assert_eq!(size_classes(262_144).len(), 12);
    }
}
