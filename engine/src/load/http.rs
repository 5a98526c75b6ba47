//! A lean HTTP/1.1 client on tokio: keep-alive, Content-Length, chunked and read-to-close
//! bodies, connect and request timeouts, and errors sorted by kind.

use std::net::SocketAddr;
use std::time::Duration;

use anyhow::Result;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use super::clock;
use super::error::LoadArgError;
use super::grid::Grid;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum ErrorKind {
    Connect,
    Timeout,
    Reset,
    Http5xx,
    Marker,
    /// an embedded object (image) of the page failed: connect, timeout, reset, 5xx, unparseable
    Embedded,
    Other,
    Cancelled,
}

impl ErrorKind {
    pub const ALL: [ErrorKind; 8] = [
        ErrorKind::Connect,
        ErrorKind::Timeout,
        ErrorKind::Reset,
        ErrorKind::Http5xx,
        ErrorKind::Marker,
        ErrorKind::Embedded,
        ErrorKind::Other,
        ErrorKind::Cancelled,
    ];
    pub fn name(self) -> &'static str {
        match self {
            ErrorKind::Connect => "connect",
            ErrorKind::Timeout => "timeout",
            ErrorKind::Reset => "reset",
            ErrorKind::Http5xx => "http5xx",
            ErrorKind::Marker => "marker",
            ErrorKind::Embedded => "embedded",
            ErrorKind::Other => "other",
            ErrorKind::Cancelled => "cancelled",
        }
    }
    pub fn index(self) -> usize {
        self as usize
    }
}

/// Where requests go: `http://host:port[/prefix]`.
#[derive(Clone, Debug)]
pub struct Target {
    pub addr: SocketAddr,
    pub host_header: String,
    pub prefix: String,
}

impl Target {
    pub fn parse(url: &str) -> Result<Target, LoadArgError> {
        let rest = url.strip_prefix("http://").ok_or_else(|| LoadArgError::TargetUrl { url: url.to_string(), https: url.starts_with("https://") })?;
        let (hostport, prefix) = match rest.find('/') {
            Some(i) => (&rest[..i], rest[i..].trim_end_matches('/')),
            None => (rest, ""),
        };
        if hostport.is_empty() {
            return Err(LoadArgError::NoHost { url: url.to_string() });
        }
        let with_port = if hostport.rsplit_once(':').is_some_and(|(_, p)| p.chars().all(|c| c.is_ascii_digit())) && !hostport.ends_with(']') {
            hostport.to_string()
        } else {
            format!("{hostport}:80")
        };
        use std::net::ToSocketAddrs;
        let unresolved = |reason: String| LoadArgError::Unresolved { url: url.to_string(), host_port: with_port.clone(), reason };
        let addrs: Vec<SocketAddr> = with_port.to_socket_addrs().map_err(|e| unresolved(e.to_string()))?.collect();
        // prefer IPv4 (servers in the lab listen on IPv4 addresses; "localhost" may be ::1 first)
        let addr = addrs.iter().find(|a| a.is_ipv4()).or_else(|| addrs.first()).copied().ok_or_else(|| unresolved("no address".into()))?;
        Ok(Target { addr, host_header: hostport.to_string(), prefix: prefix.to_string() })
    }
}

pub struct Conn {
    stream: TcpStream,
    buf: Vec<u8>,
    /// valid bytes are buf[pos..fill]
    pos: usize,
    fill: usize,
    pub requests: u64,
    /// paced: responses are read at grid edges with the kernel's receive timestamps (`set_paced`)
    paced: bool,
    /// the receive timestamp (this process' clock, ns) of the bytes of the last paced read
    rx_ns: i64,
}

pub async fn connect(addr: SocketAddr, timeout: Duration) -> Result<Conn, ErrorKind> {
    match tokio::time::timeout(timeout, TcpStream::connect(addr)).await {
        Ok(Ok(stream)) => {
            let _ = stream.set_nodelay(true);
            Ok(Conn { stream, buf: vec![0u8; 8192], pos: 0, fill: 0, requests: 0, paced: false, rx_ns: 0 })
        }
        Ok(Err(_)) | Err(_) => Err(ErrorKind::Connect),
    }
}

pub struct Response {
    pub status: u16,
    /// response bytes on the wire (status line, headers, body framing and body)
    pub bytes: u64,
    pub first_byte_ns: i64,
    /// when the last byte arrived (paced connections: the kernel's receive timestamp; 0 = not
    /// known, the caller takes the time it got the response)
    pub last_byte_ns: i64,
    pub keep_alive: bool,
}

