//! The MySQL-protocol front and back of the middleware (MariaDB behind it): a port of
//! `python/tierscope/middleware/mysql_server.py` with the same rules and counts, on the manager of
//! `mod.rs` (the read policies, labels, the write lock, disabling, the stats).
//!
//! Client side: a protocol-10 greeting offering mysql_native_password; the client must log in as
//! the configured user with the backends' password (nothing else gets in), to the served database.
//! COM_QUERY is one unit of work, classified read or write by `sql` and routed as a PostgreSQL unit
//! (reads to one backend by the policy, writes broadcast under the write lock, a transaction pinned
//! to one connection per backend with the lock held until it ends). COM_PING, COM_INIT_DB (the
//! served database only), COM_RESET_CONNECTION, COM_SET_OPTION and COM_QUIT are answered here, and
//! so are `USE <the served database>`, `SET NAMES utf8mb4` and `SELECT @@socket` (an empty string:
//! a backend's socket would take the client around the middleware).
//!
//! Prepared statements: COM_STMT_PREPARE runs on one backend (chosen like a read) and the client
//! gets the session's own statement id; COM_STMT_EXECUTE is a unit like a query (a read or a write
//! by the statement's SQL), and a backend connection that has not prepared that SQL yet prepares it
//! first (kept: up to 256 per connection). The parameter types the client bound last are sent with
//! every execute. Not supported (ERR 1235): cursors and COM_STMT_SEND_LONG_DATA.
//!
//! Transactions are seen in the backends' status flags (in transaction, autocommit off). A write
//! calling NOW(), CURRENT_TIMESTAMP, ... runs on every backend between `SET timestamp = <one
//! instant>` and `SET timestamp = DEFAULT` (their answers hidden), so every replica stores the same
//! value.
//!
//! The recovery log (`--recovery-log`, `recovery.rs`): a write unit's record is the `SET timestamp`
//! packets around it, `SET insert_id = <the AUTO_INCREMENT value it took>` (appended once the answer
//! is known, under the write lock) and the client's command: COM_QUERY's payload, or for COM_STMT_EXECUTE the
//! prepare+execute bytes (the statement's SQL and the execute payload after the id, parameters in
//! binary with their types), re-prepared on the replaying connection. The position is recorded by
//! hidden commands on each backend connection (`execute`): inside a transaction an `UPDATE
//! tierscope_recovery` before the unit; with none open the unit in the middleware's own `BEGIN`,
//! then `UPDATE` + `COMMIT` when it succeeded or `ROLLBACK` when it failed, so a unit that fails
//! never advances a position. `Cluster::recover` replays or refuses stale backends before listening.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, LazyLock, Mutex, OnceLock};
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use futures_util::stream::{FuturesUnordered, StreamExt};
use rand::Rng;
use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::TcpStream;
use tokio::sync::{oneshot, OwnedMutexGuard, OwnedSemaphorePermit, Semaphore};
use tokio::task::{JoinHandle, JoinSet};

use super::mysql_wire::{self as my, MyError};
use super::pool::{BackendError, RECV_SIZE};
use super::recovery;
use super::sql::{self, Kind, Micros};
use super::{log, pylist, Manager, MiddlewareArgs, NoBackend};

/// statements kept prepared per backend connection at most (the oldest is closed beyond)
pub const STMT_CACHE: usize = 256;
/// the longest command a client may send (bytes)
const MAX_COMMAND: usize = 1 << 30;
const CURSORS_UNSUPPORTED: &str =
    "server-side cursors (COM_STMT_EXECUTE with a cursor flag, COM_STMT_FETCH) are not supported by the tierscope middleware";
const LONG_DATA_UNSUPPORTED: &str = "COM_STMT_SEND_LONG_DATA is not supported by the tierscope middleware";

static USE: LazyLock<regex::Regex> = LazyLock::new(|| regex::Regex::new(r"(?i)^\s*USE\s+`?([A-Za-z0-9_$]+)`?\s*;?\s*$").expect("valid regex"));
static SOCKET: LazyLock<regex::Regex> = LazyLock::new(|| regex::Regex::new(r"(?i)^\s*SELECT\s+@@socket\s*;?\s*$").expect("valid regex"));
static SET_NAMES: LazyLock<regex::Regex> =
    LazyLock::new(|| regex::Regex::new(r"(?i)^\s*SET\s+NAMES\s+'?utf8mb4'?(\s+COLLATE\s+'?utf8mb4_general_ci'?)?\s*;?\s*$").expect("valid regex"));

// --- backends ------------------------------------------------------------------------------------

/// One authenticated MySQL-protocol session on a backend (mysql_native_password), with the
/// statements prepared on it (by their SQL).
pub struct MyConn {
    stream: TcpStream,
    buf: Vec<u8>,
    pos: usize,
    /// the server status flags of the last OK/EOF
    status: u16,
    broken: bool,
    reused: bool,
    version: String,
    /// SQL -> the backend's statement id, and the order they were prepared in
    stmts: HashMap<Vec<u8>, u32>,
    order: VecDeque<Vec<u8>>,
    permit: Option<OwnedSemaphorePermit>,
}

/// The answer to a COM_STMT_PREPARE: its packets (sequence id, payload), the statement id (None
/// when it failed) and the error text.
struct Prepared {
    packets: Vec<(u8, Vec<u8>)>,
    sid: Option<u32>,
    error: Option<String>,
}

fn io_err(e: std::io::Error) -> BackendError {
    BackendError(e.to_string())
}

fn proto_err(e: MyError) -> BackendError {
    BackendError(e.to_string())
}

impl MyConn {
    async fn open(host: &str, port: u16, user: &str, password: &str, database: &str, timeout: Duration) -> Result<MyConn, BackendError> {
        let stream = match tokio::time::timeout(timeout, TcpStream::connect((host, port))).await {
            Ok(Ok(s)) => s,
            Ok(Err(e)) => return Err(BackendError(format!("cannot connect to {host}:{port}: {e}"))),
            Err(_) => return Err(BackendError(format!("cannot connect to {host}:{port}: timed out"))),
        };
        let _ = stream.set_nodelay(true);
        let mut conn = MyConn {
            stream,
            buf: Vec::with_capacity(RECV_SIZE),
            pos: 0,
            status: my::STATUS_AUTOCOMMIT,
            broken: false,
            reused: false,
            version: String::new(),
            stmts: HashMap::new(),
            order: VecDeque::new(),
            permit: None,
        };
        match tokio::time::timeout(timeout, conn.login(user, password, database)).await {
            Ok(Ok(())) => Ok(conn),
            Ok(Err(e)) => Err(BackendError(format!("{host}:{port}: login failed: {e}"))),
            Err(_) => Err(BackendError(format!("{host}:{port}: login failed: timed out"))),
        }
    }

    async fn login(&mut self, user: &str, password: &str, database: &str) -> Result<(), BackendError> {
        let (seq, payload) = self.read_packet().await?;
        if payload.first() == Some(&0xFF) {
            return Err(BackendError(my::err_text(&payload)));
        }
        let hs = my::parse_handshake(&payload).map_err(proto_err)?;
        self.version = hs.version.clone();
        let caps = my::BACKEND_CAPS & (hs.caps | my::LONG_PASSWORD);
        for need in [my::PROTOCOL_41, my::SECURE_CONNECTION] {
            if caps & need == 0 {
                return Err(BackendError(format!("the backend ({}) lacks capability 0x{need:x}", hs.version)));
            }
        }
        let auth = my::scramble_native(password, &hs.salt);
        let resp = my::handshake_response(caps, user, &auth, Some(database), my::NATIVE_PASSWORD);
        self.stream.write_all(&my::packet(seq.wrapping_add(1), &resp)).await.map_err(io_err)?;
        loop {
            let (seq, payload) = self.read_packet().await?;
            match payload.first() {
                Some(0x00) => {
                    self.status = my::parse_ok(&payload).map_err(proto_err)?.2;
                    return Ok(());
                }
                Some(0xFF) => return Err(BackendError(my::err_text(&payload))),
                Some(0xFE) => {
                    // AuthSwitchRequest
                    let (plugin, pos) = my::cstring(&payload, 1);
                    if plugin != my::NATIVE_PASSWORD.as_bytes() {
                        return Err(BackendError(format!(
                            "the backend asks for authentication plugin '{}'; the middleware logs in with {} only",
                            String::from_utf8_lossy(plugin),
                            my::NATIVE_PASSWORD
                        )));
                    }
                    let salt = payload.get(pos..(pos + 20).min(payload.len())).unwrap_or(&[]).to_vec();
                    let answer = my::scramble_native(password, &salt);
                    self.stream.write_all(&my::packet(seq.wrapping_add(1), &answer)).await.map_err(io_err)?;
                }
                other => return Err(BackendError(format!("unexpected packet 0x{:02x} during login", other.copied().unwrap_or(0)))),
            }
        }
    }

