//! `tierscope-engine capture`: a live capture that writes pcap, cheaper for the system under test
//! than tcpdump (issue 24).
//!
//! One AF_PACKET socket with a TPACKET_V3 ring (large blocks, so one wake-up hands over thousands
//! of packets) and the kernel filter tcpdump compiles (`tcpdump -ddd`), whose accept value is the
//! snapshot length. What makes it cheaper is where it listens:
//!
//! * on `lo` with `PACKET_IGNORE_OUTGOING`: every loopback packet passes the packet taps twice,
//!   once leaving (where the kernel clones it for each tap before the filter runs) and once
//!   arriving; tcpdump takes both and libpcap throws the outgoing copy away in user space. This
//!   socket is never handed the outgoing copy, so no clone and one filter run per packet;
//! * on a bridge, not on the bridge device (which tcpdump puts in promiscuous mode, so every
//!   forwarded frame is cloned and passed up the bridge's own receive path) but on the frames
//!   entering the bridge from its ports (the hosts' veths), outgoing copies ignored: each frame
//!   between two hosts is seen once, where it enters the bridge, and the bridge is left as it is.
//!   Frames the machine itself sends into the bridge are not seen (the lab's tiers and its client
//!   all live in namespaces behind ports); the ports are those at start;
//! * on any other interface both directions (the server's replies leave through it).
//!
//! Where the kernel allows it (`--via auto`, the default), the same filter runs as an eBPF program
//! on the TC hook of the same interfaces instead (`capture/tcx.rs`, `capture/program.rs`): no
//! packet socket at all, so the packet taps stay empty and a refused packet costs one run of the
//! program. Its ring is read every 100 ms: on a busy 2-core machine this process's wake-ups cost
//! the measured system more than its copying (docs/performance.md). Where eBPF cannot load (no
//! CAP_BPF, an old kernel, an instruction the translation does not take), the packet socket runs,
//! with larger blocks for the same reason, and the line that says where it listens says why.
//!
//! It writes standard pcap (nanosecond timestamps, Ethernet link type), flushed after every batch,
//! and on SIGINT/SIGTERM waits one block-retire period so that packets taken before the signal are
//! written, then prints tcpdump's three count lines on stderr (captured, received by filter,
//! dropped by kernel), which `tierscope.trace.capture` reads the same way for both captures.

use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{fence, AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use clap::{Args, ValueEnum};

mod program;
mod tcx;

/// How the capture takes packets.
#[derive(Clone, Copy, Debug, PartialEq, ValueEnum)]
pub enum Via {
    /// eBPF where it loads, else the packet socket
    Auto,
    /// an eBPF program on the TC hook (tcx) writing to a ring buffer; an error if it cannot load
    Ebpf,
    /// an AF_PACKET TPACKET_V3 socket
    Packet,
}

#[derive(Args, Debug)]
#[command(
    after_help = "Runs until SIGINT or SIGTERM (or --duration). Needs CAP_NET_RAW.\n\nExample: tierscope-engine capture -i lo -w capture.pcap -s 512 --bpf \"$(tcpdump -i lo -s 512 -ddd 'tcp port 80' | tr '\\n' ',')\""
)]
pub struct CaptureArgs {
    /// Interface: `lo` (incoming copies only), a bridge (frames entering it from its ports), or
    /// any other (both directions).
    #[arg(short = 'i', long = "interface")]
    pub interface: String,
    /// The pcap file to write.
    #[arg(short = 'w', long = "write")]
    pub write: PathBuf,
    /// Kernel filter as `tcpdump -ddd` prints it (a count, then `code jt jf k` per instruction),
    /// lines or comma-separated; its accept value is the snapshot length. Default: every packet.
    #[arg(long)]
    pub bpf: Option<String>,
    /// Snapshot length (bytes kept per packet; also caps what the filter accepts).
    #[arg(short = 's', long = "snaplen", default_value_t = 262_144)]
    pub snaplen: u32,
    /// Ring block size in KiB (a block is handed over when full or after --retire-ms; each
    /// hand-over wakes this process).
    #[arg(long = "block-kib", default_value_t = 4096)]
    pub block_kib: u32,
    /// Ring blocks (ring size = blocks x block size).
    #[arg(long = "blocks", default_value_t = 16)]
    pub blocks: u32,
    /// A partly filled block is handed over after this many milliseconds.
    #[arg(long = "retire-ms", default_value_t = 100)]
    pub retire_ms: u32,
    /// Take outgoing copies too (on lo every packet twice; only for checking this capture).
    #[arg(long = "both-directions")]
    pub both_directions: bool,
    /// Stop after this many seconds.
    #[arg(long)]
    pub duration: Option<f64>,
    /// How packets are taken: eBPF on the TC hook where it loads (auto), only eBPF, or only the
    /// packet socket.
    #[arg(long, value_enum, default_value_t = Via::Auto)]
    pub via: Via,
    /// The eBPF ring buffer in MiB (a power of two): what arrives between two reads must fit.
    #[arg(long = "ring-mib", default_value_t = 64)]
    pub ring_mib: u32,
    /// The eBPF ring is read every this many milliseconds. Each wake-up of this process costs the
    /// measured system more than the reading does (on a 2-core VM a process waking 100 times a
    /// second took 3.4-4.3 % of nginx's throughput, 10 times a second 0.3-1.5 %: bench/tracer
    /// --breakdown).
    #[arg(long = "read-ms", default_value_t = 100)]
    pub read_ms: u32,
}