#[derive(Debug)]
pub enum ExchangeError {
    /// the connection was closed before any response byte arrived (a stale keep-alive
    /// connection: safe to retry once on a new connection)
    ClosedBeforeResponse,
    Kind(ErrorKind),
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}

enum Framing {
    Length(u64),
    Chunked,
    UntilClose,
    None,
}

/// `level` for socket option `name` (an int).
fn set_int_opt(stream: &TcpStream, level: libc::c_int, name: libc::c_int, value: libc::c_int) -> bool {
    use std::os::fd::AsRawFd;
    // SAFETY: a valid socket and a pointer to an int of the given size
    unsafe {
        libc::setsockopt(
            stream.as_raw_fd(),
            level,
            name,
            &value as *const libc::c_int as *const libc::c_void,
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        ) == 0
    }
}

impl Conn {
    /// Read this connection's responses at grid edges (`exchange` with a `Grid`): the socket no
    /// longer wakes the event loop when response bytes arrive (SO_RCVLOWAT above any response
    /// the buffer holds; the end of the stream still does), and every read carries the kernel's
    /// receive timestamp of its bytes (SO_TIMESTAMPNS), which become the response's first- and
    /// last-byte times. Returns false (and the connection stays as it was) when the kernel
    /// refuses either option.
    pub fn set_paced(&mut self) -> bool {
        if self.paced {
            return true;
        }
        if !set_int_opt(&self.stream, libc::SOL_SOCKET, libc::SO_TIMESTAMPNS, 1) {
            return false;
        }
        if !set_int_opt(&self.stream, libc::SOL_SOCKET, libc::SO_RCVLOWAT, i32::MAX) {
            set_int_opt(&self.stream, libc::SOL_SOCKET, libc::SO_TIMESTAMPNS, 0);
            return false;
        }
        self.paced = true;
        true
    }

    /// One non-blocking recvmsg into `buf` with `flags`: the number of bytes and their receive
    /// timestamp (that of the last segment read) in this process' clock (ns).
    fn recvmsg_stamped(fd: std::os::fd::RawFd, buf: &mut [u8], flags: libc::c_int) -> std::io::Result<(usize, i64)> {
        // room for one cmsg with a struct timespec (and a spare)
        let mut control = [0u64; 16];
        let mut iov = libc::iovec { iov_base: buf.as_mut_ptr() as *mut libc::c_void, iov_len: buf.len() };
        // SAFETY: msghdr is plain data; every pointer in it outlives the call
        let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
        msg.msg_iov = &mut iov;
        msg.msg_iovlen = 1;
        msg.msg_control = control.as_mut_ptr() as *mut libc::c_void;
        msg.msg_controllen = std::mem::size_of_val(&control) as _;
        // SAFETY: a valid socket, a buffer of iov_len bytes and a control buffer of msg_controllen
        let n = unsafe { libc::recvmsg(fd, &mut msg, flags | libc::MSG_DONTWAIT) };
        if n < 0 {
            return Err(std::io::Error::last_os_error());
        }
        let now = clock::now_ns();
        let mut rx = now;
        // SAFETY: the CMSG_* walk stays within the control bytes the kernel filled in
        unsafe {
            let mut c = libc::CMSG_FIRSTHDR(&msg);
            while !c.is_null() {
                if (*c).cmsg_level == libc::SOL_SOCKET && (*c).cmsg_type == libc::SCM_TIMESTAMPNS {
                    let ts = std::ptr::read_unaligned(libc::CMSG_DATA(c) as *const libc::timespec);
                    let mut real = libc::timespec { tv_sec: 0, tv_nsec: 0 };
                    libc::clock_gettime(libc::CLOCK_REALTIME, &mut real);
                    let ns = |t: &libc::timespec| t.tv_sec * 1_000_000_000 + t.tv_nsec;
                    // the kernel stamps with CLOCK_REALTIME; this process' clock is monotonic
                    // from an epoch base: carry the age of the bytes over
                    rx = now - (ns(&real) - ns(&ts)).max(0);
                }
                c = libc::CMSG_NXTHDR(&msg, c);
            }
        }
        Ok((n as usize, rx))
    }

    /// One non-blocking read into buf[fill..] with its receive timestamp (paced connections).
    /// The kernel stamps a read with its last segment's time, and segments queued together are
    /// merged under the newest one's: the first bytes of a response that arrived in several
    /// segments before a pick-up are stamped when the last of those arrived (under 1 ms later).
    fn recv_stamped(&mut self) -> std::io::Result<usize> {
        use std::os::fd::AsRawFd;
        let fd = self.stream.as_raw_fd();
        let (n, ts) = Self::recvmsg_stamped(fd, &mut self.buf[self.fill..], 0)?;
        // the end of the stream carries no time: the last byte's stays
        if n > 0 {
            self.rx_ns = ts;
        }
        Ok(n)
    }