    /// Whatever the backend sent next, appended to `buf` (consumed bytes dropped first).
    async fn more(&mut self) -> std::io::Result<()> {
        if self.pos > 0 {
            self.buf.drain(..self.pos);
            self.pos = 0;
        }
        if self.buf.capacity() - self.buf.len() < RECV_SIZE / 4 {
            self.buf.reserve(RECV_SIZE);
        }
        let n = self.stream.read_buf(&mut self.buf).await?;
        if n == 0 {
            return Err(std::io::Error::new(std::io::ErrorKind::UnexpectedEof, "the backend closed the connection"));
        }
        Ok(())
    }

    /// The next (sequence id, payload), a split payload joined.
    async fn read_packet(&mut self) -> Result<(u8, Vec<u8>), BackendError> {
        let mut out = Vec::new();
        loop {
            while self.buf.len() - self.pos < 4 {
                self.more().await.map_err(io_err)?;
            }
            let (n, seq) = my::header(&self.buf, self.pos);
            while self.buf.len() - self.pos < 4 + n {
                self.more().await.map_err(io_err)?;
            }
            out.extend_from_slice(&self.buf[self.pos + 4..self.pos + 4 + n]);
            self.pos += 4 + n;
            if n < my::MAX_PAYLOAD {
                return Ok((seq, out));
            }
        }
    }

    /// COM_STMT_PREPARE `sql` here (the oldest statement closed first when STMT_CACHE are).
    async fn prepare(&mut self, sql: &[u8]) -> Result<Prepared, BackendError> {
        let mut out = Vec::with_capacity(sql.len() + 16);
        if self.order.len() >= STMT_CACHE {
            if let Some(old) = self.order.pop_front() {
                if let Some(id) = self.stmts.remove(&old) {
                    let mut close = vec![my::COM_STMT_CLOSE];
                    close.extend_from_slice(&id.to_le_bytes());
                    my::packet_into(&mut out, 0, &close); // no answer
                }
            }
        }
        let mut cmd = Vec::with_capacity(sql.len() + 1);
        cmd.push(my::COM_STMT_PREPARE);
        cmd.extend_from_slice(sql);
        my::packet_into(&mut out, 0, &cmd);
        self.stream.write_all(&out).await.map_err(io_err)?;
        let (seq, first) = self.read_packet().await?;
        if first.first() == Some(&0xFF) {
            let error = Some(my::err_text(&first));
            return Ok(Prepared { packets: vec![(seq, first)], sid: None, error });
        }
        if first.first() != Some(&0) || first.len() < 12 {
            return Err(BackendError(format!("unexpected answer to COM_STMT_PREPARE: 0x{:02x}", first.first().copied().unwrap_or(0))));
        }
        let sid = my::u32_at(&first, 1).map_err(proto_err)?;
        let columns = my::u16_at(&first, 5).map_err(proto_err)? as usize;
        let params = my::u16_at(&first, 7).map_err(proto_err)? as usize;
        let mut packets = vec![(seq, first)];
        for n in [params, columns] {
            for _ in 0..if n > 0 { n + 1 } else { 0 } {
                packets.push(self.read_packet().await?); // the definitions, then an EOF
            }
        }
        self.stmts.insert(sql.to_vec(), sid);
        self.order.push_back(sql.to_vec());
        Ok(Prepared { packets, sid: Some(sid), error: None })
    }

    fn close(&mut self) {
        self.broken = true;
    }

    /// Run one statement of the middleware's own: the first column of its rows, or the error.
    async fn simple(&mut self, text: &str) -> Result<Vec<Option<String>>, String> {
        let mut cmd = vec![my::COM_QUERY];
        cmd.extend_from_slice(text.as_bytes());
        self.stream.write_all(&my::packet(0, &cmd)).await.map_err(|e| e.to_string())?;
        let (_, first) = self.read_packet().await.map_err(|e| e.0)?;
        match first.first() {
            Some(0xFF) => return Err(my::err_text(&first)),
            Some(0x00) => {
                self.status = my::parse_ok(&first).map_err(|e| e.to_string())?.2;
                return Ok(Vec::new());
            }
            _ => {}
        }
        let columns = my::lenenc_int(&first, 0).map_err(|e| e.to_string())?.0;
        for _ in 0..=columns {
            self.read_packet().await.map_err(|e| e.0)?; // the definitions, then an EOF
        }
        let mut rows = Vec::new();
        loop {
            let (_, p) = self.read_packet().await.map_err(|e| e.0)?;
            match p.first() {
                Some(0xFE) if p.len() < 9 => {
                    self.status = my::u16_at(&p, 3).unwrap_or(self.status);
                    return Ok(rows);
                }
                Some(0xFF) => return Err(my::err_text(&p)),
                Some(0xFB) => rows.push(None),
                _ => {
                    let (n, at) = my::lenenc_int(&p, 0).map_err(|e| e.to_string())?;
                    rows.push(p.get(at..at + n as usize).map(|v| String::from_utf8_lossy(v).into_owned()));
                }
            }
        }
    }
}

/// Close a connection politely (COM_QUIT, when the socket takes it at once).
fn quit(conn: MyConn) {
    let _ = conn.stream.try_write(&my::packet(0, &[my::COM_QUIT]));
}

/// At most `size` connections to one MariaDB backend; `acquire` waits for a free one.
pub struct MyPool {
    host: String,
    port: u16,
    user: String,
    password: String,
    database: String,
    idle: Mutex<Vec<MyConn>>,
    slots: Arc<Semaphore>,
    opened: AtomicU64,
}

impl MyPool {
    fn new(host: &str, port: u16, user: &str, password: &str, database: &str, size: usize) -> MyPool {
        MyPool {
            host: host.into(),
            port,
            user: user.into(),
            password: password.into(),
            database: database.into(),
            idle: Mutex::new(Vec::new()),
            slots: Arc::new(Semaphore::new(size)),
            opened: AtomicU64::new(0),
        }
    }

    fn idle(&self) -> std::sync::MutexGuard<'_, Vec<MyConn>> {
        self.idle.lock().unwrap_or_else(|e| e.into_inner())
    }

    async fn acquire(&self) -> Result<MyConn, BackendError> {
        let permit = self.slots.clone().acquire_owned().await.map_err(|_| BackendError("the pool is closed".into()))?;
        let idle = self.idle().pop();
        let mut conn = match idle {
            Some(mut c) => {
                c.reused = true;
                c
            }
            None => {
                let c = MyConn::open(&self.host, self.port, &self.user, &self.password, &self.database, Duration::from_secs(10)).await?;
                self.opened.fetch_add(1, Ordering::Relaxed);
                c
            }
        };
        conn.permit = Some(permit);
        Ok(conn)
    }

    fn release(&self, mut conn: MyConn) {
        let permit = conn.permit.take();
        if !conn.broken && my::idle(conn.status) && conn.pos == conn.buf.len() {
            conn.buf.clear();
            conn.pos = 0;
            self.idle().push(conn);
        } else {
            quit(conn);
        }
        drop(permit);
    }

    fn drop_idle(&self) {
        let idle: Vec<MyConn> = std::mem::take(&mut *self.idle());
        for c in idle {
            quit(c);
        }
    }
}

/// The manager and the MariaDB connection pools (one per backend, in the manager's order).
pub struct Cluster {
    m: Arc<Manager>,
    pools: Vec<MyPool>,
    password: String,
    /// the first backend's server version (the clients' greeting names it)
    version: OnceLock<String>,
}

impl Cluster {
    pub fn new(m: Arc<Manager>, password: &str, pool: usize) -> Cluster {
        let pools = m
            .backends
            .iter()
            .map(|b| {
                let p = &b.pool; // the PostgreSQL pool's address and settings (never opened)
                MyPool::new(&p.host, p.port, &p.user, password, &p.database, pool)
            })
            .collect();
        Cluster { m, pools, password: password.into(), version: OnceLock::new() }
    }

    /// Give a connection back (dropping the backend's idle ones when it has been disabled).
    fn release(&self, b: usize, conn: MyConn) {
        self.pools[b].release(conn);
        if !self.m.backends[b].enabled() {
            self.pools[b].drop_idle();
        }
    }

    fn disable(&self, b: usize, reason: &str) {
        self.m.disable(b, reason);
        self.pools[b].drop_idle();
    }

    /// Open one connection to every backend (retrying up to `timeout`); a backend that never
    /// answers is disabled.
    async fn check_backends(&self, timeout: Duration) -> Result<(), NoBackend> {
        let deadline = Instant::now() + timeout;
        for (i, p) in self.pools.iter().enumerate() {
            loop {
                match p.acquire().await {
                    Ok(conn) => {
                        let _ = self.version.set(conn.version.clone());
                        p.release(conn);
                        break;
                    }
                    Err(_) if Instant::now() < deadline => tokio::time::sleep(Duration::from_millis(200)).await,
                    Err(err) => {
                        self.disable(i, &format!("unreachable at start: {err}"));
                        break;
                    }
                }
            }
        }
        if self.m.enabled().is_empty() {
            let st = self.m.state();
            let why: Vec<String> =
                self.m.backends.iter().zip(&st.b).map(|(b, s)| format!("{}: {}", b.name, s.disabled_reason.as_deref().unwrap_or("None"))).collect();
            return Err(NoBackend(format!("no database backend answered: {}", why.join("; "))));
        }
        Ok(())
    }

