//! The eBPF capture point (issue 24): the capture program (`program.rs`) attached to the TC hook
//! of each interface the capture listens on (`tcx`, a BPF link: closing it, or the process
//! ending, detaches it), writing into one ring buffer map that this process reads every few
//! milliseconds. No packet socket is opened, so the kernel's packet taps stay empty: no packet is
//! cloned or queued for a tap, and a packet the filter refuses costs one run of the program.
//!
//! Everything goes through the `bpf(2)` system call; nothing outside the engine is needed.

use std::io::Write;
use std::sync::atomic::{fence, AtomicU32, AtomicU64, Ordering};

use anyhow::{bail, Context};

use super::program::{self, EInsn, RECORD_HEADER};
use super::Insn;

const BPF_MAP_CREATE: libc::c_long = 0;
const BPF_MAP_LOOKUP_ELEM: libc::c_long = 1;
const BPF_PROG_LOAD: libc::c_long = 5;
const BPF_LINK_CREATE: libc::c_long = 28;
const MAP_TYPE_PERCPU_ARRAY: u32 = 6;
const MAP_TYPE_RINGBUF: u32 = 27;
const PROG_TYPE_SCHED_CLS: u32 = 3;
const ATTACH_TCX_INGRESS: u32 = 46;
const ATTACH_TCX_EGRESS: u32 = 47;
const RINGBUF_BUSY: u32 = 1 << 31;
const RINGBUF_DISCARD: u32 = 1 << 30;
const RINGBUF_HEADER: usize = 8;

/// Where a program is attached: an interface and a direction.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Hook {
    pub ifindex: u32,
    pub egress: bool,
}

struct Fd(libc::c_int);

impl Drop for Fd {
    fn drop(&mut self) {
        unsafe { libc::close(self.0) };
    }
}

fn bpf(cmd: libc::c_long, attr: &mut [u64], what: &str) -> anyhow::Result<libc::c_long> {
    let rc = unsafe { libc::syscall(libc::SYS_bpf, cmd, attr.as_mut_ptr(), std::mem::size_of_val(attr)) };
    if rc < 0 {
        bail!("{what}: {}", std::io::Error::last_os_error());
    }
    Ok(rc)
}

/// A `bpf(2)` command that returns a new descriptor.
fn bpf_fd(cmd: libc::c_long, attr: &mut [u64], what: &str) -> anyhow::Result<Fd> {
    bpf(cmd, attr, what).map(|fd| Fd(fd as libc::c_int))
}

/// Two u32 fields in one word of a `union bpf_attr` laid out as u64s.
fn pair(lo: u32, hi: u32) -> u64 {
    lo as u64 | (hi as u64) << 32
}

fn map_create(kind: u32, key: u32, value: u32, entries: u32, what: &str) -> anyhow::Result<Fd> {
    let mut attr = [0u64; 16];
    attr[0] = pair(kind, key);
    attr[1] = pair(value, entries);
    bpf_fd(BPF_MAP_CREATE, &mut attr, what)
}

fn prog_load(insns: &[EInsn]) -> anyhow::Result<Fd> {
    let code: Vec<u64> = insns.iter().map(EInsn::encode).collect();
    let license = b"GPL\0";
    let mut log = vec![0u8; 1 << 20];
    let mut attr = [0u64; 20];
    attr[0] = pair(PROG_TYPE_SCHED_CLS, code.len() as u32);
    attr[1] = code.as_ptr() as u64;
    attr[2] = license.as_ptr() as u64;
    // log level 1 (the verifier's reasons, only written on a refusal)
    attr[3] = pair(1, log.len() as u32);
    attr[4] = log.as_mut_ptr() as u64;
    let name = b"tierscope_cap\0\0\0";
    attr[6] = u64::from_le_bytes(name[0..8].try_into().unwrap());
    attr[7] = u64::from_le_bytes(name[8..16].try_into().unwrap());
    bpf_fd(BPF_PROG_LOAD, &mut attr, "loading the capture program").map_err(|e| {
        let text = String::from_utf8_lossy(&log[..log.iter().position(|&b| b == 0).unwrap_or(0)]).into_owned();
        let tail: Vec<&str> = text.lines().rev().take(3).collect();
        if tail.is_empty() {
            e
        } else {
            e.context(format!("the verifier: {}", tail.into_iter().rev().collect::<Vec<_>>().join(" / ")))
        }
    })
}