const SOL_PACKET: libc::c_int = 263;
const PACKET_RX_RING: libc::c_int = 5;
const PACKET_STATISTICS: libc::c_int = 6;
const PACKET_VERSION: libc::c_int = 10;
const PACKET_IGNORE_OUTGOING: libc::c_int = 23;
const TPACKET_V3: libc::c_int = 2;
const ETH_P_ALL: u16 = 0x0003;
const TP_STATUS_KERNEL: u32 = 0;
const TP_STATUS_USER: u32 = 1;
const SKF_AD_IFINDEX: u32 = (-0x1000i32 + 8) as u32;
const BPF_LD_W_ABS: u16 = 0x20;
const BPF_JMP_JEQ_K: u16 = 0x15;
const BPF_RET_K: u16 = 0x06;
const LINKTYPE_ETHERNET: u32 = 1;

#[repr(C)]
struct TpacketReq3 {
    block_size: u32,
    block_nr: u32,
    frame_size: u32,
    frame_nr: u32,
    retire_blk_tov: u32,
    sizeof_priv: u32,
    feature_req_word: u32,
}

#[repr(C)]
#[derive(Default)]
struct TpacketStatsV3 {
    packets: u32,
    drops: u32,
    freeze_q_cnt: u32,
}

static STOP: AtomicBool = AtomicBool::new(false);

extern "C" fn on_signal(_: libc::c_int) {
    STOP.store(true, Ordering::SeqCst);
}

/// Where the socket listens and which outgoing copies it skips.
#[derive(Debug, PartialEq)]
enum Point {
    /// bound to one interface (ifindex); `ingress_only`: PACKET_IGNORE_OUTGOING
    Bound { ifindex: u32, ingress_only: bool },
    /// not bound (every interface), ingress only, filtered to these ifindexes (a bridge's ports)
    Ports(Vec<u32>),
}

impl Point {
    fn describe(&self, name: &str) -> String {
        match self {
            Point::Bound { ingress_only: true, .. } => format!("{name}, incoming copies only"),
            Point::Bound { .. } => format!("{name}, both directions"),
            Point::Ports(p) => format!("bridge {name}, frames entering it from its {} ports", p.len()),
        }
    }
}

fn ifindex_of(name: &str) -> anyhow::Result<u32> {
    let p = Path::new("/sys/class/net").join(name).join("ifindex");
    let text = std::fs::read_to_string(&p).with_context(|| format!("no interface {name}"))?;
    text.trim().parse().with_context(|| format!("{}: not a number", p.display()))
}