    /// With a recovery log, before anything is served (the manager's `recover` for MariaDB): each
    /// enabled backend's position (its `tierscope_recovery` table, made when missing: position 0);
    /// a backend behind the head gets the missing units replayed from the log on one connection,
    /// each with its position as when it first ran, then the head as its position; one the log
    /// cannot bring there is refused: disabled with one message naming it and the positions. With
    /// every backend at the head, the log is emptied.
    async fn recover(&self) -> Result<(), NoBackend> {
        let m = &self.m;
        let Some(rlog) = &m.recovery else { return Ok(()) };
        let n = self.pools.len();
        let mut pos: Vec<Option<u64>> = vec![None; n];
        let t = recovery::TABLE;
        for i in m.enabled() {
            let found: Result<u64, String> = async {
                let mut conn = self.pools[i].acquire().await.map_err(|e| e.0)?;
                let r = async {
                    conn.simple(&format!("CREATE TABLE IF NOT EXISTS {t} (seq bigint NOT NULL) ENGINE=InnoDB")).await?;
                    let rows = conn.simple(&format!("SELECT seq FROM {t}")).await?;
                    match rows.as_slice() {
                        [] => {
                            conn.simple(&format!("INSERT INTO {t} VALUES (0)")).await?;
                            Ok(0)
                        }
                        [Some(v)] if v.starts_with('-') => Err(format!(
                            "{t}.seq is {v}: a replay from the recovery log left it different from the others; copy another backend's database to it"
                        )),
                        [Some(v)] => v.parse::<u64>().map_err(|e| format!("{t}.seq {v:?}: {e}")),
                        _ => Err(format!("{t} holds {} rows, expected one", rows.len())),
                    }
                }
                .await;
                self.pools[i].release(conn);
                r
            }
            .await;
            match found {
                Ok(p) => pos[i] = Some(p),
                Err(e) => self.disable(i, &format!("recovery: cannot read its position: {e}")),
            }
        }
        let range = rlog.range();
        let head = recovery::head(&pos, range);
        let path = rlog.path.display().to_string();
        let positions: Vec<String> =
            m.backends.iter().zip(&pos).map(|(b, p)| format!("{} at {}", b.name, p.map_or("?".to_string(), |p| p.to_string()))).collect();
        let mut replayed = serde_json::Map::new();
        for (i, &p) in pos.iter().enumerate() {
            let Some(p) = p else { continue };
            let name = &m.backends[i].name;
            let (from, to) = match recovery::verdict(p, head, range, &path) {
                Ok(None) => continue,
                Ok(Some(r)) => r,
                Err(why) => {
                    let msg = format!(
                        "stale backend {name} REFUSED: its position is {p}, the head is {head} ({}); {why}: it cannot be brought to the head and is not used (copy another backend's database to it, then restart)",
                        positions.join(", ")
                    );
                    self.disable(i, &msg); // (logged there, once)
                    continue;
                }
            };
            let done: Result<usize, String> = async {
                let records = rlog.read(from, to).map_err(|e| format!("reading {path}: {e}"))?;
                let mut conn = self.pools[i].acquire().await.map_err(|e| e.0)?;
                let r = async {
                    let mut errors = 0;
                    for (seq, rec) in &records {
                        let (out, ok) = replayed_unit(rec, *seq).ok_or_else(|| format!("unit {seq}: not a MySQL-protocol record"))?;
                        let mut sink = Sink { held: Vec::new(), client: None, saw: false, client_failed: false };
                        let x = execute(&mut conn, &out, &mut sink).await;
                        if x.broken {
                            return Err(format!("unit {seq}: {}", x.error.unwrap_or_default()));
                        }
                        if x.ok != ok {
                            // its position did not move with it: the others' outcome is not this one's
                            return Err(match x.error {
                                Some(e) => format!("unit {seq} failed here ({e}) where it succeeded on the others"),
                                None => format!("unit {seq} succeeded here where it failed on the others"),
                            });
                        }
                        errors += !x.ok as usize;
                    }
                    if !my::idle(conn.status) {
                        conn.simple("ROLLBACK").await?; // a transaction the middleware never saw end
                    }
                    conn.simple(&recovery::position_sql(head)).await?;
                    Ok::<usize, String>(errors)
                }
                .await;
                conn.close(); // its session settings are the replay's
                self.pools[i].release(conn);
                r.map(|errors| {
                    log(&format!(
                        "backend {name} was behind: units {from}..{to} replayed from {path} ({errors} answered with an error, as they did on the others); now at {head}"
                    ));
                    records.len()
                })
            }
            .await;
            match done {
                Ok(k) => {
                    replayed.insert(name.clone(), json!({"from": p, "units": k}));
                }
                Err(e) => {
                    let msg = format!("stale backend {name} REFUSED: its position is {p}, the head is {head}; replaying from {path} failed: {e}");
                    self.disable(i, &msg);
                }
            }
        }
        m.conclude_recovery(rlog, head, range.is_some(), &pos, replayed, &positions)
    }

    /// The manager's counts with this protocol's name and pools.
    fn stats(&self) -> serde_json::Value {
        let mut s = self.m.stats();
        s["protocol"] = json!("mysql");
        if let Some(bs) = s["backends"].as_array_mut() {
            for (b, p) in bs.iter_mut().zip(&self.pools) {
                b["connections_opened"] = json!(p.opened.load(Ordering::Relaxed));
            }
        }
        s
    }
}

// --- units of work -------------------------------------------------------------------------------

/// Why a command could not be served: no backend (the client gets an error and the session goes
/// on), or the session must end (with a reason to log, if any).
enum Fail {
    NoBackend(String),
    End(Option<String>),
}

impl From<NoBackend> for Fail {
    fn from(e: NoBackend) -> Fail {
        Fail::NoBackend(e.0)
    }
}

impl From<MyError> for Fail {
    fn from(e: MyError) -> Fail {
        Fail::End(Some(e.to_string()))
    }
}

type SResult<T> = Result<T, Fail>;

/// A statement a client prepared (its id is the session's own).
struct PStmt {
    sql: Arc<Vec<u8>>,
    text: String,
    params: u16,
    kind: Kind,
    /// the parameter types the client bound last (sent again with every execute)
    types: Option<Vec<u8>>,
    /// COM_STMT_SEND_LONG_DATA came (not supported)
    long_data: bool,
}

/// A unit of work: a COM_QUERY payload, or a prepared statement's SQL and COM_STMT_EXECUTE's
/// payload after the statement id.
enum Unit {
    Query(Vec<u8>),
    Execute(Arc<Vec<u8>>, Vec<u8>),
}

/// The commands one backend connection gets for a unit: `pre` + the query (or the execute, the
/// statement prepared first where it is not yet) + `post`, and per command whether the client sees
/// its answer.
struct Outgoing {
    query: Vec<u8>,
    stmt: Option<(Arc<Vec<u8>>, Vec<u8>)>,
    pre: Vec<u8>,
    post: Vec<u8>,
    passed: Vec<bool>,
    /// the unit's number in the recovery log: its position is recorded with it (`execute`)
    seq: Option<u64>,
    /// it opens a transaction or sets autocommit (`recovery::my_opens_transaction`)
    opens: bool,
}

/// What one backend answered to a unit (the replies themselves are in the sink).
#[derive(Clone, Default)]
struct Exec {
    ok: bool,
    error: Option<String>,
    tags: Vec<String>,
    status: u16,
    broken: bool,
}

/// Where the replies the client must see go: kept (`held`), and for a read also written to the
/// client once 64 KiB are held.
struct Sink<'a> {
    held: Vec<u8>,
    client: Option<&'a mut OwnedWriteHalf>,
    saw: bool,
    client_failed: bool,
}

impl Sink<'_> {
    async fn maybe_flush(&mut self) {
        if self.held.len() < 65536 {
            return;
        }
        if let Some(c) = self.client.as_mut() {
            self.saw = true;
            if !self.client_failed && c.write_all(&self.held).await.is_err() {
                self.client_failed = true;
            }
            self.held.clear();
        }
    }
}

