//! Client sessions: the PostgreSQL front end of the middleware and the routing of units of work
//! (a port of `python/tierscope/middleware/server.py`).
//!
//! A unit of work is one simple Query, or the extended-protocol messages up to and including Sync.
//! Named prepared statements are kept by the proxy (per client session) and run on the backends as
//! the unnamed statement, so any pooled backend connection can serve any unit.

use std::collections::HashMap;
use std::sync::{Arc, LazyLock};
use std::time::Instant;

use futures_util::future::{FutureExt, Shared};
use futures_util::stream::{FuturesUnordered, StreamExt};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::TcpStream;
use tokio::sync::{oneshot, OwnedMutexGuard};
use tokio::task::{JoinHandle, JoinSet};

use super::pool::{Conn, RECV_SIZE, STMTS_MAX};
use super::recovery;
use super::replies::{Mode, ReplyPlan};
use super::sql::{self, Kind, Micros};
use super::wire::{self, Message, Parse, ProtocolError};
use super::{log, pylist, scram, Manager, NoBackend};

/// Whether a Query's body may be a DEALLOCATE (its text is decoded only then): the first
/// character after whitespace is not ASCII (Unicode whitespace may come first), or the text starts
/// with the word, as `Session::deallocate` checks after `trim_start`.
fn may_deallocate(body: &[u8]) -> bool {
    let Some(start) = body.iter().position(|&c| !matches!(c, b'\t' | b'\n' | 0x0B | 0x0C | b'\r' | b' ')) else {
        return false;
    };
    body[start] >= 0x80 || body.get(start..start + 10).is_some_and(|w| w.eq_ignore_ascii_case(b"DEALLOCATE"))
}