fn capture_point(name: &str, both: bool) -> anyhow::Result<Point> {
    let dev = Path::new("/sys/class/net").join(name);
    if dev.join("bridge").is_dir() && !both {
        let mut ports = Vec::new();
        for entry in std::fs::read_dir(dev.join("brif")).with_context(|| format!("bridge {name}: its ports"))? {
            let port = entry?.file_name().to_string_lossy().into_owned();
            ports.push(ifindex_of(&port)?);
        }
        if ports.is_empty() {
            bail!("bridge {name} has no ports");
        }
        if ports.len() > 250 {
            bail!("bridge {name} has {} ports (at most 250)", ports.len());
        }
        ports.sort_unstable();
        return Ok(Point::Ports(ports));
    }
    let ifindex = ifindex_of(name)?;
    Ok(Point::Bound { ifindex, ingress_only: name == "lo" && !both })
}

/// A classic BPF instruction (`struct sock_filter`).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq)]
struct Insn {
    code: u16,
    jt: u8,
    jf: u8,
    k: u32,
}

/// What the capture's arguments can get wrong (the user's `--bpf`, `--snaplen`, `--block-kib`,
/// `--blocks`), each its own case; the system's refusals (socket, mmap, bind) stay errors of the
/// system call that failed.
#[derive(Debug, PartialEq, thiserror::Error)]
pub enum CaptureArgError {
    #[error("--bpf is empty")]
    EmptyBpf,
    #[error("--bpf: the instruction count {got:?} is not a number")]
    BpfCount { got: String },
    #[error("--bpf instruction {index}: {line:?} is not `code jt jf k`")]
    BpfInstruction { index: usize, line: String },
    #[error("--bpf says {said} instructions but has {has}")]
    BpfLength { said: usize, has: usize },
    #[error("--snaplen must be at least 1")]
    Snaplen,
    #[error("--block-kib must be a power of two, at least 4")]
    BlockKib,
    #[error("--blocks must be at least 2")]
    Blocks,
    #[error("the filter has {0} instructions (at most 4096)")]
    FilterTooLong(usize),
    #[error("--ring-mib must be a power of two, 1 to 1024")]
    RingMib,
}

/// `tcpdump -ddd` output (or its comma-separated form) to instructions.
fn parse_bpf(text: &str) -> Result<Vec<Insn>, CaptureArgError> {
    let mut parts = text.split([',', '\n']).map(str::trim).filter(|s| !s.is_empty());
    let count = parts.next().ok_or(CaptureArgError::EmptyBpf)?;
    let n: usize = count.parse().map_err(|_| CaptureArgError::BpfCount { got: count.to_string() })?;
    let mut out = Vec::with_capacity(n);
    for (i, line) in parts.enumerate() {
        let f: Vec<&str> = line.split_whitespace().collect();
        let bad = || CaptureArgError::BpfInstruction { index: i + 1, line: line.to_string() };
        if f.len() != 4 {
            return Err(bad());
        }
        out.push(Insn {
            code: f[0].parse().map_err(|_| bad())?,
            jt: f[1].parse().map_err(|_| bad())?,
            jf: f[2].parse().map_err(|_| bad())?,
            k: f[3].parse().map_err(|_| bad())?,
        });
    }
    if out.len() != n || n == 0 {
        return Err(CaptureArgError::BpfLength { said: n, has: out.len() });
    }
    Ok(out)
}

/// The user's filter (or accept-all), every accept value capped at `snaplen`.
fn capped(user: Option<Vec<Insn>>, snaplen: u32) -> Vec<Insn> {
    let mut body = user.unwrap_or_else(|| vec![Insn { code: BPF_RET_K, jt: 0, jf: 0, k: snaplen }]);
    for insn in &mut body {
        if insn.code == BPF_RET_K && insn.k > snaplen {
            insn.k = snaplen;
        }
    }
    body
}