/// Send a unit's commands on one connection and follow their answers; the bytes the client must
/// see go to `sink` as they come.
async fn execute(conn: &mut MyConn, out: &Outgoing, sink: &mut Sink<'_>) -> Exec {
    let result: Result<Exec, String> = async {
        let mut x = Exec { ok: true, ..Default::default() };
        let exec_packet;
        let query = match &out.stmt {
            Some((sql, body)) => {
                let sid = match conn.stmts.get(sql.as_slice()) {
                    Some(&sid) => sid,
                    None => {
                        // first time on this connection: prepare it here (one more round trip)
                        let p = conn.prepare(sql).await.map_err(|e| e.0)?;
                        match p.sid {
                            Some(sid) => sid,
                            None => {
                                x.ok = false;
                                x.error = p.error;
                                x.status = conn.status;
                                if let Some((_, err)) = p.packets.first() {
                                    my::packet_into(&mut sink.held, 1, err);
                                }
                                return Ok(x);
                            }
                        }
                    }
                };
                let mut cmd = Vec::with_capacity(body.len() + 5);
                cmd.push(my::COM_STMT_EXECUTE);
                cmd.extend_from_slice(&sid.to_le_bytes());
                cmd.extend_from_slice(body);
                exec_packet = my::packet(0, &cmd);
                &exec_packet
            }
            None => &out.query,
        };
        // the recovery log: the unit's position recorded with it. Inside a transaction (or with
        // autocommit off): the UPDATE first, committed or rolled back with the unit. Else the unit
        // runs in the middleware's own BEGIN, then UPDATE + COMMIT when it succeeded, ROLLBACK when
        // it failed (a unit opening a transaction itself: the UPDATE after it, inside it)
        let mut lead: Option<Vec<u8>> = None;
        let mut tail: Option<(u64, bool)> = None;
        if let Some(seq) = out.seq {
            if !my::idle(conn.status) {
                lead = Some(position_packet(seq));
            } else if out.opens {
                tail = Some((seq, false));
            } else {
                lead = Some(my::packet(0, b"\x03BEGIN"));
                tail = Some((seq, true));
            }
        }
        if out.pre.is_empty() && out.post.is_empty() && lead.is_none() {
            conn.stream.write_all(query).await.map_err(|e| e.to_string())?;
        } else {
            let data = [lead.as_deref().unwrap_or(&[]), out.pre.as_slice(), query, out.post.as_slice()].concat();
            conn.stream.write_all(&data).await.map_err(|e| e.to_string())?;
        }
        let passed_list: Vec<bool> = lead.iter().map(|_| false).chain(out.passed.iter().copied()).collect();
        for &passed in &passed_list {
            let mut r = my::Response::default();
            let mut run: Option<usize> = None; // where the bytes not yet passed on begin
            while !r.done {
                let avail = conn.buf.len() - conn.pos;
                if avail >= 4 {
                    let (n, _) = my::header(&conn.buf, conn.pos);
                    if avail >= 4 + n {
                        let p = conn.pos;
                        let first = if n > 0 { Some(conn.buf[p + 4]) } else { None };
                        r.feed(first, n, &conn.buf[p + 4..p + 4 + n]).map_err(|e| e.to_string())?;
                        if passed && run.is_none() {
                            run = Some(p);
                        }
                        conn.pos = p + 4 + n;
                        continue;
                    }
                }
                if let Some(s) = run.take() {
                    sink.held.extend_from_slice(&conn.buf[s..conn.pos]);
                    sink.maybe_flush().await;
                }
                conn.more().await.map_err(|e| e.to_string())?;
            }
            if let Some(s) = run.take() {
                sink.held.extend_from_slice(&conn.buf[s..conn.pos]);
            }
            if let Some(st) = r.status {
                conn.status = st;
            }
            if passed {
                x.ok = x.ok && r.ok;
                if x.error.is_none() {
                    x.error = r.error;
                }
                x.tags.append(&mut r.tags);
            } else if !r.ok {
                // the proxy's own command failed: the unit cannot be trusted
                return Err(format!("the middleware's own command failed: {}", r.error.unwrap_or_default()));
            }
        }
        if let Some((seq, wrapped)) = tail {
            let mut cmds: Vec<Vec<u8>> = Vec::new();
            if x.ok {
                cmds.push(position_packet(seq));
                if wrapped {
                    cmds.push(my::packet(0, b"\x03COMMIT"));
                }
            } else if wrapped {
                cmds.push(my::packet(0, b"\x03ROLLBACK"));
            }
            hidden(conn, &cmds).await?;
            if wrapped {
                clear_in_trans(&mut sink.held); // the client's OK was sent inside the middleware's BEGIN
            }
        }
        x.status = conn.status;
        Ok(x)
    }
    .await;
    match result {
        Ok(x) => x,
        Err(err) => {
            conn.close();
            Exec { ok: false, error: Some(format!("connection failed: {err}")), status: conn.status, broken: true, tags: Vec::new() }
        }
    }
}

/// The command recording position `seq` in a backend's recovery table.
fn position_packet(seq: u64) -> Vec<u8> {
    let mut cmd = vec![my::COM_QUERY];
    cmd.extend_from_slice(recovery::position_sql(seq).as_bytes());
    my::packet(0, &cmd)
}

/// Send the middleware's own commands (packets) on a connection and read their answers (dropped;
/// one that fails fails the unit).
async fn hidden(conn: &mut MyConn, cmds: &[Vec<u8>]) -> Result<(), String> {
    if cmds.is_empty() {
        return Ok(());
    }
    conn.stream.write_all(&cmds.concat()).await.map_err(|e| e.to_string())?;
    for _ in cmds {
        let mut r = my::Response::default();
        while !r.done {
            let (_, p) = conn.read_packet().await.map_err(|e| e.0)?;
            r.feed(p.first().copied(), p.len(), &p).map_err(|e| e.to_string())?;
        }
        if let Some(st) = r.status {
            conn.status = st;
        }
        if !r.ok {
            return Err(format!("the middleware's own command failed: {}", r.error.unwrap_or_default()));
        }
    }
    Ok(())
}

/// Clear SERVER_STATUS_IN_TRANS in an answer that is one OK packet.
fn clear_in_trans(held: &mut [u8]) {
    if held.len() < 4 + 7 || held[4] != 0 || my::header(held, 0).0 + 4 != held.len() {
        return;
    }
    let Ok((_, at)) = my::lenenc_int(held, 5) else { return };
    let Ok((_, at)) = my::lenenc_int(held, at) else { return };
    if let Some(b) = held.get_mut(at) {
        *b &= !(my::STATUS_IN_TRANS as u8);
    }
}

/// A unit read back from the recovery log, to replay as unit `seq`, and whether it succeeded.
fn replayed_unit(rec: &[u8], seq: u64) -> Option<(Outgoing, bool)> {
    let recovery::MyRecord { ok, pre, post, command } = recovery::my_unrecord(rec)?;
    let count = |b: &[u8]| {
        let mut n = 0;
        let mut at = 0;
        while at + 4 <= b.len() {
            at += 4 + my::header(b, at).0;
            n += 1;
        }
        n
    };
    let (npre, npost) = (count(pre), count(post));
    let (query, stmt, text) = match command[0] {
        my::COM_QUERY => (my::packet(0, command), None, String::from_utf8_lossy(&command[1..]).into_owned()),
        my::COM_STMT_EXECUTE => {
            let (sql, body) = recovery::my_execute_parts(command)?;
            (Vec::new(), Some((Arc::new(sql.to_vec()), body.to_vec())), String::from_utf8_lossy(sql).into_owned())
        }
        _ => return None,
    };
    let passed = std::iter::repeat_n(false, npre).chain([true]).chain(std::iter::repeat_n(false, npost)).collect();
    let opens = recovery::my_opens_transaction(&text);
    Some((Outgoing { query, stmt, pre: pre.to_vec(), post: post.to_vec(), passed, seq: Some(seq), opens }, ok))
}

/// An explicit transaction: its connections (one per backend still in it) and the write lock.
struct Txn {
    conns: Vec<(usize, MyConn)>,
    guard: OwnedMutexGuard<()>,
}

/// One backend's complete answer to a write unit.
struct Res {
    b: usize,
    conn: Option<MyConn>,
    replies: Vec<u8>,
    x: Exec,
}

/// The answer a write unit gives the client.
struct Answer {
    replies: Vec<u8>,
    ok: bool,
    status: u16,
    /// the unit could not be appended to the recovery log (the client must not be answered)
    log_error: Option<String>,
}

/// A write unit's record to append to the recovery log (`broadcast`, under the write lock).
struct Logging {
    log: Arc<recovery::Log>,
    seq: u64,
    pre: Vec<u8>,
    post: Vec<u8>,
    command: Vec<u8>,
}

/// The first AUTO_INCREMENT value a unit's answer reports (the first OK with a last insert id
/// other than 0, its results followed through), 0 when none.
fn first_insert_id(replies: &[u8]) -> u64 {
    let mut packets = Vec::new();
    let mut at = 0;
    while at + 4 <= replies.len() {
        let n = my::header(replies, at).0;
        let Some(p) = replies.get(at + 4..at + 4 + n) else { break };
        packets.push(p);
        at += 4 + n;
    }
    let mut i = 0;
    while let Some(p) = packets.get(i) {
        match p.first() {
            Some(0x00) if p.len() >= 7 => {
                let Ok((_, id, status)) = my::parse_ok(p) else { return 0 };
                if id != 0 {
                    return id;
                }
                if status & my::STATUS_MORE_RESULTS == 0 {
                    return 0;
                }
                i += 1;
            }
            Some(0xFF) | None => return 0,
            _ => {
                // a result set: skip to the EOF after its rows
                let Ok((columns, _)) = my::lenenc_int(p, 0) else { return 0 };
                i += 1 + columns as usize + 1;
                loop {
                    let Some(q) = packets.get(i) else { return 0 };
                    i += 1;
                    if q.first() == Some(&0xFE) && q.len() < 9 {
                        if my::u16_at(q, 3).unwrap_or(0) & my::STATUS_MORE_RESULTS == 0 {
                            return 0;
                        }
                        break;
                    }
                    if q.first() == Some(&0xFF) {
                        return 0;
                    }
                }
            }
        }
    }
    0
}