    /// Make room and read more bytes; Ok(0) = EOF. With a grid (paced connections) a read that
    /// finds nothing waits for the next grid edge and tries again.
    async fn read_more(&mut self, grid: Option<&Grid>) -> std::io::Result<usize> {
        if self.pos == self.fill {
            self.pos = 0;
            self.fill = 0;
        } else if self.fill == self.buf.len() {
            if self.pos > 0 {
                self.buf.copy_within(self.pos..self.fill, 0);
                self.fill -= self.pos;
                self.pos = 0;
            } else {
                let n = self.buf.len() * 2;
                self.buf.resize(n, 0);
            }
        }
        let n = match grid.filter(|_| self.paced) {
            None => self.stream.read(&mut self.buf[self.fill..]).await?,
            Some(g) => loop {
                match self.recv_stamped() {
                    Ok(n) => break n,
                    Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => g.next_edge().await,
                    Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                    Err(e) => return Err(e),
                }
            },
        };
        self.fill += n;
        Ok(n)
    }

    /// The time of the bytes just read: their receive timestamp on a paced connection read at a
    /// grid edge, else now.
    fn stamp(&self, grid: Option<&Grid>) -> i64 {
        if self.paced && grid.is_some() {
            self.rx_ns
        } else {
            clock::now_ns()
        }
    }

    /// Send one request and read its response. `body` receives the response body when given
    /// (up to `body_cap` bytes are kept). With `grid` a paced connection (`set_paced`) reads the
    /// response at grid edges.
    pub async fn exchange(
        &mut self,
        request: &[u8],
        mut body: Option<&mut Vec<u8>>,
        body_cap: usize,
        grid: Option<&Grid>,
    ) -> Result<Response, ExchangeError> {
        use ExchangeError::*;
        debug_assert!(grid.is_some() || !self.paced, "a paced connection is read at grid edges");
        let io_err = |e: std::io::Error| match e.kind() {
            std::io::ErrorKind::TimedOut => Kind(ErrorKind::Timeout),
            _ => Kind(ErrorKind::Reset),
        };
        let fresh = self.requests == 0;
        self.requests += 1;
        if let Err(e) = self.stream.write_all(request).await {
            return Err(if fresh { io_err(e) } else { ClosedBeforeResponse });
        }
        // status line and headers
        let mut first_byte_ns = 0;
        if self.fill > self.pos {
            first_byte_ns = clock::now_ns();
        } else if let Some(g) = grid.filter(|_| self.paced) {
            // a response cannot be back microseconds after its request: a read now would find
            // nothing (one wasted recvmsg per request); the first look is at the next edge
            g.next_edge().await;
        }
        let head_end = loop {
            if let Some(i) = find(&self.buf[self.pos..self.fill], b"\r\n\r\n") {
                break self.pos + i + 4;
            }
            if self.fill - self.pos > 64 * 1024 {
                return Err(Kind(ErrorKind::Other));
            }
            let n = match self.read_more(grid).await {
                Ok(n) => n,
                Err(e) => {
                    return Err(if first_byte_ns == 0 && !fresh { ClosedBeforeResponse } else { io_err(e) });
                }
            };
            if n == 0 {
                return Err(if first_byte_ns == 0 && !fresh { ClosedBeforeResponse } else { Kind(ErrorKind::Reset) });
            }
            if first_byte_ns == 0 {
                first_byte_ns = self.stamp(grid);
            }
        };
        let head = &self.buf[self.pos..head_end];
        let (status, framing, keep_alive) = parse_head(head).ok_or(Kind(ErrorKind::Other))?;
        let mut bytes = (head_end - self.pos) as u64;
        self.pos = head_end;
        let sink = |data: &[u8], body: &mut Option<&mut Vec<u8>>| {
            if let Some(b) = body.as_deref_mut() {
                let room = body_cap.saturating_sub(b.len());
                b.extend_from_slice(&data[..data.len().min(room)]);
            }
        };
        match framing {
            Framing::None => {}
            Framing::Length(mut rem) => loop {
                let take = ((self.fill - self.pos) as u64).min(rem) as usize;
                sink(&self.buf[self.pos..self.pos + take], &mut body);
                self.pos += take;
                rem -= take as u64;
                bytes += take as u64;
                if rem == 0 {
                    break;
                }
                match self.read_more(grid).await {
                    Ok(0) => return Err(Kind(ErrorKind::Reset)),
                    Ok(_) => {}
                    Err(e) => return Err(io_err(e)),
                }
            },
            Framing::UntilClose => loop {
                let avail = self.fill - self.pos;
                sink(&self.buf[self.pos..self.fill], &mut body);
                bytes += avail as u64;
                self.pos = self.fill;
                match self.read_more(grid).await {
                    Ok(0) => break,
                    Ok(_) => {}
                    Err(e) => return Err(io_err(e)),
                }
            },
            Framing::Chunked => {
                // states: 0 = size line, 1 = data, 2 = CRLF after data, 3 = trailer lines
                let mut state = 0u8;
                let mut rem = 0u64;
                loop {
                    let progressed = match state {
                        0 | 3 => match find(&self.buf[self.pos..self.fill], b"\r\n") {
                            Some(i) => {
                                let line = &self.buf[self.pos..self.pos + i];
                                if state == 0 {
                                    let hex = line.split(|&b| b == b';').next().unwrap_or(b"");
                                    let s = std::str::from_utf8(hex).map_err(|_| Kind(ErrorKind::Other))?;
                                    rem = u64::from_str_radix(s.trim(), 16).map_err(|_| Kind(ErrorKind::Other))?;
                                    state = if rem == 0 { 3 } else { 1 };
                                } else if line.is_empty() {
                                    self.pos += 2;
                                    bytes += 2;
                                    break;
                                }
                                self.pos += i + 2;
                                bytes += (i + 2) as u64;
                                true
                            }
                            None => false,
                        },
                        1 => {
                            let take = ((self.fill - self.pos) as u64).min(rem) as usize;
                            sink(&self.buf[self.pos..self.pos + take], &mut body);
                            self.pos += take;
                            bytes += take as u64;
                            rem -= take as u64;
                            if rem == 0 {
                                state = 2;
                            }
                            take > 0
                        }
                        _ => {
                            if self.fill - self.pos >= 2 {
                                self.pos += 2;
                                bytes += 2;
                                state = 0;
                                true
                            } else {
                                false
                            }
                        }
                    };
                    if !progressed {
                        match self.read_more(grid).await {
                            Ok(0) => return Err(Kind(ErrorKind::Reset)),
                            Ok(_) => {}
                            Err(e) => return Err(io_err(e)),
                        }
                    }
                }
            }
        }
        let keep_alive = keep_alive && !matches!(framing, Framing::UntilClose);
        // the last read brought the last byte (a response that was whole in the buffer has no
        // time of its own: the caller's now)
        let last_byte_ns = if self.paced && grid.is_some() && self.rx_ns >= first_byte_ns && first_byte_ns > 0 { self.rx_ns } else { 0 };
        Ok(Response { status, bytes, first_byte_ns, last_byte_ns, keep_alive })
    }
}