/// The program the socket runs: for a bridge's ports, a prefix accepting only frames from those
/// interfaces (the rest rejected before the user's filter runs), then the capped filter.
fn program(body: Vec<Insn>, point: &Point) -> Vec<Insn> {
    let Point::Ports(ports) = point else { return body };
    let k = ports.len();
    let mut out = vec![Insn { code: BPF_LD_W_ABS, jt: 0, jf: 0, k: SKF_AD_IFINDEX }];
    for (i, &ifindex) in ports.iter().enumerate() {
        // instruction i+1; the user's program starts at k+2
        out.push(Insn { code: BPF_JMP_JEQ_K, jt: (k - i) as u8, jf: 0, k: ifindex });
    }
    out.push(Insn { code: BPF_RET_K, jt: 0, jf: 0, k: 0 });
    out.extend(body);
    out
}

struct Socket {
    fd: libc::c_int,
    ring: *mut u8,
    ring_len: usize,
}

impl Drop for Socket {
    fn drop(&mut self) {
        unsafe {
            if !self.ring.is_null() {
                libc::munmap(self.ring as *mut libc::c_void, self.ring_len);
            }
            libc::close(self.fd);
        }
    }
}

fn setsockopt<T>(fd: libc::c_int, level: libc::c_int, name: libc::c_int, value: &T, what: &str) -> anyhow::Result<()> {
    let rc = unsafe { libc::setsockopt(fd, level, name, value as *const T as *const libc::c_void, std::mem::size_of::<T>() as libc::socklen_t) };
    if rc != 0 {
        bail!("{what}: {}", std::io::Error::last_os_error());
    }
    Ok(())
}

fn open(point: &Point, prog: &[Insn], block_size: u32, blocks: u32, retire_ms: u32) -> anyhow::Result<Socket> {
    // protocol 0: nothing arrives before bind, so the ring holds only what the filter accepted
    let fd = unsafe { libc::socket(libc::AF_PACKET, libc::SOCK_RAW, 0) };
    if fd < 0 {
        bail!("AF_PACKET socket: {}", std::io::Error::last_os_error());
    }
    let mut sock = Socket { fd, ring: std::ptr::null_mut(), ring_len: 0 };
    setsockopt(fd, SOL_PACKET, PACKET_VERSION, &TPACKET_V3, "TPACKET_V3")?;
    let ingress_only = matches!(point, Point::Ports(_) | Point::Bound { ingress_only: true, .. });
    if ingress_only {
        setsockopt(fd, SOL_PACKET, PACKET_IGNORE_OUTGOING, &1 as &libc::c_int, "PACKET_IGNORE_OUTGOING")?;
    }
    let fprog = libc::sock_fprog { len: prog.len() as u16, filter: prog.as_ptr() as *mut libc::sock_filter };
    setsockopt(fd, libc::SOL_SOCKET, libc::SO_ATTACH_FILTER, &fprog, "attaching the filter")?;
    let frame_size = 2048u32;
    let req = TpacketReq3 {
        block_size,
        block_nr: blocks,
        frame_size,
        frame_nr: block_size / frame_size * blocks,
        retire_blk_tov: retire_ms,
        sizeof_priv: 0,
        feature_req_word: 0,
    };
    setsockopt(fd, SOL_PACKET, PACKET_RX_RING, &req, "the TPACKET_V3 ring")?;
    let len = block_size as usize * blocks as usize;
    let ring = unsafe { libc::mmap(std::ptr::null_mut(), len, libc::PROT_READ | libc::PROT_WRITE, libc::MAP_SHARED, fd, 0) };
    if ring == libc::MAP_FAILED {
        bail!("mapping the ring: {}", std::io::Error::last_os_error());
    }
    sock.ring = ring as *mut u8;
    sock.ring_len = len;
    let mut sll: libc::sockaddr_ll = unsafe { std::mem::zeroed() };
    sll.sll_family = libc::AF_PACKET as u16;
    sll.sll_protocol = ETH_P_ALL.to_be();
    sll.sll_ifindex = match point {
        Point::Bound { ifindex, .. } => *ifindex as i32,
        Point::Ports(_) => 0,
    };
    let rc = unsafe { libc::bind(fd, &sll as *const libc::sockaddr_ll as *const libc::sockaddr, std::mem::size_of::<libc::sockaddr_ll>() as u32) };
    if rc != 0 {
        bail!("bind: {}", std::io::Error::last_os_error());
    }
    Ok(sock)
}