/// Append a unit's record, with `SET insert_id = <the value it took>` first when it took one (a
/// replay then gives its rows the same AUTO_INCREMENT values whatever the stale backend's counter
/// says: values taken by a transaction it was running when it went down are lost there); fsync'd
/// when the unit leaves no transaction open.
async fn log_unit(lg: &Logging, ok: bool, replies: &[u8], status: u16) -> Result<(), String> {
    let id = first_insert_id(replies);
    let mut pre = Vec::new();
    if id != 0 {
        my::packet_into(&mut pre, 0, format!("\x03SET insert_id = {id}").as_bytes());
    }
    pre.extend_from_slice(&lg.pre);
    let rec = recovery::my_record(ok, &pre, &lg.post, &lg.command);
    recovery::append(lg.log.clone(), lg.seq, Arc::new(rec), my::idle(status)).await
}

/// Run a write unit on every leased backend; answer the client by the wait policy (the first
/// backend to succeed, or all), then settle the unit. Returns the transaction, if one is open.
async fn broadcast(
    c: Arc<Cluster>,
    conns: Vec<(usize, MyConn)>,
    guard: OwnedMutexGuard<()>,
    out: Arc<Outgoing>,
    tx: oneshot::Sender<Answer>,
    mut logging: Option<Logging>,
) -> Option<Txn> {
    let m = &c.m;
    let idx: Vec<usize> = conns.iter().map(|c| c.0).collect();
    m.writes_begin(&idx);
    let n = idx.len();
    let mut running = FuturesUnordered::new();
    for (pos, (b, mut conn)) in conns.into_iter().enumerate() {
        let out = &out;
        running.push(async move {
            let mut sink = Sink { held: Vec::new(), client: None, saw: false, client_failed: false };
            let x = execute(&mut conn, out, &mut sink).await;
            m.writes_end(b);
            if x.ok {
                m.write_finished(b); // reads waiting for this write on b may go; after a failure, settle first
            }
            (pos, Res { b, conn: Some(conn), replies: sink.held, x })
        });
    }
    let mut results: Vec<Option<Res>> = (0..n).map(|_| None).collect();
    let mut finished_here = vec![false; n];
    let mut chosen: Option<usize> = None;
    let mut tx = Some(tx);
    while let Some((pos, r)) = running.next().await {
        if r.x.ok {
            finished_here[pos] = true;
            if !m.wait_all && chosen.is_none() {
                chosen = Some(pos);
                let mut log_error = None;
                if let Some(lg) = logging.take() {
                    log_error = log_unit(&lg, true, &r.replies, r.x.status).await.err();
                }
                if let Some(tx) = tx.take() {
                    let _ = tx.send(Answer { replies: r.replies.clone(), ok: true, status: r.x.status, log_error });
                }
            }
        }
        results[pos] = Some(r);
    }
    drop(running);
    let results: Vec<Res> = results
        .into_iter()
        .enumerate()
        .map(|(pos, r)| {
            r.unwrap_or_else(|| Res { b: idx[pos], conn: None, replies: Vec::new(), x: Exec { ok: false, broken: true, ..Default::default() } })
        })
        .collect();
    // not answered yet (wait=all, or no backend succeeded): logged before the lock goes
    let mut log_error = None;
    if let Some(lg) = logging.take() {
        let ch = results.iter().position(|r| r.x.ok).or_else(|| results.iter().position(|r| !r.x.broken)).unwrap_or(0);
        log_error = log_unit(&lg, results[ch].x.ok, &results[ch].replies, results[ch].x.status).await.err();
    }
    let (ch, results, txn) = settle(&c, results, chosen, guard);
    for (pos, &b) in idx.iter().enumerate() {
        if !finished_here[pos] {
            m.write_finished(b);
        }
    }
    if let Some(tx) = tx.take() {
        let r = &results[ch];
        let _ = tx.send(Answer { replies: r.replies.clone(), ok: r.x.ok, status: r.x.status, log_error });
    }
    m.inflight_add(-1);
    txn
}

/// After a write unit ran on every leased backend: disable the backends that failed where another
/// succeeded (or whose result differs), then either keep the connections and the lock for the open
/// transaction or give them back. Returns the position of the result that answers the client.
fn settle(c: &Cluster, mut results: Vec<Res>, chosen: Option<usize>, guard: OwnedMutexGuard<()>) -> (usize, Vec<Res>, Option<Txn>) {
    let m = &c.m;
    let any_ok = results.iter().any(|r| r.x.ok);
    let ch = chosen.or_else(|| results.iter().position(|r| r.x.ok)).or_else(|| results.iter().position(|r| !r.x.broken)).unwrap_or(0);
    let chosen_name = m.backends[results[ch].b].name.clone();
    let chosen_tags = results[ch].x.tags.clone();
    if any_ok {
        for r in &results {
            let err = r.x.error.as_deref().unwrap_or("None");
            if !r.x.ok {
                m.state().b[r.b].failed_writes += 1;
                c.disable(r.b, &format!("write failed where {chosen_name} succeeded: {err}"));
            } else if r.x.tags != chosen_tags {
                c.disable(r.b, &format!("write result {} differs from {chosen_name}'s {}", pylist(&r.x.tags), pylist(&chosen_tags)));
            }
        }
    } else if results.iter().all(|r| r.x.broken) {
        for r in &results {
            c.disable(r.b, &format!("write failed: {}", r.x.error.as_deref().unwrap_or("None")));
        }
    }
    let alive: Vec<bool> = results.iter().map(|r| m.backends[r.b].enabled() && r.conn.is_some() && !r.x.broken).collect();
    let in_txn = results.iter().zip(&alive).any(|(r, &a)| a && !my::idle(r.x.status));
    let mut lease = Vec::new();
    for (r, &a) in results.iter_mut().zip(&alive) {
        let Some(mut conn) = r.conn.take() else { continue };
        if in_txn && a {
            lease.push((r.b, conn));
        } else {
            if in_txn {
                conn.close(); // a backend dropped from the transaction
            }
            c.release(r.b, conn);
        }
    }
    let txn = if in_txn { Some(Txn { conns: lease, guard }) } else { None };
    (ch, results, txn)
}

// --- client sessions -----------------------------------------------------------------------------

/// One client connection speaking the MySQL protocol.
struct Session {
    c: Arc<Cluster>,
    m: Arc<Manager>,
    id: u32,
    rd: OwnedReadHalf,
    wr: OwnedWriteHalf,
    inbuf: Vec<u8>,
    inpos: usize,
    out: Vec<u8>,
    /// prepared by the client, by the session's own ids
    stmts: HashMap<u32, PStmt>,
    next_stmt: u32,
    txn: Option<Txn>,
    last_write: Option<JoinHandle<Option<Txn>>>,
}

impl Session {
    fn new(c: Arc<Cluster>, stream: TcpStream, id: u32) -> Session {
        let (rd, wr) = stream.into_split();
        let m = c.m.clone();
        Session {
            c,
            m,
            id,
            rd,
            wr,
            inbuf: Vec::with_capacity(8192),
            inpos: 0,
            out: Vec::with_capacity(8192),
            stmts: HashMap::new(),
            next_stmt: 1,
            txn: None,
            last_write: None,
        }
    }

    async fn run(mut self) {
        self.m.count(|c| c.sessions += 1);
        if let Err(Fail::End(Some(why))) = self.serve().await {
            log(&format!("session {}: {why}", self.id));
        }
        self.end().await;
    }

    fn status_flags(&self) -> u16 {
        if self.txn.is_some() {
            my::STATUS_IN_TRANS
        } else {
            my::STATUS_AUTOCOMMIT
        }
    }

    /// An answer of one packet (sequence id 1 unless said) queued for the client.
    fn reply(&mut self, payload: &[u8], seq: u8) {
        my::packet_into(&mut self.out, seq, payload);
    }

    fn refuse(&mut self, code: u16, message: &str, state: &str) {
        self.m.count(|c| c.errors_to_clients += 1);
        self.reply(&my::err(code, message, state), 1);
    }

    async fn flush(&mut self) -> SResult<()> {
        if !self.out.is_empty() {
            self.wr.write_all(&self.out).await.map_err(|_| Fail::End(None))?;
            self.out.clear();
        }
        Ok(())
    }