/// Status code, body framing and keep-alive from a response head (ending in CRLF CRLF).
fn parse_head(head: &[u8]) -> Option<(u16, Framing, bool)> {
    let mut lines = head.split(|&b| b == b'\n');
    let status_line = lines.next()?;
    if status_line.len() < 12 || !status_line.starts_with(b"HTTP/1.") {
        return None;
    }
    let http10 = status_line[7] == b'0';
    let status: u16 = std::str::from_utf8(&status_line[9..12]).ok()?.parse().ok()?;
    let mut length = None;
    let mut chunked = false;
    let mut keep_alive = !http10;
    for line in lines {
        let line = line.strip_suffix(b"\r").unwrap_or(line);
        let Some(colon) = line.iter().position(|&b| b == b':') else { continue };
        let (name, value) = (&line[..colon], trim(&line[colon + 1..]));
        if name.eq_ignore_ascii_case(b"content-length") {
            length = std::str::from_utf8(value).ok()?.parse::<u64>().ok();
        } else if name.eq_ignore_ascii_case(b"transfer-encoding") {
            chunked = value.len() >= 7 && value[value.len() - 7..].eq_ignore_ascii_case(b"chunked");
        } else if name.eq_ignore_ascii_case(b"connection") {
            if contains_ci(value, b"close") {
                keep_alive = false;
            } else if contains_ci(value, b"keep-alive") {
                keep_alive = true;
            }
        }
    }
    let framing = if status / 100 == 1 || status == 204 || status == 304 {
        Framing::None
    } else if chunked {
        Framing::Chunked
    } else if let Some(n) = length {
        Framing::Length(n)
    } else {
        Framing::UntilClose
    };
    Some((status, framing, keep_alive))
}