fn stats(fd: libc::c_int) -> TpacketStatsV3 {
    let mut st = TpacketStatsV3::default();
    let mut len = std::mem::size_of::<TpacketStatsV3>() as libc::socklen_t;
    unsafe {
        libc::getsockopt(fd, SOL_PACKET, PACKET_STATISTICS, &mut st as *mut _ as *mut libc::c_void, &mut len);
    }
    st
}

fn rd32(p: *const u8, off: usize) -> u32 {
    unsafe { std::ptr::read_unaligned(p.add(off) as *const u32) }
}

fn rd16(p: *const u8, off: usize) -> u16 {
    unsafe { std::ptr::read_unaligned(p.add(off) as *const u16) }
}

/// Hands every block the kernel has retired to `out`, in ring order, and gives it back; returns
/// the packets written.
fn drain(sock: &Socket, next: &mut usize, blocks: usize, block_size: usize, snaplen: u32, out: &mut impl Write) -> anyhow::Result<u64> {
    let mut written = 0u64;
    loop {
        let block = unsafe { sock.ring.add(*next * block_size) };
        // struct tpacket_block_desc: version, offset_to_priv, then tpacket_hdr_v1 (block_status at 8)
        let status = unsafe { std::ptr::read_volatile(block.add(8) as *const u32) };
        if status & TP_STATUS_USER == 0 {
            return Ok(written);
        }
        fence(Ordering::Acquire);
        let num_pkts = rd32(block, 12);
        let mut off = rd32(block, 16) as usize;
        for _ in 0..num_pkts {
            let pkt = unsafe { block.add(off) };
            // struct tpacket3_hdr: next_offset, sec, nsec, snaplen, len, status, mac (u16), net (u16)
            let (next_off, sec, nsec, caplen, len, mac) = (rd32(pkt, 0), rd32(pkt, 4), rd32(pkt, 8), rd32(pkt, 12), rd32(pkt, 16), rd16(pkt, 24));
            let caplen = caplen.min(snaplen);
            let data = unsafe { std::slice::from_raw_parts(pkt.add(mac as usize), caplen as usize) };
            let mut rec = [0u8; 16];
            rec[0..4].copy_from_slice(&sec.to_le_bytes());
            rec[4..8].copy_from_slice(&nsec.to_le_bytes());
            rec[8..12].copy_from_slice(&caplen.to_le_bytes());
            rec[12..16].copy_from_slice(&len.to_le_bytes());
            out.write_all(&rec)?;
            out.write_all(data)?;
            written += 1;
            if next_off == 0 {
                break;
            }
            off += next_off as usize;
        }
        fence(Ordering::Release);
        unsafe { std::ptr::write_volatile(block.add(8) as *mut u32, TP_STATUS_KERNEL) };
        *next = (*next + 1) % blocks;
    }
}

/// Where packets come from: the eBPF program's ring, or the packet socket's.
enum Source {
    Tcx(tcx::Tcx),
    Packet { sock: Socket, block_size: usize, blocks: usize, next: usize },
}

impl Source {
    fn drain(&mut self, snaplen: u32, out: &mut impl Write) -> anyhow::Result<u64> {
        match self {
            Source::Tcx(t) => t.drain(snaplen, out),
            Source::Packet { sock, block_size, blocks, next } => drain(sock, next, *blocks, *block_size, snaplen, out),
        }
    }

    /// Wait for more: the packet socket wakes this process when a block is handed over (or after
    /// `ms`); the ring is read every `read_ms` (its program never wakes this process).
    fn wait(&self, ms: i32, read_ms: u32) {
        match self {
            Source::Tcx(t) => std::thread::sleep(Duration::from_millis(if t.filling() { read_ms.min(10) } else { read_ms } as u64)),
            Source::Packet { sock, .. } => {
                let mut pfd = libc::pollfd { fd: sock.fd, events: libc::POLLIN | libc::POLLERR, revents: 0 };
                unsafe { libc::poll(&mut pfd, 1, ms) };
            }
        }
    }