fn link_create(prog: &Fd, hook: Hook) -> anyhow::Result<Fd> {
    let mut attr = [0u64; 8];
    attr[0] = pair(prog.0 as u32, hook.ifindex);
    attr[1] = pair(if hook.egress { ATTACH_TCX_EGRESS } else { ATTACH_TCX_INGRESS }, 0);
    bpf_fd(BPF_LINK_CREATE, &mut attr, "attaching the capture program (tcx)")
}

/// The program attached, its ring mapped: what `tierscope-engine capture --via ebpf` reads.
pub struct Tcx {
    _ring: Fd,
    drops: Fd,
    _prog: Fd,
    _links: Vec<Fd>,
    consumer: *mut u8,
    producer: *mut u8,
    page: usize,
    size: usize,
    pub instructions: usize,
    /// bytes the last drain consumed
    last_drained: std::cell::Cell<u64>,
    /// CLOCK_REALTIME minus CLOCK_TAI, ns (the records carry TAI: it steps with the real-time
    /// clock, unlike the monotonic one)
    tai_to_real: i64,
}

impl Drop for Tcx {
    fn drop(&mut self) {
        unsafe {
            libc::munmap(self.consumer as *mut libc::c_void, self.page);
            libc::munmap(self.producer as *mut libc::c_void, self.page + 2 * self.size);
        }
    }
}

fn clock_ns(clock: libc::clockid_t) -> i64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    unsafe { libc::clock_gettime(clock, &mut ts) };
    ts.tv_sec * 1_000_000_000 + ts.tv_nsec
}

fn tai_to_real() -> i64 {
    // the offset is whole seconds (leap seconds) or 0: read it a few times, keep the closest pair
    (0..5)
        .map(|_| {
            let a = clock_ns(libc::CLOCK_REALTIME);
            let t = clock_ns(libc::CLOCK_TAI);
            let b = clock_ns(libc::CLOCK_REALTIME);
            (b - a, (a + b) / 2 - t)
        })
        .min()
        .map(|(_, off)| (off as f64 / 1e9).round() as i64 * 1_000_000_000)
        .unwrap_or(0)
}