static DEALLOCATE: LazyLock<regex::Regex> =
    LazyLock::new(|| regex::Regex::new(r#"(?i)^\s*DEALLOCATE\s+(?:PREPARE\s+)?(ALL|"?[A-Za-z0-9_$]+"?)\s*;?\s*$"#).expect("valid regex"));

/// Why a unit could not be served: no backend (the client gets an error and the session goes on),
/// or the session must end (with a reason to log, if any).
enum Fail {
    NoBackend(String),
    End(Option<String>),
}

impl From<NoBackend> for Fail {
    fn from(e: NoBackend) -> Fail {
        Fail::NoBackend(e.0)
    }
}

impl From<ProtocolError> for Fail {
    fn from(e: ProtocolError) -> Fail {
        Fail::End(Some(e.0))
    }
}

type SResult<T> = Result<T, Fail>;

/// One step of the reply plan: a message sent (kind, mode, Describe target) or answered here.
enum Step {
    Sent(u8, Mode, u8),
    Here(Vec<u8>),
}

/// What to send a backend for one unit and what to expect back.
pub struct Outgoing {
    data: Vec<u8>,
    plan: Vec<Step>,
    /// the Parse the backend's unnamed statement holds afterwards
    unnamed: Option<Arc<Parse>>,
    /// it may drop statements the proxy prepared on the connection (DISCARD, DEALLOCATE)
    resets: bool,
}

/// Whether a statement text may make statements prepared before it wrong or gone: DDL, session
/// settings (a search_path), DISCARD and DEALLOCATE (the statements' first words).
fn resets_statements(text: &str) -> bool {
    const RESETS: [&str; 7] = ["CREATE", "ALTER", "DROP", "SET", "RESET", "DISCARD", "DEALLOCATE"];
    let toks = sql::tokens(text);
    sql::statements(&toks).iter().any(|st| RESETS.contains(&st[0].text.as_str()))
}

impl AsRef<[u8]> for Outgoing {
    fn as_ref(&self) -> &[u8] {
        &self.data
    }
}

/// Make a write unit record position `seq` in each backend's recovery table first, hidden from the
/// client, so that the position commits or rolls back with the unit's own statements: a Parse,
/// Bind, Execute and Close before the unit's messages (extended protocol), or `UPDATE ...;` before
/// a simple Query's text (its CommandComplete hidden). False (no position recorded) for a unit
/// running a statement PostgreSQL refuses in a transaction block, or an empty Query.
fn with_position(out: &mut Outgoing, seq: u64) -> bool {
    let msgs = recovery::messages(&out.data);
    let Some(&(first, _, ref body)) = msgs.first() else {
        return false;
    };
    for (k, _, b) in &msgs {
        let text = match *k {
            wire::QUERY => wire::query_text(&out.data[b.clone()]).ok(),
            wire::PARSE => Parse::decode(&out.data[b.clone()]).ok().map(|p| p.sql),
            _ => None,
        };
        if text.is_some_and(|t| recovery::outside_transactions(&t)) {
            return false;
        }
    }
    let update = recovery::position_sql(seq);
    let Some(step) = out.plan.iter().position(|s| matches!(s, Step::Sent(..))) else {
        return false;
    };
    if first == wire::QUERY && msgs.len() == 1 {
        let Ok(text) = wire::query_text(&out.data[body.clone()]) else {
            return false;
        };
        if sql::tokens(&text).is_empty() {
            return false; // an empty query is answered EmptyQueryResponse, not a CommandComplete
        }
        out.data = wire::query(&format!("{update};\n{text}"));
        out.plan[step] = Step::Sent(wire::QUERY, Mode::PassButFirst, 0);
        return true;
    }
    if msgs.iter().any(|m| m.0 == wire::QUERY) {
        return false; // (a Query ending a flushed unit: not recorded)
    }
    const PORTAL: &str = "_tierscope_recovery";
    let mut pre = Vec::with_capacity(update.len() + 64);
    let mut body = Vec::new();
    body.push(0);
    body.extend_from_slice(update.as_bytes());
    body.extend_from_slice(&[0, 0, 0]);
    wire::frame_into(&mut pre, wire::PARSE, &body);
    body.clear();
    body.extend_from_slice(PORTAL.as_bytes());
    body.extend_from_slice(&[0, 0, 0, 0, 0, 0, 0, 0]);
    wire::frame_into(&mut pre, wire::BIND, &body);
    body.clear();
    body.extend_from_slice(PORTAL.as_bytes());
    body.extend_from_slice(&[0, 0, 0, 0, 0]);
    wire::frame_into(&mut pre, wire::EXECUTE, &body);
    body.clear();
    body.push(b'P');
    body.extend_from_slice(PORTAL.as_bytes());
    body.push(0);
    wire::frame_into(&mut pre, wire::CLOSE, &body);
    pre.extend_from_slice(&out.data);
    out.data = pre;
    let hidden = [
        Step::Sent(wire::PARSE, Mode::Hide, 0),
        Step::Sent(wire::BIND, Mode::Hide, 0),
        Step::Sent(wire::EXECUTE, Mode::Hide, 0),
        Step::Sent(wire::CLOSE, Mode::Hide, b'P'),
    ];
    out.plan.splice(step..step, hidden);
    true
}

impl Outgoing {
    fn reply_plan(&self, p: &mut ReplyPlan) {
        for step in &self.plan {
            match step {
                Step::Sent(k, mode, target) => p.sent(*k, *mode, *target),
                Step::Here(answer) => p.answered_here(answer.clone()),
            }
        }
    }
}

/// What one backend answered to a unit (the replies themselves are in the sink).
#[derive(Clone, Default)]
struct Exec {
    ok: bool,
    error: Option<String>,
    tags: Vec<String>,
    status: u8,
    broken: bool,
}

/// One backend's complete answer to a unit of a write.
struct Res {
    b: usize,
    conn: Option<Conn>,
    replies: Vec<u8>,
    x: Exec,
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
    fn collect() -> Sink<'static> {
        Sink { held: Vec::new(), client: None, saw: false, client_failed: false }
    }

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

/// Send a unit (or the part of it up to a Flush, continuing `plan`) on one connection and read the
/// answers due; the answers the client must see go to `sink`.
async fn execute(conn: &mut Conn, out: &Outgoing, sink: &mut Sink<'_>, plan: &mut ReplyPlan) -> Exec {
    let mut x = Exec { ok: true, status: b'I', ..Default::default() };
    plan.due_now(&mut sink.held);
    let result: Result<(), String> = async {
        conn.stream.write_all(&out.data).await.map_err(|e| e.to_string())?;
        let mut after = Vec::new();
        while !plan.done() {
            let avail = conn.buf.len() - conn.pos;
            if avail >= 5 {
                let n = wire::header_length(&conn.buf, conn.pos).map_err(|e| e.0)?;
                if avail >= 5 + n {
                    let kind = conn.buf[conn.pos];
                    let passed = plan.reply(kind, &mut after).map_err(|e| e.0)?;
                    let msg = &conn.buf[conn.pos..conn.pos + 5 + n];
                    match kind {
                        wire::ERROR => {
                            x.ok = false;
                            if x.error.is_none() {
                                x.error = Some(wire::error_text(&msg[5..]));
                            }
                        }
                        wire::COMMAND_COMPLETE => x.tags.push(wire::cstring(&msg[5..], 0).map(|t| t.0).unwrap_or_default()),
                        wire::READY => {
                            x.status = msg.get(5).copied().unwrap_or(b'I');
                            conn.status = x.status;
                        }
                        _ => {}
                    }
                    if passed {
                        sink.held.extend_from_slice(msg);
                    }
                    if !after.is_empty() {
                        sink.held.append(&mut after);
                    }
                    conn.pos += 5 + n;
                    continue;
                }
            }
            sink.maybe_flush().await;
            conn.more().await.map_err(|e| format!("{e}"))?;
        }
        Ok(())
    }
    .await;
    if let Err(err) = result {
        x.ok = false;
        x.broken = true;
        x.error = Some(format!("connection failed: {err}"));
        conn.close();
    }
    x
}

/// One backend's part of a step: backend, connection (None if its task failed), plan, result, replies.
type StepResult = (usize, Option<Conn>, ReplyPlan, Exec, Vec<u8>);

/// Run `out` on every leased connection at once (each with its own plan); the results in lease order.
async fn run_all(lease: Vec<(usize, Conn, ReplyPlan)>, out: Arc<Outgoing>) -> Vec<StepResult> {
    let mut set = JoinSet::new();
    let n = lease.len();
    let idx: Vec<usize> = lease.iter().map(|l| l.0).collect();
    for (pos, (b, mut conn, mut plan)) in lease.into_iter().enumerate() {
        let out = out.clone();
        set.spawn(async move {
            let mut sink = Sink::collect();
            let x = execute(&mut conn, &out, &mut sink, &mut plan).await;
            if out.resets {
                conn.stmts.clear();
            }
            (pos, b, conn, plan, x, sink.held)
        });
    }
    let mut res: Vec<Option<StepResult>> = (0..n).map(|_| None).collect();
    while let Some(j) = set.join_next().await {
        if let Ok((pos, b, conn, plan, x, held)) = j {
            res[pos] = Some((b, Some(conn), plan, x, held));
        }
    }
    res.into_iter().enumerate().map(|(pos, r)| r.unwrap_or_else(|| (idx[pos], None, ReplyPlan::default(), panicked(), Vec::new()))).collect()
}

fn panicked() -> Exec {
    Exec { ok: false, error: Some("the task running the unit failed".into()), status: b'I', broken: true, ..Default::default() }
}

/// For a read that executes a named statement (Bind, Describe portal, Execute, Sync, as libpq's
/// PQexecPrepared sends): the unit for `conn` with the statement prepared there under a name of
/// the proxy's (prepared first when the connection does not have it yet), so the backend does
/// not parse and plan it again for every execution. None: the unit is of another shape.
fn prepared_variant(m: &Manager, statements: &HashMap<String, Arc<Parse>>, unit: &[Message], conn: &mut Conn) -> Option<(Outgoing, Option<String>)> {
    let epoch = m.statement_epoch.load(std::sync::atomic::Ordering::Acquire);
    if conn.stmts_epoch != epoch {
        // DDL or settings ran since these were prepared: prepare again (the old ones stay unused)
        conn.stmts.clear();
        conn.stmts_epoch = epoch;
    }
    let mut data = Vec::with_capacity(unit.iter().map(|m| m.body.len() + 5).sum::<usize>() + 64);
    let mut plan = Vec::with_capacity(unit.len() + 1);
    let mut added = None;
    let mut bound = false;
    for msg in unit {
        match msg.kind {
            wire::BIND if !bound => {
                bound = true;
                let b = wire::Bind::decode(&msg.body).ok()?;
                if b.statement.is_empty() {
                    return None;
                }
                let p = statements.get(&b.statement)?;
                let name = match conn.stmts.get(&p.sql) {
                    Some((types, name)) if *types == p.types => name.clone(),
                    _ => {
                        if conn.stmts.len() >= STMTS_MAX {
                            return None;
                        }
                        let name = conn.next_statement_name();
                        p.encode_as(&name, None, &mut data);
                        plan.push(Step::Sent(wire::PARSE, Mode::Hide, 0));
                        conn.stmts.insert(p.sql.clone(), (p.types.clone(), name.clone()));
                        added = Some(p.sql.clone());
                        name
                    }
                };
                b.encode_for(&name, &mut data);
                plan.push(Step::Sent(wire::BIND, Mode::Pass, 0));
            }
            wire::DESCRIBE => {
                if msg.body.first() != Some(&b'P') {
                    return None;
                }
                msg.encode_into(&mut data);
                plan.push(Step::Sent(wire::DESCRIBE, Mode::Pass, b'P'));
            }
            wire::EXECUTE | wire::SYNC => {
                msg.encode_into(&mut data);
                plan.push(Step::Sent(msg.kind, Mode::Pass, 0));
            }
            _ => {
                if let Some(sql) = added {
                    conn.stmts.remove(&sql);
                }
                return None;
            }
        }
    }
    if !bound || unit.last().map(|m| m.kind) != Some(wire::SYNC) {
        if let Some(sql) = added {
            conn.stmts.remove(&sql);
        }
        return None;
    }
    Some((Outgoing { data, plan, unnamed: None, resets: false }, added))
}

/// An explicit transaction: its connections (one per backend still in it) and the write lock.
pub struct Txn {
    lease: Vec<(usize, Conn)>,
    guard: OwnedMutexGuard<()>,
}

struct Lease {
    conns: Vec<(usize, Conn)>,
    guard: OwnedMutexGuard<()>,
    pinned: bool,
}

/// The answer a write unit gives the client.
struct Answer {
    replies: Vec<u8>,
    ok: bool,
    status: u8,
}

/// A unit of work under way across several client flushes (pipeline mode).
struct OpenUnit {
    slots: Vec<OpenSlot>,
    guard: OwnedMutexGuard<()>,
    /// its number in the recovery log, whether its position is recorded, its bytes so far
    seq: Option<(u64, bool)>,
    logged: Vec<u8>,
    macros_at: Micros,
    slot: Option<Arc<Parse>>,
    answering: Option<usize>,
}

struct OpenSlot {
    b: usize,
    conn: Option<Conn>,
    plan: ReplyPlan,
    acc: Exec,
}

pub struct Session {
    m: Arc<Manager>,
    id: u32,
    rd: OwnedReadHalf,
    wr: OwnedWriteHalf,
    inbuf: Vec<u8>,
    inpos: usize,
    out: Vec<u8>,
    statements: HashMap<String, Arc<Parse>>,
    unnamed: Option<Arc<Parse>>,
    /// pinned connections of an open transaction, the lock held
    txn: Option<Txn>,
    last_write: Option<JoinHandle<Option<Txn>>>,
    open: Option<OpenUnit>,
}

fn ptr_eq(a: &Option<Arc<Parse>>, b: &Arc<Parse>) -> bool {
    a.as_ref().is_some_and(|a| Arc::ptr_eq(a, b))
}

/// The statement's text with its macros rewritten (None: unchanged), counting the replacements.
fn macro_text(p: &Parse, macros_at: Option<Micros>, rewritten: &mut usize) -> Option<String> {
    let (new, n) = sql::rewrite_macros(&p.sql, macros_at?);
    *rewritten += n;
    new
}

/// Send `p` as the unnamed statement unless the backend's unnamed statement already is `p`.
struct Loader<'a> {
    slot: Option<Arc<Parse>>,
    macros_at: Option<Micros>,
    rewritten: &'a mut usize,
    /// a statement run on the write path may invalidate prepared statements
    resets: bool,
}

impl Loader<'_> {
    fn load(&mut self, p: Option<Arc<Parse>>, data: &mut Vec<u8>, plan: &mut Vec<Step>) {
        if let Some(p) = p {
            self.resets = self.resets || (self.macros_at.is_some() && resets_statements(&p.sql));
            if !ptr_eq(&self.slot, &p) {
                let new = macro_text(&p, self.macros_at, self.rewritten);
                p.encode_as("", new.as_deref(), data);
                plan.push(Step::Sent(wire::PARSE, Mode::Hide, 0));
                self.slot = Some(p);
            }
        }
    }
}