fn trim(v: &[u8]) -> &[u8] {
    let s = v.iter().position(|b| !b.is_ascii_whitespace()).unwrap_or(v.len());
    let e = v.iter().rposition(|b| !b.is_ascii_whitespace()).map_or(s, |i| i + 1);
    &v[s..e]
}

fn contains_ci(hay: &[u8], needle: &[u8]) -> bool {
    hay.windows(needle.len()).any(|w| w.eq_ignore_ascii_case(needle))
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::net::TcpListener;

    async fn serve_once(reply: &'static [u8]) -> SocketAddr {
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap();
        tokio::spawn(async move {
            let (mut s, _) = l.accept().await.unwrap();
            let mut buf = [0u8; 4096];
            let _ = s.read(&mut buf).await;
            // write in two pieces to exercise partial reads
            let (a, b) = reply.split_at(reply.len() / 2);
            s.write_all(a).await.unwrap();
            tokio::time::sleep(Duration::from_millis(5)).await;
            s.write_all(b).await.unwrap();
            tokio::time::sleep(Duration::from_millis(50)).await;
        });
        addr
    }

    #[tokio::test]
    async fn chunked_length_and_close_bodies() {
        let cases: [(&'static [u8], u16, &str, bool); 3] = [
            (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n7;x=y\r\n, world\r\n0\r\n\r\n", 200, "hello, world", true),
            (b"HTTP/1.1 503 Busy\r\nContent-Length: 4\r\nConnection: close\r\n\r\nbusy", 503, "busy", false),
            (b"HTTP/1.0 200 OK\r\n\r\nuntil the end", 200, "until the end", false),
        ];
        for (reply, status, text, ka) in cases {
            let addr = serve_once(reply).await;
            let mut c = connect(addr, Duration::from_secs(1)).await.map_err(|_| ()).unwrap();
            let mut body = vec![];
            let r = c.exchange(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n", Some(&mut body), 1 << 20, None).await.map_err(|e| format!("{e:?}")).unwrap();
            assert_eq!(r.status, status);
            assert_eq!(String::from_utf8(body).unwrap(), text);
            assert_eq!(r.bytes, reply.len() as u64);
            assert_eq!(r.keep_alive, ka);
        }
    }

    #[tokio::test]
    async fn paced_reads_at_grid_edges_keep_the_arrival_times() {
        let cases: [(&'static [u8], &str, bool); 3] = [
            (b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello", "hello", true),
            (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n7;x=y\r\n, world\r\n0\r\n\r\n", "hello, world", true),
            (b"HTTP/1.0 200 OK\r\n\r\nuntil the end", "until the end", false),
        ];
        // a 20 ms grid: bytes are picked up well after they arrived, their times are the arrival's
        let grid = Grid::new(std::time::Instant::now(), Duration::from_millis(20));
        for (reply, text, ka) in cases {
            let addr = serve_once(reply).await;
            let mut c = connect(addr, Duration::from_secs(1)).await.map_err(|_| ()).unwrap();
            assert!(c.set_paced());
            let mut body = vec![];
            let sent = clock::now_ns();
            let r =
                c.exchange(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n", Some(&mut body), 1 << 20, Some(&grid)).await.map_err(|e| format!("{e:?}")).unwrap();
            let got = clock::now_ns();
            assert_eq!(String::from_utf8(body).unwrap(), text);
            assert_eq!(r.bytes, reply.len() as u64);
            assert_eq!(r.keep_alive, ka);
            // the second half of the reply is sent 5 ms after the first: its bytes are stamped
            // when they arrived, not when they were picked up (at an edge up to 20 ms later; the
            // HTTP/1.0 reply ends when the server closes, 50 ms later still)
            let last = r.last_byte_ns - sent;
            assert!(r.first_byte_ns >= sent && r.last_byte_ns >= r.first_byte_ns, "{} {}", r.first_byte_ns - sent, last);
            assert!((4_000_000..15_000_000).contains(&last), "last byte {last} ns after the request");
            assert!(r.last_byte_ns <= got);
        }
    }

    #[tokio::test]
    async fn closed_port_is_a_connect_error() {
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap();
        drop(l);
        assert!(matches!(connect(addr, Duration::from_secs(1)).await, Err(ErrorKind::Connect)));
    }

    #[test]
    fn target_urls() {
        let t = Target::parse("http://127.0.0.1:8080/rubbos/").unwrap();
        assert_eq!(t.addr.port(), 8080);
        assert_eq!(t.prefix, "/rubbos");
        assert_eq!(t.host_header, "127.0.0.1:8080");
        assert!(Target::parse("https://x").is_err());
        assert_eq!(Target::parse("http://127.0.0.1").unwrap().addr.port(), 80);
    }
}