impl Tcx {
    /// Load `classic` (accept values capped at `snaplen`) as the capture program and attach it to
    /// every hook; `ring_mib`: the ring buffer's size (a power of two).
    pub fn open(classic: &[Insn], hooks: &[Hook], snaplen: u32, ring_mib: u32) -> anyhow::Result<Tcx> {
        let size = (ring_mib as usize) << 20;
        let ring = map_create(MAP_TYPE_RINGBUF, 0, 0, size as u32, "the ring buffer map")?;
        let drops = map_create(MAP_TYPE_PERCPU_ARRAY, 4, 8, 1, "the drop counter map")?;
        let insns = program::capture_program(classic, snaplen, ring.0, drops.0)?;
        let prog = prog_load(&insns)?;
        let mut links = Vec::new();
        for &hook in hooks {
            links.push(
                link_create(&prog, hook).with_context(|| format!("interface {} {}", hook.ifindex, if hook.egress { "egress" } else { "ingress" }))?,
            );
        }
        let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) } as usize;
        let consumer = unsafe { libc::mmap(std::ptr::null_mut(), page, libc::PROT_READ | libc::PROT_WRITE, libc::MAP_SHARED, ring.0, 0) };
        if consumer == libc::MAP_FAILED {
            bail!("mapping the ring's consumer page: {}", std::io::Error::last_os_error());
        }
        let producer = unsafe { libc::mmap(std::ptr::null_mut(), page + 2 * size, libc::PROT_READ, libc::MAP_SHARED, ring.0, page as libc::off_t) };
        if producer == libc::MAP_FAILED {
            unsafe { libc::munmap(consumer, page) };
            bail!("mapping the ring's data: {}", std::io::Error::last_os_error());
        }
        Ok(Tcx {
            _ring: ring,
            drops,
            _prog: prog,
            _links: links,
            consumer: consumer as *mut u8,
            producer: producer as *mut u8,
            page,
            size,
            instructions: insns.len(),
            last_drained: std::cell::Cell::new(0),
            tai_to_real: tai_to_real(),
        })
    }

    /// Writes every record submitted so far to `out` as pcap records (and skips discarded ones);
    /// returns the packets written.
    pub fn drain(&self, snaplen: u32, out: &mut impl Write) -> anyhow::Result<u64> {
        let cons_pos = unsafe { &*(self.consumer as *const AtomicU64) };
        let prod_pos = unsafe { &*(self.producer as *const AtomicU64) };
        let data = unsafe { self.producer.add(self.page) };
        let mask = self.size as u64 - 1;
        let mut cons = cons_pos.load(Ordering::Acquire);
        let first = cons;
        let prod = prod_pos.load(Ordering::Acquire);
        let mut written = 0u64;
        while cons < prod {
            let hdr = unsafe { data.add((cons & mask) as usize) };
            let len_word = unsafe { &*(hdr as *const AtomicU32) }.load(Ordering::Acquire);
            if len_word & RINGBUF_BUSY != 0 {
                break; // reserved, not yet submitted: the next drain takes it
            }
            let len = (len_word & !(RINGBUF_BUSY | RINGBUF_DISCARD)) as usize;
            if len_word & RINGBUF_DISCARD == 0 && len >= RECORD_HEADER {
                let rec = unsafe { std::slice::from_raw_parts(hdr.add(RINGBUF_HEADER), len) };
                let tai = u64::from_ne_bytes(rec[0..8].try_into().unwrap()) as i64;
                let caplen = u32::from_ne_bytes(rec[8..12].try_into().unwrap()).min(snaplen).min((len - RECORD_HEADER) as u32);
                let wire = u32::from_ne_bytes(rec[12..16].try_into().unwrap());
                let t = tai + self.tai_to_real;
                let mut head = [0u8; 16];
                head[0..4].copy_from_slice(&((t / 1_000_000_000) as u32).to_le_bytes());
                head[4..8].copy_from_slice(&((t % 1_000_000_000) as u32).to_le_bytes());
                head[8..12].copy_from_slice(&caplen.to_le_bytes());
                head[12..16].copy_from_slice(&wire.to_le_bytes());
                out.write_all(&head)?;
                out.write_all(&rec[RECORD_HEADER..RECORD_HEADER + caplen as usize])?;
                written += 1;
            }
            cons += ((len + RINGBUF_HEADER + 7) & !7) as u64;
            fence(Ordering::Release);
            cons_pos.store(cons, Ordering::Release);
        }
        self.last_drained.set(cons - first);
        Ok(written)
    }

    /// Whether the last drain found the ring more than a quarter full (read again soon, or
    /// packets arriving faster than the ring holds between two reads are dropped).
    pub fn filling(&self) -> bool {
        self.last_drained.get() > self.size as u64 / 4
    }

    /// Packets the filter accepted that found the ring full (summed over CPUs).
    pub fn dropped(&self) -> u64 {
        let cpus = unsafe { libc::sysconf(libc::_SC_NPROCESSORS_CONF) }.max(1) as usize;
        // per-CPU values come back one 8-byte slot per possible CPU; leave room for more
        let mut values = vec![0u64; cpus.max(1024)];
        let key = 0u32;
        let mut attr = [0u64; 4];
        attr[0] = self.drops.0 as u64;
        attr[1] = &key as *const u32 as u64;
        attr[2] = values.as_mut_ptr() as u64;
        match bpf(BPF_MAP_LOOKUP_ELEM, &mut attr, "reading the drop counter") {
            Ok(_) => values.iter().sum(),
            Err(_) => 0,
        }
    }
}