    /// At least `n` unread bytes in `inbuf`.
    async fn fill(&mut self, n: usize) -> SResult<()> {
        while self.inbuf.len() - self.inpos < n {
            if self.inpos > 0 {
                self.inbuf.drain(..self.inpos);
                self.inpos = 0;
            }
            self.inbuf.reserve(RECV_SIZE.max(n));
            let k = self.rd.read_buf(&mut self.inbuf).await.map_err(|_| Fail::End(None))?;
            if k == 0 {
                return Err(Fail::End(None));
            }
        }
        Ok(())
    }

    /// The client's next (sequence id, payload), a split payload joined (at most `limit` bytes).
    async fn read_packet(&mut self, limit: usize) -> SResult<(u8, Vec<u8>)> {
        let mut out = Vec::new();
        loop {
            self.fill(4).await?;
            let (n, seq) = my::header(&self.inbuf, self.inpos);
            if out.len() + n > limit {
                return Err(Fail::End(Some(format!("a command of more than {limit} bytes"))));
            }
            self.fill(4 + n).await?;
            out.extend_from_slice(&self.inbuf[self.inpos + 4..self.inpos + 4 + n]);
            self.inpos += 4 + n;
            if n < my::MAX_PAYLOAD {
                return Ok((seq, out));
            }
        }
    }

    async fn serve(&mut self) -> SResult<()> {
        if !self.login().await? {
            return Ok(());
        }
        loop {
            let (_, payload) = self.read_packet(MAX_COMMAND).await?;
            let Some(&cmd) = payload.first() else {
                return Err(Fail::End(Some("an empty command packet".into())));
            };
            self.collect_last_write().await;
            match cmd {
                my::COM_QUERY => self.query(payload).await?,
                my::COM_QUIT => return Ok(()),
                my::COM_PING => self.reply(&my::ok(0, 0, self.status_flags()), 1),
                my::COM_INIT_DB => {
                    let name = String::from_utf8_lossy(&payload[1..]).into_owned();
                    self.use_db(&name);
                }
                my::COM_RESET_CONNECTION => {
                    self.reset().await;
                    self.reply(&my::ok(0, 0, self.status_flags()), 1);
                }
                my::COM_SET_OPTION => self.reply(&my::eof(self.status_flags()), 1), // the backends allow multiple statements anyway
                my::COM_STMT_PREPARE => self.stmt_prepare(payload[1..].to_vec()).await?,
                my::COM_STMT_EXECUTE => self.stmt_execute(&payload).await?,
                my::COM_STMT_CLOSE | my::COM_STMT_SEND_LONG_DATA | my::COM_STMT_RESET => self.stmt_other(cmd, &payload),
                my::COM_STMT_FETCH => self.refuse(my::ER_NOT_SUPPORTED_YET, CURSORS_UNSUPPORTED, "42000"),
                _ => self.refuse(my::ER_UNKNOWN_COM, &format!("command 0x{cmd:02x} is not supported by the middleware"), "08S01"),
            }
            self.flush().await?;
        }
    }

    /// Greet, check the user, the password (mysql_native_password) and the database.
    async fn login(&mut self) -> SResult<bool> {
        let mut salt = [0u8; 20];
        {
            let mut rng = rand::thread_rng();
            for s in salt.iter_mut() {
                *s = rng.gen_range(33..=126);
            }
        }
        let version = format!("{}-tierscope-middleware", self.c.version.get().map_or("5.5.5-10.11-MariaDB", String::as_str));
        self.reply(&my::handshake_v10(self.id, &salt, &version, my::STATUS_AUTOCOMMIT), 0);
        self.flush().await?;
        let (mut seq, payload) = self.read_packet(1 << 16).await?;
        let login = my::parse_login(&payload)?;
        let mut auth = login.auth.clone();
        if !login.plugin.is_empty() && login.plugin != my::NATIVE_PASSWORD {
            // ask for mysql_native_password
            self.reply(&my::auth_switch(my::NATIVE_PASSWORD, &salt), seq.wrapping_add(1));
            self.flush().await?;
            (seq, auth) = self.read_packet(1 << 16).await?;
        }
        let seq = seq.wrapping_add(1);
        if login.user != self.m.user || auth != my::scramble_native(&self.c.password, &salt) {
            let msg = format!("Access denied for user '{}' (the middleware accepts user '{}' with the backends' password)", login.user, self.m.user);
            self.reply(&my::err(my::ER_ACCESS_DENIED, &msg, "28000"), seq);
            self.flush().await?;
            return Ok(false);
        }
        if let Some(db) = login.database.as_deref().filter(|d| *d != self.m.database) {
            let e = self.bad_db(db);
            self.reply(&e, seq);
            self.flush().await?;
            return Ok(false);
        }
        self.reply(&my::ok(0, 0, my::STATUS_AUTOCOMMIT), seq);
        self.flush().await?;
        Ok(true)
    }

    fn bad_db(&self, name: &str) -> Vec<u8> {
        my::err(my::ER_BAD_DB, &format!("Unknown database '{name}' (this middleware serves '{}')", self.m.database), "42000")
    }

    fn use_db(&mut self, name: &str) {
        if name == self.m.database {
            self.reply(&my::ok(0, 0, self.status_flags()), 1);
        } else {
            self.m.count(|c| c.errors_to_clients += 1);
            let e = self.bad_db(name);
            self.reply(&e, 1);
        }
    }

    /// A write answered before every backend ran it is over: its transaction, if any, is the session's.
    async fn collect_last_write(&mut self) {
        if self.last_write.as_ref().is_some_and(|h| h.is_finished()) {
            if let Some(h) = self.last_write.take() {
                if let Ok(Some(txn)) = h.await {
                    self.txn = Some(txn);
                }
            }
        }
    }

    /// COM_RESET_CONNECTION (and the end): an open transaction is rolled back (its connections closed).
    async fn reset(&mut self) {
        if let Some(h) = self.last_write.take() {
            if let Ok(Some(txn)) = h.await {
                self.txn = Some(txn);
            }
        }
        if let Some(txn) = self.txn.take() {
            for (b, mut conn) in txn.conns {
                conn.close();
                self.c.release(b, conn);
            }
            // connections closed: their transaction is rolled back, on a replay too
            self.m.log_rollback();
            drop(txn.guard);
        }
    }

    async fn end(&mut self) {
        self.reset().await;
        let _ = self.wr.shutdown().await;
    }

    async fn query(&mut self, payload: Vec<u8>) -> SResult<()> {
        self.m.count(|c| c.units += 1);
        let text = String::from_utf8_lossy(&payload[1..]).into_owned();
        if let Some(cap) = USE.captures(&text) {
            self.use_db(&cap[1]);
            return Ok(());
        }
        if SET_NAMES.is_match(&text) {
            self.reply(&my::ok(0, 0, self.status_flags()), 1);
            return Ok(());
        }
        if SOCKET.is_match(&text) {
            let answer = my::text_result("@@socket", &[""], self.status_flags());
            self.out.extend_from_slice(&answer);
            return Ok(());
        }
        let kind = sql::kind_of(&text);
        let label = (kind == Kind::Read && self.txn.is_none() && self.m.tracks_labels()).then(|| self.m.label(&[&text]));
        self.route(Unit::Query(payload), &text, kind, label).await
    }

    /// Run a unit: inside a transaction on all its backends, else a read on one, a write on all.
    async fn route(&mut self, unit: Unit, text: &str, kind: Kind, label: Option<Arc<str>>) -> SResult<()> {
        let r = if self.txn.is_some() {
            self.m.count(|c| c.transaction_units += 1);
            self.write(&unit, text).await
        } else if kind == Kind::Read {
            self.read(&unit, label).await
        } else {
            self.write(&unit, text).await
        };
        match r {
            Err(Fail::NoBackend(e)) => {
                self.refuse(my::ER_UNKNOWN_ERROR, &e, "08S01");
                Ok(())
            }
            other => other,
        }
    }

    /// What to send each backend for `unit`; for a write (`macros_at`), between `SET timestamp`s
    /// when it calls time functions.
    fn outgoing(&self, unit: &Unit, text: &str, macros_at: Option<Micros>) -> Outgoing {
        let mut out = match unit {
            Unit::Query(p) => {
                Outgoing { query: my::packet(0, p), stmt: None, pre: Vec::new(), post: Vec::new(), passed: vec![true], seq: None, opens: false }
            }
            Unit::Execute(sql, body) => Outgoing {
                query: Vec::new(),
                stmt: Some((sql.clone(), body.clone())),
                pre: Vec::new(),
                post: Vec::new(),
                passed: vec![true],
                seq: None,
                opens: false,
            },
        };
        if let Some(at) = macros_at {
            let n = my::time_functions(text);
            if n > 0 {
                self.m.count(|c| c.macros_rewritten += n as u64);
                let set = format!("\x03SET timestamp = {}.{:06}", at.div_euclid(1_000_000), at.rem_euclid(1_000_000));
                out.pre = my::packet(0, set.as_bytes());
                out.post = my::packet(0, b"\x03SET timestamp = DEFAULT");
                out.passed = vec![false, true, false];
            }
        }
        out
    }