impl Session {
    pub fn new(m: Arc<Manager>, stream: TcpStream, id: u32) -> Session {
        let (rd, wr) = stream.into_split();
        Session {
            m,
            id,
            rd,
            wr,
            inbuf: Vec::with_capacity(8192),
            inpos: 0,
            out: Vec::with_capacity(8192),
            statements: HashMap::new(),
            unnamed: None,
            txn: None,
            last_write: None,
            open: None,
        }
    }

    // --- front end -----------------------------------------------------------------------------
    pub async fn run(mut self) {
        self.m.count(|c| c.sessions += 1);
        match self.serve().await {
            Ok(()) | Err(Fail::End(None)) | Err(Fail::NoBackend(_)) => {}
            Err(Fail::End(Some(why))) => log(&format!("session {}: {why}", self.id)),
        }
        self.end().await;
    }

    async fn serve(&mut self) -> SResult<()> {
        if !self.startup().await? {
            return Ok(());
        }
        let mut unit: Vec<Message> = Vec::new();
        loop {
            let msg = self.next_message().await?;
            match msg.kind {
                wire::TERMINATE => return Ok(()),
                wire::PARSE | wire::BIND | wire::DESCRIBE | wire::EXECUTE | wire::CLOSE => {
                    unit.push(msg); // nothing to answer yet: the unit goes on
                    continue;
                }
                wire::QUERY if self.open.is_none() => self.dispatch(vec![msg]).await?,
                wire::QUERY => {
                    unit.push(msg);
                    self.open_step(std::mem::take(&mut unit), true).await?;
                }
                wire::SYNC => {
                    unit.push(msg);
                    if self.open.is_some() {
                        self.open_step(std::mem::take(&mut unit), true).await?;
                    } else {
                        self.dispatch(std::mem::take(&mut unit)).await?;
                    }
                }
                wire::FLUSH if self.open.is_none() && unit.is_empty() => {} // nothing is waiting to be flushed
                wire::FLUSH => {
                    unit.push(msg);
                    if self.open.is_none() {
                        match self.open_begin().await {
                            Ok(()) => {}
                            Err(Fail::NoBackend(e)) => {
                                self.out.extend_from_slice(&wire::error(&e, "08006", "ERROR"));
                                unit.clear();
                                self.flush().await?;
                                continue;
                            }
                            Err(e) => return Err(e),
                        }
                    }
                    self.open_step(std::mem::take(&mut unit), false).await?;
                }
                k => {
                    self.out.extend_from_slice(&wire::error(
                        &format!("message type b'{}' is not supported by the middleware", k as char),
                        "0A000",
                        "ERROR",
                    ));
                    self.out.extend_from_slice(&wire::ready(self.status()));
                }
            }
            self.flush().await?;
        }
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

    async fn next_message(&mut self) -> SResult<Message> {
        self.fill(5).await?;
        let n = wire::header_length(&self.inbuf, self.inpos)?;
        self.fill(5 + n).await?;
        let p = self.inpos;
        let msg = Message { kind: self.inbuf[p], body: self.inbuf[p + 5..p + 5 + n].to_vec() };
        self.inpos += 5 + n;
        Ok(msg)
    }

    async fn startup(&mut self) -> SResult<bool> {
        let params = loop {
            self.fill(4).await?;
            let p = self.inpos;
            let n = u32::from_be_bytes([self.inbuf[p], self.inbuf[p + 1], self.inbuf[p + 2], self.inbuf[p + 3]]) as usize;
            if !(8..=10000).contains(&n) {
                return Err(Fail::End(Some(format!("bad startup packet length {n}"))));
            }
            self.fill(n).await?;
            let (code, params) = wire::parse_startup(&self.inbuf[p + 4..p + n])?;
            self.inpos += n;
            if code == wire::SSL_REQUEST || code == wire::GSSENC_REQUEST {
                self.wr.write_all(b"N").await.map_err(|_| Fail::End(None))?;
                continue;
            }
            if code == wire::CANCEL_REQUEST {
                return Ok(false); // not forwarded: the request runs to its end
            }
            if code != wire::PROTOCOL_V3 {
                let e = wire::error(&format!("unsupported protocol {}.{}", code >> 16, code & 0xFFFF), "0A000", "FATAL");
                let _ = self.wr.write_all(&e).await;
                return Ok(false);
            }
            break params;
        };
        let user = params.get("user").cloned().unwrap_or_default();
        if !self.authenticate(&user).await? {
            let msg = format!("password authentication failed for user \"{user}\"");
            let _ = self.wr.write_all(&wire::error(&msg, "28P01", "FATAL")).await;
            return Ok(false);
        }
        let db = params.get("database").filter(|d| !d.is_empty()).or_else(|| params.get("user")).cloned().unwrap_or_default();
        if db != self.m.database {
            let msg = format!("database \"{db}\" does not exist (this middleware serves \"{}\")", self.m.database);
            let _ = self.wr.write_all(&wire::error(&msg, "3D000", "FATAL")).await;
            return Ok(false);
        }
        self.out.extend_from_slice(&wire::auth_ok());
        for (k, v) in self.m.parameters.get().map(Vec::as_slice).unwrap_or(&[]) {
            self.out.extend_from_slice(&wire::parameter_status(k, v));
        }
        self.out.extend_from_slice(&wire::backend_key(self.id, rand::random::<u32>() >> 1));
        self.out.extend_from_slice(&wire::ready(b'I'));
        self.flush().await?;
        Ok(true)
    }

    /// SCRAM-SHA-256 with the lab's user and password (the backends'): true when the client
    /// proved it knows them (AuthenticationSASLFinal is then queued in `out`).
    async fn authenticate(&mut self, user: &str) -> SResult<bool> {
        let m = self.m.clone();
        let mut server = scram::Server::new(&m.verifier);
        self.wr.write_all(&wire::auth_request(scram::SASL, b"SCRAM-SHA-256\0\0")).await.map_err(|_| Fail::End(None))?;
        let Some(first) = self.sasl_response().await? else { return Ok(false) };
        let Ok((mechanism, first)) = wire::parse_sasl_initial(&first) else { return Ok(false) };
        if mechanism != scram::MECHANISM {
            return Ok(false);
        }
        let Ok(server_first) = server.first(&first) else { return Ok(false) };
        self.wr.write_all(&wire::auth_request(scram::SASL_CONTINUE, &server_first)).await.map_err(|_| Fail::End(None))?;
        let Some(fin) = self.sasl_response().await? else { return Ok(false) };
        let proved = match server.finish(&fin) {
            Ok(server_final) if user == m.user => server_final,
            _ => return Ok(false), // the user is checked after the exchange: the answer does not say which was wrong
        };
        self.out.extend_from_slice(&wire::auth_request(scram::SASL_FINAL, &proved));
        Ok(true)
    }

    /// The body of the client's next SASL message (type p, at most 10,000 bytes); None for anything else.
    async fn sasl_response(&mut self) -> SResult<Option<Vec<u8>>> {
        self.fill(5).await?;
        let p = self.inpos;
        let n = u32::from_be_bytes([self.inbuf[p + 1], self.inbuf[p + 2], self.inbuf[p + 3], self.inbuf[p + 4]]) as usize;
        if self.inbuf[p] != wire::PASSWORD || !(4..=10000).contains(&n) {
            return Ok(None);
        }
        self.fill(1 + n).await?;
        let body = self.inbuf[p + 5..p + 1 + n].to_vec();
        self.inpos += 1 + n;
        Ok(Some(body))
    }

    fn status(&self) -> u8 {
        if self.txn.is_some() {
            b'T'
        } else {
            b'I'
        }
    }

    async fn end(&mut self) {
        if let Some(h) = self.last_write.take() {
            if let Ok(Some(txn)) = h.await {
                self.txn = Some(txn);
            }
        }
        if let Some(ou) = self.open.take() {
            // the client left in the middle of a flushed unit
            let idx: Vec<usize> = ou.slots.iter().map(|s| s.b).collect();
            self.abandon_open(ou);
            self.writes_over(&idx);
        } else if let Some(txn) = self.txn.take() {
            // the client left inside a transaction: roll it back by closing
            for (b, mut conn) in txn.lease {
                conn.close();
                self.m.backends[b].pool.release(conn);
            }
            self.m.log_rollback();
            drop(txn.guard);
        }
        let _ = self.wr.shutdown().await;
    }

    // --- units of work -------------------------------------------------------------------------
    async fn dispatch(&mut self, unit: Vec<Message>) -> SResult<()> {
        if self.last_write.as_ref().is_some_and(|h| h.is_finished()) {
            if let Some(h) = self.last_write.take() {
                if let Ok(Some(txn)) = h.await {
                    self.txn = Some(txn);
                }
            }
        }
        self.m.count(|c| c.units += 1);
        if unit[0].kind == wire::QUERY && may_deallocate(&unit[0].body) && self.deallocate(&wire::query_text(&unit[0].body)?) {
            return Ok(());
        }
        if self.local_only(&unit)? {
            return Ok(());
        }
        // labels only for a read outside a transaction (decided in the same pass as the kind)
        let want_label = self.txn.is_none() && self.m.tracks_labels();
        let (kind, label) = self.unit_kind_label(&unit, want_label)?;
        if kind == Kind::Copy {
            self.m.count(|c| c.errors_to_clients += 1);
            self.out.extend_from_slice(&wire::error(
                "COPY is not supported by the middleware (run it on every database server directly)",
                "0A000",
                "ERROR",
            ));
            self.out.extend_from_slice(&wire::ready(self.status()));
            return Ok(());
        }
        let r = if self.txn.is_some() {
            // inside a transaction every unit runs on all its backends
            self.m.count(|c| c.transaction_units += 1);
            self.write(&unit).await
        } else if kind == Kind::Read {
            self.read(&unit, label).await
        } else {
            self.write(&unit).await
        };
        match r {
            Err(Fail::NoBackend(e)) => {
                self.m.count(|c| c.errors_to_clients += 1);
                self.out.extend_from_slice(&wire::error(&e, "08006", "ERROR"));
                self.out.extend_from_slice(&wire::ready(self.status()));
                Ok(())
            }
            other => other,
        }
    }

    /// A unit that only prepares or closes named statements (PQsendPrepare) is answered here: the
    /// proxy keeps named statements itself, no backend is involved.
    fn local_only(&mut self, unit: &[Message]) -> SResult<bool> {
        enum What {
            Prepare(Arc<Parse>),
            Close(String),
        }
        let mut answers = Vec::new();
        for msg in unit {
            match msg.kind {
                wire::PARSE => {
                    let p = Parse::decode(&msg.body)?;
                    if p.name.is_empty() {
                        return Ok(false);
                    }
                    answers.push(What::Prepare(Arc::new(p)));
                }
                wire::CLOSE => {
                    let t = wire::Target::decode(&msg.body)?;
                    if t.what != b'S' || t.name.is_empty() {
                        return Ok(false);
                    }
                    answers.push(What::Close(t.name));
                }
                wire::SYNC | wire::FLUSH => {}
                _ => return Ok(false),
            }
        }
        for a in answers {
            match a {
                What::Prepare(p) => {
                    self.statements.insert(p.name.clone(), p);
                    self.m.count(|c| c.named_statements += 1);
                    self.out.extend_from_slice(&wire::frame(wire::PARSE_COMPLETE, b""));
                }
                What::Close(name) => {
                    self.statements.remove(&name);
                    self.out.extend_from_slice(&wire::frame(wire::CLOSE_COMPLETE, b""));
                }
            }
        }
        self.out.extend_from_slice(&wire::ready(self.status()));
        Ok(true)
    }

    /// DEALLOCATE of a statement the proxy keeps is answered here.
    fn deallocate(&mut self, text: &str) -> bool {
        let t = text.trim_start().as_bytes();
        if t.len() < 10 || !t[..10].eq_ignore_ascii_case(b"DEALLOCATE") {
            return false; // (the regex's own start, checked cheaply)
        }
        let Some(c) = DEALLOCATE.captures(text) else {
            return false;
        };
        let name = c[1].trim_matches('"').to_string();
        let tag = if name.eq_ignore_ascii_case("ALL") {
            self.statements.clear();
            "DEALLOCATE ALL"
        } else {
            if self.statements.remove(&name).is_none() {
                self.out.extend_from_slice(&wire::error(&format!("prepared statement \"{name}\" does not exist"), "26000", "ERROR"));
                self.out.extend_from_slice(&wire::ready(self.status()));
                return true;
            }
            "DEALLOCATE"
        };
        self.out.extend_from_slice(&wire::command_complete(tag));
        self.out.extend_from_slice(&wire::ready(self.status()));
        true
    }

    /// What a unit runs, from one pass over its messages: Copy if any SQL it runs is COPY, else
    /// Write if any is a write, else Read (statements named in Bind count too); with `want_label`,
    /// the label of a Read unit as well (the labels of the SQL it runs, statements named in Bind
    /// included, as the Python middleware's `texts`; None when it runs none).
    fn unit_kind_label(&self, unit: &[Message], want_label: bool) -> SResult<(Kind, Option<Arc<str>>)> {
        /// a statement's text: decoded from a Query, or held by a Parse
        enum Text {
            Query(String),
            Stmt(Arc<Parse>),
        }
        let mut kind = Kind::Read;
        let mut texts: Vec<Text> = Vec::new();
        let mut unnamed = self.unnamed.clone();
        let mut add = |k: Kind, t: Text| {
            kind = match (kind, k) {
                (Kind::Copy, _) | (_, Kind::Copy) => Kind::Copy,
                (Kind::Write, _) | (_, Kind::Write) => Kind::Write,
                _ => Kind::Read,
            };
            if want_label {
                texts.push(t);
            }
        };
        for msg in unit {
            match msg.kind {
                wire::QUERY => {
                    let text = wire::query_text(&msg.body)?;
                    add(sql::kind_of(&text), Text::Query(text));
                }
                wire::PARSE => {
                    let p = Arc::new(Parse::decode(&msg.body)?);
                    if p.name.is_empty() {
                        unnamed = Some(p.clone());
                    }
                    add(p.kind(), Text::Stmt(p));
                }
                wire::BIND => {
                    let b = wire::Bind::decode(&msg.body)?;
                    let p = if b.statement.is_empty() { unnamed.as_ref() } else { self.statements.get(&b.statement) };
                    if let Some(p) = p {
                        add(p.kind(), Text::Stmt(p.clone())); // classified once per statement object
                    }
                }
                _ => {}
            }
        }
        if kind != Kind::Read || texts.is_empty() {
            return Ok((kind, None));
        }
        let refs: Vec<&str> = texts
            .iter()
            .map(|t| match t {
                Text::Query(s) => s.as_str(),
                Text::Stmt(p) => p.sql.as_str(),
            })
            .collect();
        Ok((kind, Some(self.m.label(&refs))))
    }

    /// The bytes for a backend connection and the reply plan (the same for every backend). `slot`
    /// is the Parse the backend's unnamed statement holds before (None: unknown).
    fn outgoing(&mut self, unit: &[Message], macros_at: Option<Micros>, slot: Option<Arc<Parse>>) -> SResult<Outgoing> {
        let mut data = Vec::with_capacity(unit.iter().map(|m| m.body.len() + 5).sum::<usize>() + 64);
        let mut plan = Vec::with_capacity(unit.len() + 1);
        let mut rewritten = 0usize;
        let mut named = 0u64;
        let mut resets = false;
        let mut ld = Loader { slot, macros_at, rewritten: &mut rewritten, resets: false };
        for msg in unit {
            match msg.kind {
                wire::QUERY => {
                    resets = resets || (macros_at.is_some() && resets_statements(&String::from_utf8_lossy(&msg.body)));
                    match macros_at {
                        None => msg.encode_into(&mut data),
                        Some(at) => {
                            let (new, n) = sql::rewrite_macros(&wire::query_text(&msg.body)?, at);
                            *ld.rewritten += n;
                            match new {
                                Some(q) => data.extend_from_slice(&wire::query(&q)),
                                None => msg.encode_into(&mut data),
                            }
                        }
                    }
                    plan.push(Step::Sent(wire::QUERY, Mode::Pass, 0));
                }
                wire::PARSE => {
                    let p = Arc::new(Parse::decode(&msg.body)?);
                    if !p.name.is_empty() {
                        self.statements.insert(p.name.clone(), p);
                        named += 1;
                        plan.push(Step::Here(wire::frame(wire::PARSE_COMPLETE, b"")));
                    } else {
                        resets = resets || (macros_at.is_some() && resets_statements(&p.sql));
                        self.unnamed = Some(p.clone());
                        match macro_text(&p, macros_at, ld.rewritten) {
                            None => msg.encode_into(&mut data),
                            Some(new) => p.encode_as("", Some(&new), &mut data),
                        }
                        plan.push(Step::Sent(wire::PARSE, Mode::Pass, 0));
                        ld.slot = Some(p);
                    }
                }
                wire::BIND => {
                    let b = wire::Bind::decode(&msg.body)?;
                    let target = if b.statement.is_empty() { self.unnamed.clone() } else { self.statements.get(&b.statement).cloned() };
                    if !b.statement.is_empty() && target.is_none() {
                        msg.encode_into(&mut data); // the backend reports the unknown name
                    } else {
                        ld.load(target, &mut data, &mut plan);
                        if b.statement.is_empty() {
                            msg.encode_into(&mut data);
                        } else {
                            b.encode_for("", &mut data);
                        }
                    }
                    plan.push(Step::Sent(wire::BIND, Mode::Pass, 0));
                }
                k @ (wire::DESCRIBE | wire::CLOSE) => {
                    let t = wire::Target::decode(&msg.body)?;
                    if t.what == b'S' && !t.name.is_empty() {
                        let p = self.statements.get(&t.name).cloned();
                        if k == wire::CLOSE {
                            self.statements.remove(&t.name);
                            plan.push(Step::Here(wire::frame(wire::CLOSE_COMPLETE, b"")));
                            continue;
                        }
                        match p {
                            None => msg.encode_into(&mut data),
                            Some(p) => {
                                ld.load(Some(p), &mut data, &mut plan);
                                wire::Target { what: b'S', name: String::new() }.encode(wire::DESCRIBE, &mut data);
                            }
                        }
                        plan.push(Step::Sent(k, Mode::Pass, b'S'));
                        continue;
                    }
                    if t.what == b'S' && k == wire::DESCRIBE {
                        ld.load(self.unnamed.clone(), &mut data, &mut plan);
                    }
                    msg.encode_into(&mut data);
                    plan.push(Step::Sent(k, Mode::Pass, t.what));
                }
                k => {
                    // Execute, Flush, Sync
                    msg.encode_into(&mut data);
                    if k != wire::FLUSH {
                        plan.push(Step::Sent(k, Mode::Pass, 0));
                    }
                }
            }
        }
        let slot = ld.slot;
        let resets = resets || ld.resets;
        if rewritten > 0 || named > 0 {
            self.m.count(|c| {
                c.macros_rewritten += rewritten as u64;
                c.named_statements += named;
            });
        }
        Ok(Outgoing { data, plan, unnamed: slot, resets })
    }

    // --- reads ---------------------------------------------------------------------------------
    /// A unit that executes a named statement the session keeps, as `prepared_variant` takes it.
    fn executes_named(&self, unit: &[Message]) -> bool {
        let Some((first, rest)) = unit.split_first() else {
            return false;
        };
        first.kind == wire::BIND
            && wire::Bind::decode(&first.body).is_ok_and(|b| !b.statement.is_empty() && self.statements.contains_key(&b.statement))
            && rest.last().is_some_and(|m| m.kind == wire::SYNC)
            && rest.iter().all(|m| m.kind == wire::EXECUTE || m.kind == wire::SYNC || (m.kind == wire::DESCRIBE && m.body.first() == Some(&b'P')))
    }

    async fn read(&mut self, unit: &[Message], label: Option<Arc<str>>) -> SResult<()> {
        // a unit executing a named statement usually runs as prepared on the connection: the
        // general form (no side effects on the session for such a unit) only when needed
        let mut general = if self.executes_named(unit) { None } else { Some(self.outgoing(unit, None, None)?) };
        let m = self.m.clone();
        loop {
            let (b, started, token) = m.choose_read(label.as_ref())?;
            let backend = &m.backends[b];
            backend.wait_for_writes(started).await;
            if !backend.enabled() {
                // disabled by the write it waited for: choose again
                m.read_over(b, token);
                continue;
            }
            let mut conn = match backend.pool.acquire().await {
                Ok(c) => c,
                Err(err) => {
                    m.disable(b, &format!("read failed: {err}"));
                    m.count(|c| c.read_retries += 1);
                    m.read_over(b, token);
                    continue;
                }
            };
            let variant = prepared_variant(&self.m, &self.statements, unit, &mut conn);
            if variant.is_none() && general.is_none() {
                match self.outgoing(unit, None, None) {
                    Ok(o) => general = Some(o),
                    Err(e) => {
                        backend.pool.release(conn);
                        m.read_over(b, token);
                        return Err(e);
                    }
                }
            }
            let out = general.as_ref();
            let mut sink = Sink { held: Vec::new(), client: Some(&mut self.wr), saw: false, client_failed: false };
            let t0 = Instant::now();
            let mut plan = ReplyPlan::default();
            let this = match (&variant, out) {
                (Some(v), _) => &v.0,
                (None, Some(o)) => o,
                (None, None) => unreachable!("the general form is built when no variant is"),
            };
            this.reply_plan(&mut plan);
            let mut x = execute(&mut conn, this, &mut sink, &mut plan).await;
            if let (false, Some((_, Some(sql)))) = (x.ok, &variant) {
                conn.stmts.remove(sql); // its Parse may have failed: prepare it again next time
            }
            let reused = conn.reused;
            backend.pool.release(conn);
            if !x.broken {
                m.read_done(b, t0.elapsed().as_secs_f64(), label.as_ref());
            }
            if x.broken && reused && !sink.saw {
                // an idle pooled connection may have gone stale: once more on a new one
                backend.pool.drop_idle();
                sink.held.clear();
                if let Ok(mut conn) = backend.pool.acquire().await {
                    // a new connection: the variant for it, or the general form
                    let again = prepared_variant(&self.m, &self.statements, unit, &mut conn);
                    let this = match (&again, out) {
                        (Some(v), _) => Some(&v.0),
                        (None, o) => o,
                    };
                    if let Some(this) = this {
                        let mut plan = ReplyPlan::default();
                        this.reply_plan(&mut plan);
                        x = execute(&mut conn, this, &mut sink, &mut plan).await;
                    }
                    if let (false, Some((_, Some(sql)))) = (x.ok, &again) {
                        conn.stmts.remove(sql);
                    }
                    backend.pool.release(conn);
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
                m.disable(b, &format!("read failed: {}", x.error.as_deref().unwrap_or("None")));
                if saw {
                    // part of the answer is out: the client connection cannot continue
                    return Err(Fail::End(x.error));
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

    // --- writes --------------------------------------------------------------------------------
    /// A connection on every enabled backend with the write lock held (or the transaction's pinned
    /// connections).
    async fn lease_for_write(&mut self) -> SResult<Lease> {
        if let Some(txn) = self.txn.take() {
            return Ok(Lease { conns: txn.lease, guard: txn.guard, pinned: true });
        }
        let t0 = Instant::now();
        let guard = self.m.write_lock.clone().lock_owned().await;
        let waited = t0.elapsed().as_secs_f64();
        self.m.count(|c| c.write_lock_wait_s += waited);
        let targets = self.m.enabled();
        if targets.is_empty() {
            return Err(Fail::NoBackend("no database backend is enabled".into()));
        }
        let mut conns = Vec::new();
        let mut set = JoinSet::new();
        for &b in &targets {
            // an idle connection at once (the usual case), else wait or open one, all at once
            match self.m.backends[b].pool.try_acquire_idle() {
                Some(c) => conns.push((b, c)),
                None => {
                    let m = self.m.clone();
                    set.spawn(async move { (b, m.backends[b].pool.acquire().await) });
                }
            }
        }
        while let Some(j) = set.join_next().await {
            match j {
                Ok((b, Ok(c))) => conns.push((b, c)),
                Ok((b, Err(err))) => self.m.disable(b, &format!("write failed: cannot get a connection: {err}")),
                Err(_) => {}
            }
        }
        if conns.is_empty() {
            return Err(Fail::NoBackend("no database backend could be reached for a write".into()));
        }
        conns.sort_by_key(|c| c.0);
        Ok(Lease { conns, guard, pinned: false })
    }

    async fn write(&mut self, unit: &[Message]) -> SResult<()> {
        let lease = self.lease_for_write().await?;
        let pinned = lease.pinned;
        let mut out = self.outgoing(unit, Some(sql::now_micros()), None)?;
        // the recovery log: a sequence number (under the write lock), the position recorded by the
        // unit itself (not in an aborted transaction: its only way out is a rollback), the record
        // appended and fsync'd while the backends run it
        let durable = self.m.recovery.clone().map(|log| {
            let seq = log.take_seq();
            if !lease.conns.iter().any(|(_, c)| c.status == b'E') {
                with_position(&mut out, seq);
            }
            (log, seq)
        });
        let out = Arc::new(out);
        let durable = durable.map(|(log, seq)| logged(log, seq, out.clone()));
        if out.resets {
            self.m.statement_epoch.fetch_add(1, std::sync::atomic::Ordering::AcqRel);
        }
        self.m.count(|c| c.writes += 1);
        let (tx, rx) = oneshot::channel();
        self.m.inflight_add(1);
        let handle = tokio::spawn(broadcast(self.m.clone(), lease, out, tx, durable.clone()));
        let Ok(answer) = rx.await else {
            return Err(Fail::End(Some("a write failed unexpectedly".into())));
        };
        if let Some(d) = durable {
            // answered only once its record is written, and on disk when it leaves no
            // transaction open (the records of the transaction's units before it with it)
            let mut r = d.await;
            if let (Ok(()), b'I', Some(rlog)) = (&r, answer.status, self.m.recovery.clone()) {
                r = recovery::sync(rlog).await;
            }
            if let Err(e) = r {
                log(&e);
                return Err(Fail::End(Some(e)));
            }
        }
        self.out.extend_from_slice(&answer.replies);
        if !answer.ok {
            self.m.count(|c| c.errors_to_clients += 1);
        }
        if answer.status != b'I' || pinned {
            // a transaction: its connections and the lock stay with it
            self.txn = handle.await.ok().flatten();
        } else {
            self.last_write = Some(handle);
        }
        Ok(())
    }

    fn writes_over(&self, idx: &[usize]) {
        for &b in idx {
            self.m.writes_end(b);
            self.m.write_finished(b);
        }
    }

    fn abandon_open(&mut self, ou: OpenUnit) {
        for s in ou.slots {
            if let Some(mut c) = s.conn {
                c.close();
                self.m.backends[s.b].pool.release(c);
            }
        }
        self.txn = None;
        // connections closed: whatever transaction they had is rolled back, on replay too
        self.m.log_rollback();
        drop(ou.guard);
    }

    // --- units the client flushes before Sync (pipeline mode) ---------------------------------
    /// A client that sends Flush and waits for replies before Sync: what comes later in the unit is
    /// unknown, so the unit runs like a write, on every backend under the write lock, answered by
    /// the first backend after all have replied to each part.
    async fn open_begin(&mut self) -> SResult<()> {
        let lease = self.lease_for_write().await?;
        let idx: Vec<usize> = lease.conns.iter().map(|c| c.0).collect();
        self.m.writes_begin(&idx);
        self.m.count(|c| {
            c.writes += 1;
            c.flushed_units += 1;
        });
        let seq = self.m.recovery.as_ref().map(|log| (log.take_seq(), !lease.conns.iter().any(|(_, c)| c.status == b'E')));
        let slots = lease
            .conns
            .into_iter()
            .map(|(b, conn)| OpenSlot { b, conn: Some(conn), plan: ReplyPlan::default(), acc: Exec { ok: true, status: b'I', ..Default::default() } })
            .collect();
        self.open = Some(OpenUnit { slots, guard: lease.guard, seq, logged: Vec::new(), macros_at: sql::now_micros(), slot: None, answering: None });
        Ok(())
    }

    async fn open_step(&mut self, msgs: Vec<Message>, last: bool) -> SResult<()> {
        let Some(mut ou) = self.open.take() else {
            return Err(Fail::End(Some("no open unit".into())));
        };
        let idx: Vec<usize> = ou.slots.iter().map(|s| s.b).collect();
        let out = match self.outgoing(&msgs, Some(ou.macros_at), ou.slot.clone()) {
            Ok(mut o) => {
                if let Some((seq, true)) = ou.seq {
                    if ou.logged.is_empty() {
                        with_position(&mut o, seq); // first, as in a unit sent at once
                    }
                }
                if ou.seq.is_some() {
                    ou.logged.extend_from_slice(&o.data);
                }
                Arc::new(o)
            }
            Err(e) => {
                self.abandon_open(ou);
                self.writes_over(&idx);
                return Err(e);
            }
        };
        ou.slot = out.unnamed.clone();
        if out.resets {
            self.m.statement_epoch.fetch_add(1, std::sync::atomic::Ordering::AcqRel);
        }
        let mut lease = Vec::new();
        let mut positions = Vec::new();
        for (pos, s) in ou.slots.iter_mut().enumerate() {
            if !s.acc.broken {
                if let Some(conn) = s.conn.take() {
                    out.reply_plan(&mut s.plan);
                    lease.push((s.b, conn, std::mem::take(&mut s.plan)));
                    positions.push(pos);
                }
            }
        }
        let steps = run_all(lease, out).await;
        let mut answering: Option<(usize, Vec<u8>)> = None;
        for (pos, (_, conn, plan, x, held)) in positions.into_iter().zip(steps) {
            let s = &mut ou.slots[pos];
            s.conn = conn;
            s.plan = plan;
            s.acc.ok = s.acc.ok && x.ok;
            if s.acc.error.is_none() {
                s.acc.error = x.error.clone();
            }
            s.acc.broken = s.acc.broken || x.broken;
            s.acc.status = x.status;
            s.acc.tags.extend(x.tags.iter().cloned());
            if answering.is_none() && !x.broken {
                answering = Some((s.b, held));
            }
        }
        let Some((answer_b, replies)) = answering.filter(|(b, _)| ou.answering.is_none_or(|a| a == *b)) else {
            self.abandon_open(ou);
            self.writes_over(&idx);
            return Err(Fail::End(Some("the backend answering a flushed unit failed mid-unit".into())));
        };
        ou.answering = Some(answer_b);
        self.out.extend_from_slice(&replies);
        if !last {
            self.open = Some(ou);
            return Ok(());
        }
        let mut log_failed = None;
        if let (Some((seq, _)), Some(rlog)) = (ou.seq, self.m.recovery.clone()) {
            // the whole unit, one record, on disk before the lock goes and the client is answered
            if let Err(e) = recovery::append(rlog, seq, Arc::new(std::mem::take(&mut ou.logged)), true).await {
                log(&e);
                log_failed = Some(e);
            }
        }
        let chosen_pos = ou.slots.iter().position(|s| s.b == answer_b);
        let results: Vec<Res> = ou.slots.into_iter().map(|s| Res { b: s.b, conn: s.conn, replies: Vec::new(), x: s.acc }).collect();
        let (chosen, results, txn) = settle(&self.m, results, chosen_pos, ou.guard);
        self.txn = txn;
        self.writes_over(&idx);
        if let Some(e) = log_failed {
            return Err(Fail::End(Some(e)));
        }
        if !results[chosen].x.ok {
            self.m.count(|c| c.errors_to_clients += 1);
        }
        Ok(())
    }
}

/// A unit's record in the recovery log: Ok once it is written (the session fsyncs it).
type Durable = Shared<futures_util::future::BoxFuture<'static, Result<(), String>>>;

/// Append `out` to the recovery log as unit `seq` (a task of its own, started now).
fn logged(log: Arc<recovery::Log>, seq: u64, out: Arc<Outgoing>) -> Durable {
    let task = tokio::spawn(recovery::append(log, seq, out, false));
    async move { task.await.unwrap_or_else(|e| Err(format!("recovery log: {e}"))) }.boxed().shared()
}

/// Run a write unit on every leased backend; answer the client by the wait policy (the first
/// backend to succeed, or all), then settle the unit. Returns the transaction, if one is open.
async fn broadcast(m: Arc<Manager>, lease: Lease, out: Arc<Outgoing>, tx: oneshot::Sender<Answer>, durable: Option<Durable>) -> Option<Txn> {
    let idx: Vec<usize> = lease.conns.iter().map(|c| c.0).collect();
    m.writes_begin(&idx);
    let n = idx.len();
    // the backends' executions as futures of this task (no task per backend)
    let mut running = FuturesUnordered::new();
    for (pos, (b, mut conn)) in lease.conns.into_iter().enumerate() {
        let (m, out) = (&m, &out);
        running.push(async move {
            let mut sink = Sink::collect();
            let mut plan = ReplyPlan::default();
            out.reply_plan(&mut plan);
            let x = execute(&mut conn, out, &mut sink, &mut plan).await;
            if out.resets {
                conn.stmts.clear();
            }
            m.writes_end(b);
            if x.ok {
                // reads waiting for this write on b may go; after a failure, settle first
                m.write_finished(b);
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
                // the first to succeed answers the client
                chosen = Some(pos);
                if let Some(tx) = tx.take() {
                    let _ = tx.send(Answer { replies: r.replies.clone(), ok: true, status: r.x.status });
                }
            }
        }
        results[pos] = Some(r);
    }
    drop(running);
    let results: Vec<Res> = results
        .into_iter()
        .enumerate()
        .map(|(pos, r)| r.unwrap_or_else(|| Res { b: idx[pos], conn: None, replies: Vec::new(), x: panicked() }))
        .collect();
    if let Some(d) = durable {
        // the write lock is held until the record is appended: the log's order is the units'
        let _ = d.await;
    }
    let (c, results, txn) = settle(&m, results, chosen, lease.guard);
    for (pos, &b) in idx.iter().enumerate() {
        if !finished_here[pos] {
            m.write_finished(b);
        }
    }
    if let Some(tx) = tx.take() {
        let r = &results[c];
        let _ = tx.send(Answer { replies: r.replies.clone(), ok: r.x.ok, status: r.x.status });
    }
    m.inflight_add(-1);
    txn
}

/// After a write unit ran on every leased backend: disable the backends that failed where another
/// succeeded (or whose result differs), then either keep the connections and the lock for the open
/// transaction or give them back. Returns the position of the result that answers the client.
fn settle(m: &Manager, mut results: Vec<Res>, chosen: Option<usize>, guard: OwnedMutexGuard<()>) -> (usize, Vec<Res>, Option<Txn>) {
    let any_ok = results.iter().any(|r| r.x.ok);
    let c = chosen.or_else(|| results.iter().position(|r| r.x.ok)).or_else(|| results.iter().position(|r| !r.x.broken)).unwrap_or(0);
    let chosen_name = m.backends[results[c].b].name.clone();
    let chosen_tags = results[c].x.tags.clone();
    if any_ok {
        for r in &results {
            let err = r.x.error.as_deref().unwrap_or("None");
            if !r.x.ok {
                m.state().b[r.b].failed_writes += 1;
                m.disable(r.b, &format!("write failed where {chosen_name} succeeded: {err}"));
            } else if r.x.tags != chosen_tags {
                m.disable(r.b, &format!("write result {} differs from {chosen_name}'s {}", pylist(&r.x.tags), pylist(&chosen_tags)));
            }
        }
    } else if results.iter().all(|r| r.x.broken) {
        for r in &results {
            m.disable(r.b, &format!("write failed: {}", r.x.error.as_deref().unwrap_or("None")));
        }
    }
    let alive: Vec<bool> = results.iter().map(|r| m.backends[r.b].enabled() && r.conn.is_some() && !r.x.broken).collect();
    let in_txn = results.iter().zip(&alive).any(|(r, &a)| a && r.x.status != b'I');
    let mut lease = Vec::new();
    for (r, &a) in results.iter_mut().zip(&alive) {
        let Some(mut conn) = r.conn.take() else { continue };
        if in_txn && a {
            lease.push((r.b, conn));
        } else {
            if in_txn {
                conn.close(); // a backend dropped from the transaction
            }
            m.backends[r.b].pool.release(conn);
        }
    }
    let txn = if in_txn { Some(Txn { lease, guard }) } else { None };
    (c, results, txn)
}

#[cfg(test)]
mod tests {
    use super::{may_deallocate, resets_statements};

    #[test]
    fn only_a_query_that_may_be_a_deallocate_is_decoded_for_it() {
        for body in [&b"DEALLOCATE x\0"[..], b" \t\x0b\x0cdeallocate all\0", b"\xc2\xa0DEALLOCATE x\0", b"\xff\0"] {
            assert!(may_deallocate(body), "{body:?}");
        }
        for body in [&b"SELECT 1\0"[..], b"DEALLOC\0", b"\0", b"", b"  \0DEALLOCATE x"] {
            assert!(!may_deallocate(body), "{body:?}");
        }
    }

    #[test]
    fn ddl_and_settings_reset_prepared_statements() {
        for text in
            ["CREATE TABLE t (id int)", "alter table t add c int", "SELECT 1; DROP TABLE t", "SET search_path = x", "DISCARD ALL", "deallocate all"]
        {
            assert!(resets_statements(text), "{text}");
        }
        for text in ["INSERT INTO t VALUES (1)", "UPDATE t SET created = 1", "BEGIN", "SELECT 'DROP TABLE t'", "-- DROP\nCOMMIT"] {
            assert!(!resets_statements(text), "{text}");
        }
    }
}