    /// (received by filter, dropped by kernel), given the packets written.
    fn counts(&self, captured: u64) -> (u64, u64) {
        match self {
            Source::Tcx(t) => {
                let dropped = t.dropped();
                (captured + dropped, dropped)
            }
            Source::Packet { sock, .. } => {
                let st = stats(sock.fd);
                (st.packets as u64, st.drops as u64)
            }
        }
    }
}

/// The hooks of a capture point: each interface's ingress, its egress too where both directions
/// are taken.
fn hooks(point: &Point) -> Vec<tcx::Hook> {
    match point {
        Point::Ports(ports) => ports.iter().map(|&ifindex| tcx::Hook { ifindex, egress: false }).collect(),
        Point::Bound { ifindex, ingress_only } => {
            let mut h = vec![tcx::Hook { ifindex: *ifindex, egress: false }];
            if !ingress_only {
                h.push(tcx::Hook { ifindex: *ifindex, egress: true });
            }
            h
        }
    }
}

/// The capture as `--via` asks: (the source, what the listening line says about it).
fn open_source(args: &CaptureArgs, point: &Point, body: Vec<Insn>, block_size: u32) -> anyhow::Result<(Source, String)> {
    let mut why_not = None;
    if args.via != Via::Packet {
        match tcx::Tcx::open(&body, &hooks(point), args.snaplen, args.ring_mib) {
            Ok(t) => {
                let what = format!("eBPF on the TC hook, {} MiB ring buffer, {} instructions", args.ring_mib, t.instructions);
                return Ok((Source::Tcx(t), what));
            }
            Err(e) if args.via == Via::Auto => why_not = Some(format!("{e:#}")),
            Err(e) => return Err(e),
        }
    }
    let prog = program(body, point);
    if prog.len() > 4096 {
        return Err(CaptureArgError::FilterTooLong(prog.len()).into());
    }
    let sock = open(point, &prog, block_size, args.blocks, args.retire_ms)?;
    let mut what = format!("AF_PACKET TPACKET_V3, {} x {} KiB ring, {} filter instructions", args.blocks, args.block_kib, prog.len());
    if let Some(why) = why_not {
        what += &format!("; eBPF not used: {why}");
    }
    Ok((Source::Packet { sock, block_size: block_size as usize, blocks: args.blocks as usize, next: 0 }, what))
}