    async fn read(&mut self, unit: &Unit, label: Option<Arc<str>>) -> SResult<()> {
        let out = self.outgoing(unit, "", None);
        let (m, c) = (self.m.clone(), self.c.clone());
        loop {
            let (b, started, token) = m.choose_read(label.as_ref())?;
            let backend = &m.backends[b];
            backend.wait_for_writes(started).await;
            if !backend.enabled() {
                m.read_over(b, token); // disabled by the write it waited for: choose again
                continue;
            }
            let mut conn = match c.pools[b].acquire().await {
                Ok(conn) => conn,
                Err(err) => {
                    c.disable(b, &format!("read failed: {err}"));
                    m.count(|c| c.read_retries += 1);
                    m.read_over(b, token);
                    continue;
                }
            };
            let mut sink = Sink { held: Vec::new(), client: Some(&mut self.wr), saw: false, client_failed: false };
            let t0 = Instant::now();
            let mut x = execute(&mut conn, &out, &mut sink).await;
            let reused = conn.reused;
            c.release(b, conn);
            if !x.broken {
                m.read_done(b, t0.elapsed().as_secs_f64(), label.as_ref());
            }
            if x.broken && reused && !sink.saw {
                // an idle pooled connection may have gone stale: once more on a new one
                c.pools[b].drop_idle();
                sink.held.clear();
                if let Ok(mut conn) = c.pools[b].acquire().await {
                    x = execute(&mut conn, &out, &mut sink).await;
                    c.release(b, conn);
                }
            }
            let (saw, client_failed) = (sink.saw, sink.client_failed);
            if !x.broken && !sink.held.is_empty() {
                self.out.append(&mut sink.held);
            }
            m.read_over(b, token);
            {
                let mut st = m.state();
                st.b[b].reads += 1;
                st.counts.reads += 1;
            }
            if x.broken {
                c.disable(b, &format!("read failed: {}", x.error.as_deref().unwrap_or("None")));
                if saw {
                    return Err(Fail::End(x.error)); // part of the answer is out: the client connection cannot continue
                }
                m.count(|c| c.read_retries += 1);
                continue;
            }
            if !x.ok {
                m.count(|c| c.errors_to_clients += 1);
            }
            if client_failed {
                return Err(Fail::End(None));
            }
            return Ok(());
        }
    }

    /// A connection on every enabled backend with the write lock held (or the transaction's
    /// pinned connections), and whether they are the transaction's.
    async fn lease_for_write(&mut self) -> SResult<(Vec<(usize, MyConn)>, OwnedMutexGuard<()>, bool)> {
        // the previous write holds the write lock until every backend ran it: wait for it here (the
        // lock would wait as long), so a transaction it opened on a slower backend (status flags
        // that differed) becomes this session's instead of keeping the lock forever
        if let Some(h) = self.last_write.take() {
            if let Ok(Some(txn)) = h.await {
                self.txn = Some(txn);
            }
        }
        if let Some(txn) = self.txn.take() {
            return Ok((txn.conns, txn.guard, true));
        }
        let t0 = Instant::now();
        let guard = self.m.write_lock.clone().lock_owned().await;
        let waited = t0.elapsed().as_secs_f64();
        self.m.count(|c| c.write_lock_wait_s += waited);
        let targets = self.m.enabled();
        if targets.is_empty() {
            return Err(Fail::NoBackend("no database backend is enabled".into()));
        }
        let mut set = JoinSet::new();
        for &b in &targets {
            let c = self.c.clone();
            set.spawn(async move { (b, c.pools[b].acquire().await) });
        }
        let mut conns = Vec::new();
        while let Some(j) = set.join_next().await {
            match j {
                Ok((b, Ok(conn))) => conns.push((b, conn)),
                Ok((b, Err(err))) => self.c.disable(b, &format!("write failed: cannot get a connection: {err}")),
                Err(_) => {}
            }
        }
        if conns.is_empty() {
            return Err(Fail::NoBackend("no database backend could be reached for a write".into()));
        }
        conns.sort_by_key(|c| c.0);
        Ok((conns, guard, false))
    }

    async fn write(&mut self, unit: &Unit, text: &str) -> SResult<()> {
        let (conns, guard, pinned) = self.lease_for_write().await?;
        let mut out = self.outgoing(unit, text, Some(sql::now_micros()));
        // the recovery log: a number and the record, appended under the write lock (the log's
        // order is the units'); fsync'd before the client is answered when no transaction is open
        // (by `broadcast`, once the answer is known: the AUTO_INCREMENT value it took goes in the
        // record); fsync'd before the client is answered when no transaction is open
        let logging = self.m.recovery.clone().map(|log| {
            let seq = log.take_seq();
            out.seq = Some(seq);
            out.opens = recovery::my_opens_transaction(text);
            let command = match unit {
                Unit::Query(p) => p.clone(),
                Unit::Execute(sql, body) => recovery::my_execute_command(sql, body),
            };
            Logging { log, seq, pre: out.pre.clone(), post: out.post.clone(), command }
        });
        let out = Arc::new(out);
        self.m.count(|c| c.writes += 1);
        let (tx, rx) = oneshot::channel();
        self.m.inflight_add(1);
        let handle = tokio::spawn(broadcast(self.c.clone(), conns, guard, out, tx, logging));
        let Ok(answer) = rx.await else {
            return Err(Fail::End(Some("a write failed unexpectedly".into())));
        };
        if let Some(e) = answer.log_error {
            log(&e);
            return Err(Fail::End(Some(e)));
        }
        self.out.extend_from_slice(&answer.replies);
        if !answer.ok {
            self.m.count(|c| c.errors_to_clients += 1);
        }
        if !my::idle(answer.status) || pinned {
            self.txn = handle.await.ok().flatten(); // a transaction: its connections and the lock stay with it
        } else {
            self.last_write = Some(handle);
        }
        Ok(())
    }

    // --- prepared statements -------------------------------------------------------------------
    /// Prepare on one backend (chosen like a read; inside a transaction on its first connection)
    /// and answer with the session's own statement id.
    async fn stmt_prepare(&mut self, sql: Vec<u8>) -> SResult<()> {
        self.m.count(|c| c.named_statements += 1);
        let (m, c) = (self.m.clone(), self.c.clone());
        let prepared = if let Some(txn) = self.txn.as_mut() {
            let Some((_, conn)) = txn.conns.first_mut() else {
                return Err(Fail::End(Some("a transaction without connections".into())));
            };
            conn.prepare(&sql).await.map_err(|e| Fail::End(Some(format!("prepare failed: {e}"))))?
        } else {
            loop {
                let (b, _, token) = match m.choose_read(None) {
                    Ok(x) => x,
                    Err(e) => {
                        self.refuse(my::ER_UNKNOWN_ERROR, &e.0, "08S01");
                        return Ok(());
                    }
                };
                let mut conn = match c.pools[b].acquire().await {
                    Ok(conn) => conn,
                    Err(err) => {
                        m.read_over(b, token);
                        c.disable(b, &format!("prepare failed: {err}"));
                        continue;
                    }
                };
                let r = conn.prepare(&sql).await;
                if r.is_err() {
                    conn.close();
                }
                c.release(b, conn);
                m.read_over(b, token);
                match r {
                    Ok(p) => break p,
                    Err(err) => c.disable(b, &format!("prepare failed: {err}")),
                }
            }
        };
        let Some(_) = prepared.sid else {
            self.m.count(|c| c.errors_to_clients += 1);
            for (q, p) in &prepared.packets {
                my::packet_into(&mut self.out, *q, p);
            }
            return Ok(());
        };
        let cid = self.next_stmt;
        self.next_stmt = self.next_stmt.wrapping_add(1);
        let first = &prepared.packets[0].1;
        let params = my::u16_at(first, 7)?;
        let text = String::from_utf8_lossy(&sql).into_owned();
        let kind = sql::kind_of(&text);
        self.stmts.insert(cid, PStmt { sql: Arc::new(sql), text, params, kind, types: None, long_data: false });
        for (i, (q, p)) in prepared.packets.iter().enumerate() {
            if i == 0 {
                let mut ok = p.clone();
                ok[1..5].copy_from_slice(&cid.to_le_bytes());
                my::packet_into(&mut self.out, *q, &ok);
            } else {
                my::packet_into(&mut self.out, *q, p);
            }
        }
        Ok(())
    }

    async fn stmt_execute(&mut self, payload: &[u8]) -> SResult<()> {
        let cid = if payload.len() >= 10 { my::u32_at(payload, 1).ok() } else { None };
        let problem = match cid.and_then(|id| self.stmts.get(&id)) {
            None => {
                let id = cid.map_or("-1".to_string(), |i| i.to_string());
                Some((my::ER_UNKNOWN_STMT_HANDLER, format!("Unknown prepared statement handler ({id}) given to mysqld_stmt_execute"), "HY000"))
            }
            Some(_) if payload[5] != 0 => Some((my::ER_NOT_SUPPORTED_YET, CURSORS_UNSUPPORTED.to_string(), "42000")),
            Some(st) if st.long_data => Some((my::ER_NOT_SUPPORTED_YET, LONG_DATA_UNSUPPORTED.to_string(), "42000")),
            Some(_) => None,
        };
        if let Some((code, message, state)) = problem {
            self.refuse(code, &message, state);
            return Ok(());
        }
        let Some(st) = cid.and_then(|id| self.stmts.get_mut(&id)) else {
            return Ok(());
        };
        let mut body = payload[5..].to_vec(); // flags, iteration count, then the parameters
        if st.params > 0 {
            let n = st.params as usize;
            let at = 5 + n.div_ceil(8); // the new-params-bound flag
            if body.get(at) == Some(&1) {
                st.types = body.get(at + 1..(at + 1 + 2 * n).min(body.len())).map(<[u8]>::to_vec);
            } else if let Some(types) = &st.types {
                // this backend connection may not have seen the types: send them again
                if at < body.len() {
                    let mut b = body[..at].to_vec();
                    b.push(1);
                    b.extend_from_slice(types);
                    b.extend_from_slice(&body[at + 1..]);
                    body = b;
                }
            }
        }
        let (sql, text, kind) = (st.sql.clone(), st.text.clone(), st.kind);
        self.m.count(|c| c.units += 1);
        let label = (kind == Kind::Read && self.txn.is_none() && self.m.tracks_labels()).then(|| self.m.label(&[&text]));
        self.route(Unit::Execute(sql, body), &text, kind, label).await
    }

    /// COM_STMT_CLOSE and COM_STMT_SEND_LONG_DATA (no answer), COM_STMT_RESET (OK).
    fn stmt_other(&mut self, cmd: u8, payload: &[u8]) {
        let cid = if payload.len() >= 5 { my::u32_at(payload, 1).ok() } else { None };
        match cmd {
            my::COM_STMT_CLOSE => {
                if let Some(id) = cid {
                    self.stmts.remove(&id); // the backends keep it prepared for the next client of that text
                }
            }
            my::COM_STMT_SEND_LONG_DATA => {
                if let Some(st) = cid.and_then(|id| self.stmts.get_mut(&id)) {
                    st.long_data = true;
                }
            }
            _ => {
                if let Some(st) = cid.and_then(|id| self.stmts.get_mut(&id)) {
                    st.long_data = false;
                    let ok = my::ok(0, 0, self.status_flags());
                    self.reply(&ok, 1);
                } else {
                    let id = cid.map_or("-1".to_string(), |i| i.to_string());
                    self.refuse(
                        my::ER_UNKNOWN_STMT_HANDLER,
                        &format!("Unknown prepared statement handler ({id}) given to mysqld_stmt_reset"),
                        "HY000",
                    );
                }
            }
        }
    }
}

// --- the server ----------------------------------------------------------------------------------

/// Serve the MySQL protocol until SIGTERM/SIGINT (`tierscope-engine middleware --protocol mysql`).
pub async fn serve(m: Arc<Manager>, password: String, args: MiddlewareArgs, host: String, port: u16) -> Result<i32> {
    use tokio::signal::unix::{signal, SignalKind};
    let mut term = signal(SignalKind::terminate()).context("SIGTERM handler")?;
    let mut int = signal(SignalKind::interrupt()).context("SIGINT handler")?;
    let c = Arc::new(Cluster::new(m.clone(), &password, args.pool));
    if let Err(err) = c.check_backends(Duration::from_secs_f64(args.connect_timeout.max(0.0))).await {
        log(&err.0);
        return Ok(1);
    }
    if let Err(err) = c.recover().await {
        log(&err.0);
        return Ok(1);
    }
    let listener = match tokio::net::TcpListener::bind((host.as_str(), port)).await {
        Ok(l) => l,
        Err(err) => {
            log(&format!("cannot listen on {}: {err}", args.listen));
            return Ok(1);
        }
    };
    let threads = if args.threads == 1 { 1 } else { tokio::runtime::Handle::current().metrics().num_workers() };
    log(&format!(
        "listening on {} (mysql); backends {}; policy {}; wait {}; pool {}; runtime tokio ({threads} threads)",
        args.listen,
        args.backend.join(", "),
        m.policy.name(),
        args.wait,
        args.pool
    ));
    let accept = {
        let c = c.clone();
        tokio::spawn(async move {
            let mut ids: u32 = 0;
            loop {
                match listener.accept().await {
                    Ok((stream, _)) => {
                        let _ = stream.set_nodelay(true);
                        ids = ids.wrapping_add(1);
                        tokio::spawn(Session::new(c.clone(), stream, ids).run());
                    }
                    Err(err) => {
                        log(&format!("accept failed: {err}"));
                        tokio::time::sleep(Duration::from_millis(50)).await;
                    }
                }
            }
        })
    };
    let series = (args.series_interval > 0.0).then(|| {
        let m = m.clone();
        let every = Duration::from_secs_f64(args.series_interval);
        m.series.lock().unwrap_or_else(|e| e.into_inner()).interval_s = args.series_interval;
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(every);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
            loop {
                tick.tick().await;
                m.sample();
            }
        })
    });
    tokio::select! {
        _ = term.recv() => {}
        _ = int.recv() => {}
    }
    if let Some(s) = series {
        s.abort();
    }
    accept.abort();
    // a write answered with wait=first may still run on a slower backend
    let mut rx = m.inflight.subscribe();
    let _ = tokio::time::timeout(Duration::from_secs(10), rx.wait_for(|&n| n == 0)).await;
    for p in &c.pools {
        p.drop_idle();
    }
    let stats = c.stats();
    if let Some(path) = &args.stats {
        if let Err(err) = super::write_stats(path, &stats) {
            log(&format!("{err:#}"));
        }
    }
    let per: Vec<String> = stats["backends"].as_array().map(|a| a.iter().map(|b| b["reads"].to_string()).collect()).unwrap_or_default();
    let disabled: Vec<String> =
        stats["disabled"].as_array().map(|a| a.iter().filter_map(|d| d.as_str().map(String::from)).collect()).unwrap_or_default();
    log(&format!(
        "stopped: {} units, {} reads ({} per backend), {} writes, disabled: {}",
        stats["units"],
        stats["reads"],
        per.join(", "),
        stats["writes"],
        if disabled.is_empty() { "none".to_string() } else { pylist(&disabled) }
    ));
    Ok(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_first_auto_increment_value_of_an_answer_is_found() {
        let ok = |id: u64, status: u16| {
            let mut p = vec![0, 1];
            my::lenenc_into(&mut p, id);
            p.extend_from_slice(&status.to_le_bytes());
            p.extend_from_slice(&[0, 0]);
            p
        };
        let mut one = Vec::new();
        my::packet_into(&mut one, 1, &ok(300, my::STATUS_AUTOCOMMIT));
        assert_eq!(first_insert_id(&one), 300);
        // UPDATE ...; INSERT ...: the second result's
        let mut two = Vec::new();
        my::packet_into(&mut two, 1, &ok(0, my::STATUS_MORE_RESULTS));
        my::packet_into(&mut two, 2, &ok(12, 0));
        assert_eq!(first_insert_id(&two), 12);
        // SELECT (a row whose first byte is 0) then INSERT
        let mut rs = Vec::new();
        let payloads: Vec<Vec<u8>> = vec![
            vec![1],
            b"\x03def".to_vec(),
            my::eof(my::STATUS_MORE_RESULTS),
            vec![0, 7, 0, 0, 0, 0, 0, 0],
            my::eof(my::STATUS_MORE_RESULTS),
            ok(5, 0),
        ];
        for (i, p) in payloads.iter().enumerate() {
            my::packet_into(&mut rs, i as u8 + 1, p);
        }
        assert_eq!(first_insert_id(&rs), 5);
        let mut none = Vec::new();
        my::packet_into(&mut none, 1, &ok(0, 0));
        my::packet_into(&mut none, 2, &ok(8, 0)); // not a further result: the first said none follow
        assert_eq!(first_insert_id(&none), 0);
        assert_eq!(first_insert_id(&my::packet(1, &my::err(1062, "Duplicate entry", "23000"))), 0);
        assert_eq!(first_insert_id(&[]), 0);
    }

    #[test]
    fn the_statements_answered_here_are_recognised() {
        assert_eq!(&USE.captures("use `mwtest`;").unwrap()[1], "mwtest");
        assert!(USE.captures("USE a; DROP TABLE t").is_none());
        assert!(SET_NAMES.is_match("SET NAMES 'utf8mb4' COLLATE 'utf8mb4_general_ci'"));
        assert!(SET_NAMES.is_match("set names utf8mb4"));
        assert!(!SET_NAMES.is_match("SET NAMES latin1"));
        assert!(SOCKET.is_match(" SELECT @@socket ;"));
        assert!(!SOCKET.is_match("SELECT @@socket, 1"));
    }
}