pub fn run(args: CaptureArgs) -> anyhow::Result<i32> {
    if args.snaplen == 0 {
        return Err(CaptureArgError::Snaplen.into());
    }
    let block_size = args.block_kib.checked_mul(1024).filter(|b| b.is_power_of_two() && *b >= 4096);
    let Some(block_size) = block_size else { return Err(CaptureArgError::BlockKib.into()) };
    if args.blocks < 2 {
        return Err(CaptureArgError::Blocks.into());
    }
    if !args.ring_mib.is_power_of_two() || args.ring_mib > 1024 {
        return Err(CaptureArgError::RingMib.into());
    }
    let point = capture_point(&args.interface, args.both_directions)?;
    let user = args.bpf.as_deref().map(parse_bpf).transpose()?;
    let body = capped(user, args.snaplen);
    if body.len() > 4096 {
        return Err(CaptureArgError::FilterTooLong(body.len()).into());
    }
    let (mut source, what) = open_source(&args, &point, body, block_size)?;
    let file = File::create(&args.write).with_context(|| format!("{}", args.write.display()))?;
    let mut out = BufWriter::with_capacity(1 << 20, file);
    let mut header = Vec::with_capacity(24);
    header.extend_from_slice(&0xa1b2_3c4du32.to_le_bytes()); // nanosecond pcap
    header.extend_from_slice(&2u16.to_le_bytes());
    header.extend_from_slice(&4u16.to_le_bytes());
    header.extend_from_slice(&0i32.to_le_bytes());
    header.extend_from_slice(&0u32.to_le_bytes());
    header.extend_from_slice(&args.snaplen.to_le_bytes());
    header.extend_from_slice(&LINKTYPE_ETHERNET.to_le_bytes());
    out.write_all(&header)?;
    out.flush()?;
    for sig in [libc::SIGINT, libc::SIGTERM, libc::SIGHUP] {
        unsafe { libc::signal(sig, on_signal as extern "C" fn(libc::c_int) as libc::sighandler_t) };
    }
    eprintln!("tierscope-engine capture: listening on {} ({what}), snapshot length {} bytes", point.describe(&args.interface), args.snaplen);
    let started = Instant::now();
    let until = args.duration.map(|d| started + Duration::from_secs_f64(d.max(0.0)));
    let mut captured = 0u64;
    let mut stop_at: Option<Instant> = None;
    // what the kernel still holds at a stop: a block being filled (handed over within
    // retire_ms), or a record being written into the ring
    let linger = match source {
        Source::Tcx(_) => Duration::from_millis(20),
        Source::Packet { .. } => Duration::from_millis(2 * args.retire_ms as u64 + 20),
    };
    loop {
        captured += source.drain(args.snaplen, &mut out)?;
        out.flush()?;
        let now = Instant::now();
        if stop_at.is_none() && (STOP.load(Ordering::SeqCst) || until.is_some_and(|u| now >= u)) {
            stop_at = Some(now + linger);
        }
        if stop_at.is_some_and(|s| now >= s) {
            break;
        }
        // a signal ends a poll at once; --duration's end is noticed within one wait
        let (poll_ms, read_ms) = match (stop_at, until) {
            (Some(_), _) => (5, 5),
            (None, Some(u)) => {
                let left = u.saturating_duration_since(now).as_millis().min(1000) as u32 + 1;
                (left as i32, args.read_ms.clamp(1, 1000).min(left))
            }
            (None, None) => (1000, args.read_ms.clamp(1, 1000)),
        };
        source.wait(poll_ms, read_ms);
    }
    let (received, dropped) = source.counts(captured);
    drop(source);
    out.flush()?;
    eprintln!("{captured} packets captured");
    eprintln!("{received} packets received by filter");
    eprintln!("{dropped} packets dropped by kernel");
    println!(
        "{}",
        serde_json::json!({"captured": captured, "received_by_filter": received, "dropped_by_kernel": dropped, "seconds": started.elapsed().as_secs_f64()})
    );
    Ok(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_tcpdump_ddd_lines_and_commas() {
        let a = parse_bpf("2\n40 0 0 12\n6 0 0 262144\n").unwrap();
        let b = parse_bpf("2,40 0 0 12,6 0 0 262144,").unwrap();
        assert_eq!(a, b);
        assert_eq!(a[1], Insn { code: 6, jt: 0, jf: 0, k: 262_144 });
        assert_eq!(parse_bpf("3,40 0 0 12"), Err(CaptureArgError::BpfLength { said: 3, has: 1 }));
        assert_eq!(parse_bpf("1,40 0 x 12"), Err(CaptureArgError::BpfInstruction { index: 1, line: "40 0 x 12".into() }));
        assert_eq!(parse_bpf(" , "), Err(CaptureArgError::EmptyBpf));
        assert_eq!(parse_bpf("two,40 0 0 12"), Err(CaptureArgError::BpfCount { got: "two".into() }));
    }

    #[test]
    fn bridge_prefix_jumps_to_the_user_filter() {
        let user = parse_bpf("2,40 0 0 12,6 0 0 262144").unwrap();
        let p = program(capped(Some(user), 512), &Point::Ports(vec![5, 9, 12]));
        // ld ifindex; jeq 5; jeq 9; jeq 12; ret 0; user...
        assert_eq!(p.len(), 7);
        for (i, insn) in p[1..4].iter().enumerate() {
            assert_eq!(insn.code, BPF_JMP_JEQ_K);
            assert_eq!(1 + i + 1 + insn.jt as usize, 5, "jeq {i} lands on the user's first instruction");
        }
        assert_eq!(p[4], Insn { code: BPF_RET_K, jt: 0, jf: 0, k: 0 });
        assert_eq!(p[6].k, 512, "accept capped at the snapshot length");
        let lo = program(capped(None, 300), &Point::Bound { ifindex: 1, ingress_only: true });
        assert_eq!(lo, vec![Insn { code: BPF_RET_K, jt: 0, jf: 0, k: 300 }]);
    }
}
