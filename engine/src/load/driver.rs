//! Drives the workload: emulated users (closed loop) or arrivals (open loop) on a single-threaded
//! tokio runtime. Users are cheap state machines (one task each, asleep on the timer wheel
//! while thinking); every request goes to the log and the statistics.

use std::cell::{Cell, RefCell};
use std::path::Path;
use std::rc::Rc;
use std::sync::mpsc::Sender;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Result;
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use serde_json::{json, Map, Value};
use tokio::sync::Semaphore;
use tokio::task::LocalSet;

use super::arrivals::Arrivals;
use super::clock;
use super::embedded::embedded_urls;
use super::http::{self, Conn, ErrorKind, ExchangeError, Target};
use super::log::{LogWriter, Record};
use super::markov::{Move, Target as To, Walker};
use super::params::{encode_into, Env, Fallback, Part};
use super::progress::Stats;
use super::think::Think;
use super::workload::{Method, Page, Policy, Unit, Variant, Workload};

/// A rendered request: path (with query) and form body; what history remembers for BACK.
#[derive(Clone, Debug)]
pub struct Req {
    pub path: Arc<str>,
    pub form: Option<Arc<str>>,
}

const BODY_CAP: usize = 4 << 20;
const BATCH: usize = 4096;

struct Pool {
    sem: Semaphore,
    idle: RefCell<Vec<Conn>>,
}

/// A user's own connections: the page connection (policy per-user) and the small kept-alive
/// pool for embedded objects (at most `[embedded] connections`).
#[derive(Default)]
struct UserConns {
    page: Option<Conn>,
    embedded: Vec<Conn>,
}

struct Ctx {
    wl: Workload,
    target: Target,
    t0: Instant,
    t0_ns: i64,
    end_s: f64,
    stop: Cell<bool>,
    stats: RefCell<Stats>,
    batch: RefCell<Vec<Record>>,
    log: RefCell<Option<Sender<Vec<Record>>>>,
    active_users: Cell<u64>,
    in_flight: Cell<u64>,
    sessions: Cell<u64>,
    think: RefCell<Think>,
    pool: Option<Pool>,
    words: Arc<Vec<String>>,
    static_paths: Vec<Option<Arc<str>>>,
    var_names: Vec<Vec<Arc<str>>>,
    needs_body: bool,
    seed: u64,
    connect_timeout: Duration,
    request_timeout: Duration,
    policy: Policy,
    /// the largest think-time mean of any page (the truncation point is 10x this)
    max_think_mean: f64,
    /// closed-loop wake-ups are aligned to this grid (s; 0 = exact)
    quantum_s: f64,
    deadlines: RefCell<Deadlines>,
    /// pre-built request bytes of pages with a literal URL and no body
    static_requests: Vec<Option<Arc<[u8]>>>,
    /// per session type: whether it has `learn` variables
    learns: Vec<bool>,
}

/// Render page `i` of `wl`: the path (after `prefix`) with its placeholders filled in, and the
/// form body of a POST. A page with variants draws one per request.
fn render_page(wl: &Workload, prefix: &str, i: usize, env: &Env, rng: &mut SmallRng) -> Result<Req, Fallback> {
    let page = &wl.pages[i];
    let variant = pick_variant(page, rng);
    let mut path = String::with_capacity(64);
    path.push_str(prefix);
    let mut tmp = String::new();
    for part in &page.url.parts {
        match part {
            Part::Lit(s) => path.push_str(s),
            Part::Var(name) => {
                tmp.clear();
                lookup(page, variant, name, env, rng, &mut tmp)?;
                encode_into(&tmp, &mut path);
            }
        }
    }
    let form = if page.method == Method::Post {
        let mut f = String::new();
        for (k, p) in &page.form {
            if !f.is_empty() {
                f.push('&');
            }
            encode_into(k, &mut f);
            f.push('=');
            tmp.clear();
            p.value(env, rng, &mut tmp)?;
            encode_into(&tmp, &mut f);
        }
        Some(Arc::from(f))
    } else {
        None
    };
    Ok(Req { path: Arc::from(path), form })
}

fn pick_variant<'a>(page: &'a Page, rng: &mut SmallRng) -> Option<&'a Variant> {
    match page.variants.len() {
        0 => None,
        1 => page.variants.first(),
        _ => {
            let total: f64 = page.variants.iter().map(|v| v.weight).sum();
            let mut u = rng.gen::<f64>() * total;
            for v in &page.variants {
                if u < v.weight {
                    return Some(v);
                }
                u -= v.weight;
            }
            page.variants.last()
        }
    }
}

/// A placeholder's value: the variant's params, the page's params and form, the session variables.
fn lookup(page: &Page, variant: Option<&Variant>, name: &str, env: &Env, rng: &mut SmallRng, out: &mut String) -> Result<(), Fallback> {
    if let Some((_, p)) = variant.and_then(|v| v.params.iter().find(|(k, _)| k == name)) {
        return p.value(env, rng, out);
    }
    if let Some((_, p)) = page.params.iter().chain(page.form.iter()).find(|(k, _)| k == name) {
        return p.value(env, rng, out);
    }
    if let Some((_, v)) = env.vars.iter().find(|(k, _)| &**k == name) {
        out.push_str(v);
    }
    Ok(())
}

fn mix(seed: u64, k: u64) -> u64 {
    // splitmix64
    let mut z = seed.wrapping_add(k.wrapping_mul(0x9E37_79B9_7F4A_7C15));
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

impl Ctx {
    #[inline]
    fn now_s(&self) -> f64 {
        self.t0.elapsed().as_secs_f64()
    }
    #[inline]
    fn ns_at(&self, s: f64) -> i64 {
        self.t0_ns + (s * 1e9) as i64
    }
    #[inline]
    fn align(&self, s: f64) -> f64 {
        if self.quantum_s > 0.0 {
            (s / self.quantum_s).round() * self.quantum_s
        } else {
            s
        }
    }
    fn phase_at(&self, s: f64) -> u8 {
        if s < self.wl.ramp_up_s {
            0
        } else if s < self.wl.ramp_up_s + self.wl.run_s {
            1
        } else {
            2
        }
    }
    async fn sleep_until_s(&self, s: f64) {
        if s > self.now_s() {
            tokio::time::sleep_until(tokio::time::Instant::from_std(self.t0 + Duration::from_secs_f64(s))).await;
        }
    }
    fn emit(&self, rec: Record) {
        self.stats.borrow_mut().add(&rec);
        let mut b = self.batch.borrow_mut();
        b.push(rec);
        if b.len() >= BATCH {
            self.flush_batch_locked(&mut b);
        }
    }
    fn flush_batch_locked(&self, b: &mut Vec<Record>) {
        let full = std::mem::replace(b, Vec::with_capacity(BATCH));
        if let Some(tx) = self.log.borrow().as_ref() {
            let _ = tx.send(full);
        }
    }
    fn flush_batch(&self) {
        let mut b = self.batch.borrow_mut();
        if !b.is_empty() {
            self.flush_batch_locked(&mut b);
        }
    }

    /// Session variables drawn when a session starts.
    fn draw_vars(&self, stype: usize, rng: &mut SmallRng) -> Vec<(Arc<str>, String)> {
        let st = &self.wl.session_types[stype];
        st.vars
            .iter()
            .zip(&self.var_names[stype])
            .map(|((_, p), name)| {
                let mut v = String::new();
                let _ = p.value(&Env::new(&[], b"", "", &self.words), rng, &mut v);
                (name.clone(), v)
            })
            .collect()
    }

    /// Learn `learn` session variables that are still empty from a response body.
    fn learn(&self, stype: usize, vars: &mut [(Arc<str>, String)], body: &[u8]) {
        if body.is_empty() || !self.learns[stype] {
            return;
        }
        for ((_, p), (_, v)) in self.wl.session_types[stype].vars.iter().zip(vars.iter_mut()) {
            if v.is_empty() {
                if let Some(x) = p.learn_from(body) {
                    *v = x;
                }
            }
        }
    }

    /// Render page `i` (URL and form) from the session variables and the previous response.
    fn render(&self, i: usize, env: &Env, rng: &mut SmallRng) -> Result<Req, Fallback> {
        if let Some(p) = &self.static_paths[i] {
            return Ok(Req { path: p.clone(), form: None });
        }
        render_page(&self.wl, &self.target.prefix, i, env, rng)
    }

    /// The start page of a session (no previous response).
    fn render_start(&self, vars: &[(Arc<str>, String)], rng: &mut SmallRng) -> Req {
        let start = self.wl.start;
        self.render(start, &Env::new(vars, b"", "", &self.words), rng).unwrap_or_else(|_| Req { path: self.static_or_empty(start), form: None })
    }

    fn request_bytes(&self, page: usize, req: &Req, close: bool) -> ReqBytes {
        if let Some(b) = &self.static_requests[page] {
            return ReqBytes::Shared(b.clone());
        }
        ReqBytes::Owned(self.build_request(page, req, close))
    }

    /// A GET of an embedded object.
    fn object_request(&self, path: &str, close: bool) -> Vec<u8> {
        let mut b = Vec::with_capacity(64 + path.len() + self.target.host_header.len());
        b.extend_from_slice(b"GET ");
        b.extend_from_slice(path.as_bytes());
        b.extend_from_slice(b" HTTP/1.1\r\nHost: ");
        b.extend_from_slice(self.target.host_header.as_bytes());
        b.extend_from_slice(b"\r\nUser-Agent: tierscope\r\n");
        if close {
            b.extend_from_slice(b"Connection: close\r\n");
        }
        b.extend_from_slice(b"\r\n");
        b
    }

    fn build_request(&self, page: usize, req: &Req, close: bool) -> Vec<u8> {
        let method = self.wl.pages[page].method;
        let form_len = req.form.as_ref().map_or(0, |f| f.len());
        let mut b = Vec::with_capacity(96 + req.path.len() + self.target.host_header.len() + form_len);
        b.extend_from_slice(if method == Method::Post { b"POST " } else { b"GET " });
        b.extend_from_slice(req.path.as_bytes());
        b.extend_from_slice(b" HTTP/1.1\r\nHost: ");
        b.extend_from_slice(self.target.host_header.as_bytes());
        b.extend_from_slice(b"\r\nUser-Agent: tierscope\r\n");
        if close {
            b.extend_from_slice(b"Connection: close\r\n");
        }
        if let Some(f) = &req.form {
            b.extend_from_slice(b"Content-Type: application/x-www-form-urlencoded\r\nContent-Length: ");
            b.extend_from_slice(f.len().to_string().as_bytes());
            b.extend_from_slice(b"\r\n\r\n");
            b.extend_from_slice(f.as_bytes());
        } else {
            b.extend_from_slice(b"\r\n");
        }
        b
    }
}

/// Request bytes: shared for pages whose request never changes, built otherwise.
enum ReqBytes {
    Shared(Arc<[u8]>),
    Owned(Vec<u8>),
}

impl std::ops::Deref for ReqBytes {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        match self {
            ReqBytes::Shared(a) => a,
            ReqBytes::Owned(v) => v,
        }
    }
}

/// Request timeouts without a timer-wheel entry per request: a pending request sits in a slot
/// with its deadline and waker; a watchdog task scans the slots every 1/20 of the timeout
/// (10 to 500 ms) and wakes the expired ones, which then resolve to a timeout.
#[derive(Default)]
struct Deadlines {
    slots: Vec<Option<(Instant, std::task::Waker)>>,
    free: Vec<usize>,
}

struct Deadline<'a, 'b, F> {
    ctx: &'a Ctx,
    fut: std::pin::Pin<&'b mut F>,
    at: Instant,
    slot: Option<usize>,
}

impl<'a, 'b, F: std::future::Future> Deadline<'a, 'b, F> {
    fn new(ctx: &'a Ctx, fut: std::pin::Pin<&'b mut F>) -> Deadline<'a, 'b, F> {
        Deadline { ctx, fut, at: Instant::now() + ctx.request_timeout, slot: None }
    }
}

impl<F: std::future::Future> std::future::Future for Deadline<'_, '_, F> {
    type Output = Result<F::Output, ()>;
    fn poll(self: std::pin::Pin<&mut Self>, cx: &mut std::task::Context<'_>) -> std::task::Poll<Self::Output> {
        use std::task::Poll;
        let this = self.get_mut();
        if let Poll::Ready(v) = this.fut.as_mut().poll(cx) {
            return Poll::Ready(Ok(v));
        }
        if this.slot.is_some() && Instant::now() >= this.at {
            return Poll::Ready(Err(()));
        }
        let at = this.at;
        let mut d = this.ctx.deadlines.borrow_mut();
        match this.slot {
            Some(i) => {
                if let Some((_, w)) = &d.slots[i] {
                    if !w.will_wake(cx.waker()) {
                        d.slots[i] = Some((at, cx.waker().clone()));
                    }
                }
            }
            None => {
                let entry = Some((at, cx.waker().clone()));
                let i = match d.free.pop() {
                    Some(i) => {
                        d.slots[i] = entry;
                        i
                    }
                    None => {
                        d.slots.push(entry);
                        d.slots.len() - 1
                    }
                };
                drop(d);
                this.slot = Some(i);
            }
        }
        Poll::Pending
    }
}

impl<F> Drop for Deadline<'_, '_, F> {
    fn drop(&mut self) {
        if let Some(i) = self.slot.take() {
            let mut d = self.ctx.deadlines.borrow_mut();
            d.slots[i] = None;
            d.free.push(i);
        }
    }
}

async fn watchdog(ctx: Rc<Ctx>) {
    // a period of 1/20 of the timeout (10 ms .. 500 ms): timeouts fire within ~5 % late,
    // and a long timeout costs few wake-ups
    let period = (ctx.request_timeout / 20).clamp(Duration::from_millis(10), Duration::from_millis(500));
    let mut tick = tokio::time::interval(period);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let now = Instant::now();
        let d = ctx.deadlines.borrow();
        for (at, w) in d.slots.iter().flatten() {
            if *at <= now {
                w.wake_by_ref();
            }
        }
    }
}

/// Logs a request that was cut off (run end, Ctrl-C) when its future is dropped.
struct InFlight<'a> {
    ctx: &'a Ctx,
    rec: Option<Record>,
}

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        self.ctx.in_flight.set(self.ctx.in_flight.get() - 1);
        if let Some(mut rec) = self.rec.take() {
            rec.end_ns = clock::now_ns();
            rec.error = Some(ErrorKind::Cancelled);
            self.ctx.emit(rec);
        }
    }
}

/// The previous request of this user and the think time drawn after it.
#[derive(Clone, Copy, Default)]
struct Prev {
    end_ns: i64,
    think_s: f64,
    uncensored: bool,
}

struct Outcome {
    error: Option<ErrorKind>,
    end_s: f64,
    end_ns: i64,
    force_back: bool,
    body: Option<Vec<u8>>,
}

/// One exchange on `conn` (or a new connection), under the request timeout; a kept-alive
/// connection found closed before any response byte is retried once on a new one. Returns the
/// response and the connection when it can be kept.
async fn exchange(
    ctx: &Ctx,
    mut conn: Option<Conn>,
    bytes: &[u8],
    mut body: Option<&mut Vec<u8>>,
    close: bool,
) -> (Result<http::Response, ErrorKind>, Option<Conn>) {
    let mut attempt = 0;
    loop {
        attempt += 1;
        let mut c = match conn.take() {
            Some(c) => c,
            None => match http::connect(ctx.target.addr, ctx.connect_timeout).await {
                Ok(c) => c,
                Err(e) => return (Err(e), None),
            },
        };
        let res = {
            let exchange = std::pin::pin!(c.exchange(bytes, body.as_deref_mut(), BODY_CAP));
            Deadline::new(ctx, exchange).await
        };
        match res {
            Err(_) => return (Err(ErrorKind::Timeout), None),
            Ok(Ok(r)) => {
                let keep = r.keep_alive && !close;
                return (Ok(r), if keep { Some(c) } else { None });
            }
            Ok(Err(ExchangeError::ClosedBeforeResponse)) if attempt == 1 => {
                // a stale kept-alive connection: retry once on a new one (as browsers do)
                if let Some(b) = body.as_deref_mut() {
                    b.clear();
                }
                continue;
            }
            Ok(Err(ExchangeError::ClosedBeforeResponse)) => return (Err(ErrorKind::Reset), None),
            Ok(Err(ExchangeError::Kind(k))) => return (Err(k), None),
        }
    }
}

/// What fetching a page's embedded objects gave.
#[derive(Default, Debug, Clone, Copy, PartialEq, Eq)]
struct EmbeddedOut {
    /// objects requested
    count: u32,
    /// response bytes on the wire
    bytes: u64,
    /// objects that did not come back 2xx/3xx
    failed: u32,
    /// of those, the page errors: no response (connect, timeout, reset, unparseable) or 5xx
    errors: u32,
}

/// One connection's share of the objects: take the next URL until none is left.
async fn embedded_worker(ctx: &Ctx, urls: &[String], next: &Cell<usize>, mut conn: Option<Conn>, close: bool) -> (Option<Conn>, EmbeddedOut) {
    let mut out = EmbeddedOut::default();
    loop {
        let i = next.get();
        if i >= urls.len() {
            break;
        }
        next.set(i + 1);
        let bytes = ctx.object_request(&urls[i], close);
        let (res, c) = exchange(ctx, conn.take(), &bytes, None, close).await;
        conn = c;
        out.count += 1;
        match res {
            Ok(r) => {
                out.bytes += r.bytes;
                if r.status >= 400 {
                    out.failed += 1;
                    if r.status >= 500 {
                        out.errors += 1;
                    }
                }
            }
            Err(_) => {
                out.failed += 1;
                out.errors += 1;
            }
        }
    }
    (conn, out)
}

/// Fetch every URL once with up to `connections` parallel connections, taken from (and given
/// back to) the user's kept-alive pool `pool`; returns when the last byte of the last object
/// has arrived.
async fn fetch_embedded(ctx: &Ctx, urls: &[String], pool: &mut Vec<Conn>, connections: usize, close: bool) -> EmbeddedOut {
    use std::future::Future;
    use std::pin::Pin;
    use std::task::Poll;
    let workers = connections.min(urls.len());
    if workers == 0 {
        return EmbeddedOut::default();
    }
    let next = Cell::new(0usize);
    type Worker<'a> = Pin<Box<dyn Future<Output = (Option<Conn>, EmbeddedOut)> + 'a>>;
    let mut futs: Vec<Worker> = (0..workers).map(|_| Box::pin(embedded_worker(ctx, urls, &next, pool.pop(), close)) as Worker).collect();
    let mut done: Vec<Option<(Option<Conn>, EmbeddedOut)>> = (0..workers).map(|_| None).collect();
    std::future::poll_fn(|cx| {
        let mut pending = false;
        for (f, d) in futs.iter_mut().zip(done.iter_mut()) {
            if d.is_none() {
                match f.as_mut().poll(cx) {
                    Poll::Ready(v) => *d = Some(v),
                    Poll::Pending => pending = true,
                }
            }
        }
        if pending {
            Poll::Pending
        } else {
            Poll::Ready(())
        }
    })
    .await;
    drop(futs);
    let mut total = EmbeddedOut::default();
    for (conn, out) in done.into_iter().flatten() {
        if let Some(c) = conn {
            pool.push(c);
        }
        total.count += out.count;
        total.bytes += out.bytes;
        total.failed += out.failed;
        total.errors += out.errors;
    }
    total
}

/// Send one request under the connection policy (and, with `[embedded]`, fetch the page's
/// embedded objects) and log it.
#[allow(clippy::too_many_arguments)]
async fn request(ctx: &Ctx, user: u32, session: u64, page: usize, req: &Req, intended_s: f64, conns: &mut UserConns, prev: Prev) -> Outcome {
    let close = ctx.policy == Policy::PerRequest;
    let bytes = ctx.request_bytes(page, req, close);
    let intended_ns = ctx.ns_at(intended_s);
    ctx.in_flight.set(ctx.in_flight.get() + 1);
    let mut guard = InFlight {
        ctx,
        rec: Some(Record {
            user,
            session,
            state: page as u16,
            path: req.path.clone(),
            intended_ns,
            start_ns: intended_ns,
            first_byte_ns: 0,
            end_ns: 0,
            status: 0,
            bytes: 0,
            error: None,
            phase: ctx.phase_at(intended_s),
            embedded: None,
            embedded_bytes: 0,
            embedded_failed: 0,
        }),
    };
    let permit = match &ctx.pool {
        Some(p) => p.sem.acquire().await.ok(),
        None => None,
    };
    let conn = match (ctx.policy, &ctx.pool) {
        (Policy::Pool, Some(p)) => p.idle.borrow_mut().pop(),
        (Policy::PerUser, _) => conns.page.take(),
        _ => None,
    };
    let start_ns = clock::now_ns();
    if let Some(r) = guard.rec.as_mut() {
        r.start_ns = start_ns;
    }
    // realized think time (end of the previous request to this start), counted only for think
    // times that began early enough that none could be cut off by the run's end (no censoring)
    if prev.end_ns > 0 && prev.uncensored {
        let mut st = ctx.stats.borrow_mut();
        st.think_real_sum += (start_ns - prev.end_ns) as f64 / 1e9;
        st.think_pair_drawn_sum += prev.think_s;
        st.think_real_n += 1;
    }
    let mut body = if ctx.needs_body { Some(Vec::new()) } else { None };
    let (result, conn) = exchange(ctx, conn, &bytes, body.as_mut(), close).await;
    // give the connection back
    if let Some(c) = conn {
        match (ctx.policy, &ctx.pool) {
            (Policy::Pool, Some(p)) => p.idle.borrow_mut().push(c),
            (Policy::PerUser, _) => conns.page = Some(c),
            _ => {}
        }
    }
    drop(permit);
    let end_ns = clock::now_ns();
    let mut force_back = false;
    {
        let rec = guard.rec.as_mut().expect("record");
        rec.end_ns = end_ns;
        match result {
            Ok(r) => {
                rec.status = r.status;
                rec.bytes = r.bytes;
                rec.first_byte_ns = r.first_byte_ns;
                if r.status >= 500 {
                    rec.error = Some(ErrorKind::Http5xx);
                } else if let Some(b) = &body {
                    if ctx.wl.error_markers.iter().any(|m| contains(b, m)) {
                        rec.error = Some(ErrorKind::Marker);
                    } else if ctx.wl.back_on.iter().any(|m| contains(b, m)) {
                        force_back = true;
                    }
                }
            }
            Err(k) => {
                rec.error = Some(k);
                body = None;
            }
        }
    }
    // embedded objects (TPC-W WIRT): the page's time runs to the last byte of the last object
    let page_ok = guard.rec.as_ref().is_some_and(|r| r.error.is_none());
    if let (Some(emb), true, Some(b)) = (ctx.wl.embedded.as_ref(), page_ok, body.as_deref()) {
        let urls = embedded_urls(b, &emb.pattern, &req.path, &ctx.target.host_header, emb.max_objects);
        let got = fetch_embedded(ctx, &urls, &mut conns.embedded, emb.connections, close).await;
        let end = clock::now_ns();
        let rec = guard.rec.as_mut().expect("record");
        rec.end_ns = end;
        rec.embedded = Some(got.count);
        rec.embedded_bytes = got.bytes;
        rec.embedded_failed = got.failed;
        if got.errors > 0 {
            rec.error = Some(ErrorKind::Embedded);
        }
    }
    let rec = guard.rec.take().expect("record");
    drop(guard);
    let (error, end_ns) = (rec.error, rec.end_ns);
    ctx.emit(rec);
    Outcome { error, end_s: (end_ns - ctx.t0_ns) as f64 / 1e9, end_ns, force_back, body }
}

fn contains(hay: &[u8], needle: &[u8]) -> bool {
    !needle.is_empty() && hay.windows(needle.len()).any(|w| w == needle)
}

fn pick_type(ctx: &Ctx, rng: &mut SmallRng) -> usize {
    let types = &ctx.wl.session_types;
    if types.len() == 1 {
        return 0;
    }
    let total: f64 = types.iter().map(|t| t.weight).sum();
    let mut u = rng.gen::<f64>() * total;
    for (i, t) in types.iter().enumerate() {
        if u < t.weight {
            return i;
        }
        u -= t.weight;
    }
    types.len() - 1
}

fn think_for(ctx: &Ctx, page: usize, at_s: f64, rng: &mut SmallRng) -> f64 {
    let mean = ctx.wl.pages[page].think_mean_s.unwrap_or(ctx.wl.think_mean_s);
    if mean <= 0.0 {
        return 0.0;
    }
    let z = ctx.think.borrow_mut().draw(mean, at_s, rng);
    let mut st = ctx.stats.borrow_mut();
    st.think_drawn_sum += z;
    st.think_drawn_n += 1;
    z
}

/// Walk one session starting at `intended` (s). Returns the instant the next session may start
/// (after the final think time), or None when the run is over.
async fn session(ctx: &Ctx, user: u32, stype: usize, rng: &mut SmallRng, conns: &mut UserConns, mut intended: f64, prev: &mut Prev) -> Option<f64> {
    let chain = &ctx.wl.chains[ctx.wl.session_types[stype].chain];
    let start = ctx.wl.start;
    let sid = ctx.sessions.get();
    ctx.sessions.set(sid + 1);
    let mut vars = ctx.draw_vars(stype, rng);
    // TPC-W user session minimum duration: the session ends at the first move to the start
    // page whose request would start after it
    let min_end = if ctx.wl.session_min_mean_s > 0.0 {
        Some(intended + super::think::truncated_exp_at(ctx.wl.session_min_mean_s, ctx.wl.session_min_max_s, rng))
    } else {
        None
    };
    let mut walker: Walker<Req> = Walker::new(start);
    let mut cur = ctx.render_start(&vars, rng);
    let mut n = 0u32;
    loop {
        if ctx.stop.get() || intended >= ctx.end_s {
            return None;
        }
        let out = request(ctx, user, sid, walker.current, &cur, intended, conns, *prev).await;
        n += 1;
        let z = think_for(ctx, walker.current, out.end_s, rng);
        // realized think times are measured for requests of the run phase whose think time
        // cannot be cut off by the end of the run (10 x the largest mean before the end)
        let measured = ctx.phase_at(intended) == 1 && out.end_s + 10.0 * ctx.max_think_mean <= ctx.end_s;
        *prev = Prev { end_ns: out.end_ns, think_s: z, uncensored: measured };
        // the next request is scheduled on the timer grid (rounded to the nearest multiple of
        // the quantum: the mean think time is unchanged, and users due in the same quantum
        // share one wake-up of the event loop)
        let next = if z > 0.0 { ctx.align(out.end_s + z) } else { out.end_s };
        let mut ended = false;
        if out.error.is_some_and(|e| e != ErrorKind::Embedded) {
            // RUBBoS: an error restarts the session at the start page (same session); a failed
            // embedded object does not (the page itself arrived)
            walker.restart(start);
            cur = ctx.render_start(&vars, rng);
        } else {
            let body: &[u8] = out.body.as_deref().unwrap_or(b"");
            ctx.learn(stype, &mut vars, body);
            if n >= ctx.wl.max_transitions {
                ended = true;
            } else {
                let mut t = walker.draw(chain, out.force_back, rng);
                if t == To::Page(start) && min_end.is_some_and(|e| next >= e) {
                    ended = true;
                } else {
                    let mut rendered = None;
                    if let To::Page(j) = t {
                        match ctx.render(j, &Env::new(&vars, body, &cur.path, &ctx.words), rng) {
                            Ok(r) => rendered = Some(r),
                            Err(Fallback::Back) => t = To::Back,
                            Err(Fallback::Restart) => {
                                walker.restart(start);
                                t = To::Page(start);
                                rendered = Some(ctx.render_start(&vars, rng));
                            }
                        }
                    }
                    match walker.apply(chain, t, &cur) {
                        Move::Go(_) => cur = rendered.expect("rendered page"),
                        Move::Back(_, r) => cur = r,
                        Move::Restart => {
                            walker.restart(start);
                            cur = ctx.render_start(&vars, rng);
                        }
                        Move::End => ended = true,
                    }
                }
            }
        }
        drop(out);
        if next >= ctx.end_s || ctx.stop.get() {
            return None;
        }
        if ended {
            return Some(next);
        }
        ctx.sleep_until_s(next).await;
        intended = next;
    }
}

impl Ctx {
    fn static_or_empty(&self, i: usize) -> Arc<str> {
        self.static_paths[i].clone().unwrap_or_else(|| Arc::from(format!("{}{}", self.target.prefix, self.wl.pages[i].url.literal())))
    }
}

struct Active<'a>(&'a Ctx);
impl<'a> Active<'a> {
    fn new(ctx: &'a Ctx) -> Active<'a> {
        ctx.active_users.set(ctx.active_users.get() + 1);
        Active(ctx)
    }
}
impl Drop for Active<'_> {
    fn drop(&mut self) {
        self.0.active_users.set(self.0.active_users.get() - 1);
    }
}

async fn closed_user(ctx: Rc<Ctx>, user: u32, first_at: f64) {
    let ctx = &*ctx;
    let mut rng = SmallRng::seed_from_u64(mix(ctx.seed, user as u64));
    let stype = pick_type(ctx, &mut rng);
    let mut conns = UserConns::default();
    let first_at = ctx.align(first_at);
    ctx.sleep_until_s(first_at).await;
    let _active = Active::new(ctx);
    let mut at = first_at;
    let mut prev = Prev::default();
    while let Some(next) = session(ctx, user, stype, &mut rng, &mut conns, at, &mut prev).await {
        ctx.sleep_until_s(next).await;
        at = next;
    }
}

async fn open_arrival(ctx: Rc<Ctx>, k: u64, at: f64) {
    let ctx = &*ctx;
    let mut rng = SmallRng::seed_from_u64(mix(ctx.seed, k));
    let stype = pick_type(ctx, &mut rng);
    let mut conns = UserConns::default();
    let _active = Active::new(ctx);
    let mut prev = Prev::default();
    match ctx.wl.arrivals.as_ref().map(|a| a.unit) {
        Some(Unit::Session) => {
            let _ = session(ctx, k as u32, stype, &mut rng, &mut conns, at, &mut prev).await;
        }
        _ => {
            let sid = ctx.sessions.get();
            ctx.sessions.set(sid + 1);
            let vars = ctx.draw_vars(stype, &mut rng);
            let start = ctx.wl.start;
            let req = ctx.render_start(&vars, &mut rng);
            let _ = request(ctx, k as u32, sid, start, &req, at, &mut conns, Prev::default()).await;
        }
    }
}

/// Open-loop arrivals. The arrival instants are kept by a small thread that sleeps with the
/// OS's high-resolution timer (not the runtime's 1 ms wheel) and hands each arrival to the event
/// loop when it is due, so requests start within tens of microseconds of their intended instant
/// and the latency measured from that instant is not inflated by the generator's own timer.
async fn open_loop(ctx: Rc<Ctx>) {
    let a = ctx.wl.arrivals.clone().expect("arrivals");
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<(u64, f64)>();
    let (t0, end_s, seed) = (ctx.t0, ctx.end_s, ctx.seed);
    std::thread::Builder::new()
        .name("arrivals".into())
        .spawn(move || {
            let mut arr = Arrivals::new(a.rate_per_s, a.dispersion, a.contrast, seed);
            let mut k = 0u64;
            loop {
                let t = arr.next();
                if t >= end_s {
                    break;
                }
                let due = t0 + Duration::from_secs_f64(t);
                let now = Instant::now();
                if due > now {
                    std::thread::sleep(due - now);
                }
                if tx.send((k, t)).is_err() {
                    break; // the run is over
                }
                k += 1;
            }
        })
        .expect("arrivals thread");
    while let Some((k, t)) = rx.recv().await {
        if ctx.stop.get() {
            break;
        }
        tokio::task::spawn_local(open_arrival(ctx.clone(), k, t));
    }
}

async fn progress(ctx: Rc<Ctx>, quiet: bool) {
    let mut next = 1.0;
    let mut last = 0.0;
    loop {
        ctx.sleep_until_s(next).await;
        let now = ctx.now_s();
        let line = ctx.stats.borrow_mut().tick(now, ctx.phase_at(now.min(ctx.end_s - 1e-9)), ctx.active_users.get(), ctx.in_flight.get(), now - last);
        ctx.flush_batch();
        if !quiet {
            use std::io::Write;
            let mut out = std::io::stdout().lock();
            let _ = writeln!(out, "{line}");
            let _ = out.flush();
        }
        last = now;
        next += 1.0;
    }
}

async fn interrupted() -> &'static str {
    use tokio::signal::unix::{signal, SignalKind};
    let mut int = signal(SignalKind::interrupt()).expect("SIGINT handler");
    let mut term = signal(SignalKind::terminate()).expect("SIGTERM handler");
    tokio::select! {
        _ = int.recv() => "SIGINT",
        _ = term.recv() => "SIGTERM",
    }
}

/// The shared state of a run (the clock starts now).
fn new_ctx(wl: Workload, target: Target, log: Option<Sender<Vec<Record>>>, seed: u64) -> Rc<Ctx> {
    let names: Vec<String> = wl.pages.iter().map(|p| p.name.clone()).collect();
    let (t0, t0_ns) = {
        let _ = clock::base();
        let t0 = Instant::now();
        (t0, clock::now_ns())
    };
    let static_paths = wl
        .pages
        .iter()
        .map(|p| if p.url.is_literal() && p.method == Method::Get { Some(Arc::from(format!("{}{}", target.prefix, p.url.literal()))) } else { None })
        .collect();
    let var_names = wl.session_types.iter().map(|t| t.vars.iter().map(|(n, _)| Arc::from(n.as_str())).collect()).collect();
    let learns = wl.session_types.iter().map(|t| t.vars.iter().any(|(_, p)| matches!(p, super::params::Param::Learn { .. }))).collect();
    let policy = match (wl.policy, wl.arrivals.as_ref().map(|a| a.unit)) {
        (Policy::PerUser, Some(Unit::Request)) => Policy::PerRequest,
        (p, _) => p,
    };
    // the think-time MMPP is that of one user (rate 1 / mean, as in Mi et al. 2009); its state
    // is shared by all users so that their surges coincide
    let nominal_rate = if wl.think_mean_s > 0.0 { 1.0 / wl.think_mean_s } else { 0.0 };
    let think = Think::new(if wl.arrivals.is_some() { 1.0 } else { wl.think_dispersion }, wl.think_contrast, nominal_rate, seed);
    let end_s = wl.ramp_up_s + wl.run_s + wl.ramp_down_s;
    let mut stats = Stats::new(names);
    stats.from_intended = wl.arrivals.is_some();
    if wl.embedded.is_some() {
        stats.embedded = Some([0; 4]);
    }
    let mut ctx = Ctx {
        target,
        t0,
        t0_ns,
        end_s,
        stop: Cell::new(false),
        stats: RefCell::new(stats),
        batch: RefCell::new(Vec::with_capacity(BATCH)),
        log: RefCell::new(log),
        active_users: Cell::new(0),
        in_flight: Cell::new(0),
        sessions: Cell::new(0),
        think: RefCell::new(think),
        pool: if policy == Policy::Pool {
            Some(Pool { sem: Semaphore::new(wl.pool_size), idle: RefCell::new(Vec::with_capacity(wl.pool_size)) })
        } else {
            None
        },
        words: super::workload::builtin_words(),
        static_paths,
        var_names,
        needs_body: wl.needs_body(),
        seed,
        connect_timeout: Duration::from_secs_f64(wl.connect_timeout_s),
        request_timeout: Duration::from_secs_f64(wl.request_timeout_s),
        policy,
        quantum_s: wl.think_quantum_ms / 1000.0,
        deadlines: RefCell::new(Deadlines::default()),
        static_requests: vec![],
        learns,
        max_think_mean: wl.pages.iter().filter_map(|p| p.think_mean_s).fold(wl.think_mean_s, f64::max),
        wl,
    };
    ctx.static_requests = (0..ctx.wl.pages.len())
        .map(|i| {
            ctx.static_paths[i].as_ref().map(|p| {
                let req = Req { path: p.clone(), form: None };
                Arc::from(ctx.build_request(i, &req, ctx.policy == Policy::PerRequest))
            })
        })
        .collect();
    Rc::new(ctx)
}

pub fn run(wl: Workload, target: Target, log: Option<&Path>, seed: u64, quiet: bool) -> Result<i32> {
    let names: Vec<String> = wl.pages.iter().map(|p| p.name.clone()).collect();
    let writer = match log {
        Some(p) => Some(LogWriter::create(p, names)?),
        None => None,
    };
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    let ctx = new_ctx(wl, target, writer.as_ref().map(|w| w.sender()), seed);
    let local = LocalSet::new();
    let signal = local.block_on(&rt, async {
        if ctx.wl.arrivals.is_some() {
            tokio::task::spawn_local(open_loop(ctx.clone()));
        } else {
            let n = ctx.wl.users;
            for u in 0..n {
                let at = if n > 0 { ctx.wl.ramp_up_s * u as f64 / n as f64 } else { 0.0 };
                tokio::task::spawn_local(closed_user(ctx.clone(), u, at));
            }
        }
        tokio::task::spawn_local(progress(ctx.clone(), quiet));
        tokio::task::spawn_local(watchdog(ctx.clone()));
        let sig = tokio::select! {
            _ = ctx.sleep_until_s(ctx.end_s) => None,
            s = interrupted() => Some(s),
        };
        ctx.stop.set(true);
        // let requests in flight finish (bounded), then cut the rest off (logged as cancelled)
        let grace = ctx.request_timeout.min(Duration::from_secs(2));
        let grace_end = Instant::now() + grace;
        let wait = async {
            while ctx.in_flight.get() > 0 && Instant::now() < grace_end {
                tokio::time::sleep(Duration::from_millis(2)).await;
            }
        };
        let sig2 = tokio::select! {
            _ = wait => None,
            s = interrupted() => Some(s),
        };
        sig.or(sig2)
    });
    let elapsed = ctx.now_s();
    drop(local); // drops every task: requests still in flight are logged as cancelled
    ctx.flush_batch();
    ctx.log.borrow_mut().take();
    let mut extra = Map::new();
    extra.insert("workload".into(), json!(ctx.wl.name));
    extra.insert("elapsed_s".into(), json!(elapsed));
    extra.insert("interrupted".into(), json!(signal.is_some()));
    extra.insert("sessions".into(), json!(ctx.sessions.get()));
    if let Some(w) = writer {
        let path = w.path.display().to_string();
        let rows = w.finish()?;
        extra.insert("log".into(), json!({"path": path, "rows": rows}));
    }
    let run_s = (elapsed.min(ctx.wl.ramp_up_s + ctx.wl.run_s) - ctx.wl.ramp_up_s).max(0.0);
    println!("{}", ctx.stats.borrow().summary(run_s, extra));
    drop(rt);
    Ok(match signal {
        Some("SIGINT") => 130,
        Some(_) => 143,
        None => 0,
    })
}

/// `--dry-run N`: walk sessions for N requests without sending anything (empty responses,
/// so extraction takes its `otherwise`). Counts per page, sessions, BACK/END moves.
pub fn simulate(wl: &Workload, requests: u64, seed: u64) -> String {
    let mut rng = SmallRng::seed_from_u64(seed);
    let words = super::workload::builtin_words();
    let mut counts = vec![0u64; wl.pages.len()];
    let (mut sessions, mut backs, mut ends, mut restarts, mut capped, mut min_ends) = (0u64, 0u64, 0u64, 0u64, 0u64, 0u64);
    let mut think_sum = 0.0;
    let mut done = 0u64;
    // simulated time: think times only (responses take no time)
    let mut clock_s = 0.0;
    let render = |i: usize, vars: &[(Arc<str>, String)], url: &str, rng: &mut SmallRng| -> Result<String, Fallback> {
        // a dry run assumes every extraction finds a link ("1")
        let env = Env { vars, body: b"", url, words: &words, dry: true };
        render_page(wl, "", i, &env, rng).map(|r| r.path.to_string())
    };
    let total_w: f64 = wl.session_types.iter().map(|t| t.weight).sum();
    while done < requests {
        let mut u = rng.gen::<f64>() * total_w;
        let mut stype = 0;
        for (i, t) in wl.session_types.iter().enumerate() {
            stype = i;
            if u < t.weight {
                break;
            }
            u -= t.weight;
        }
        let st = &wl.session_types[stype];
        let chain = &wl.chains[st.chain];
        let vars: Vec<(Arc<str>, String)> = st
            .vars
            .iter()
            .map(|(n, p)| {
                let mut v = String::new();
                let _ = p.value(&Env::new(&[], b"", "", &words), &mut rng, &mut v);
                (Arc::from(n.as_str()), v)
            })
            .collect();
        sessions += 1;
        let min_end = if wl.session_min_mean_s > 0.0 {
            Some(clock_s + super::think::truncated_exp_at(wl.session_min_mean_s, wl.session_min_max_s, &mut rng))
        } else {
            None
        };
        let mut walker: Walker<String> = Walker::new(wl.start);
        let mut cur = render(wl.start, &vars, "", &mut rng).unwrap_or_default();
        let mut n = 0;
        loop {
            counts[walker.current] += 1;
            done += 1;
            n += 1;
            let mean = wl.pages[walker.current].think_mean_s.unwrap_or(wl.think_mean_s);
            let z = super::think::truncated_exp(mean, &mut rng);
            think_sum += z;
            clock_s += z;
            if done >= requests {
                break;
            }
            if n >= wl.max_transitions {
                capped += 1;
                break;
            }
            let mut t = walker.draw(chain, false, &mut rng);
            if t == To::Page(wl.start) && min_end.is_some_and(|e| clock_s >= e) {
                min_ends += 1;
                break;
            }
            let mut rendered = None;
            if let To::Page(j) = t {
                match render(j, &vars, &cur, &mut rng) {
                    Ok(r) => rendered = Some(r),
                    Err(Fallback::Back) => t = To::Back,
                    Err(Fallback::Restart) => {
                        walker.restart(wl.start);
                        t = To::Page(wl.start);
                        rendered = Some(render(wl.start, &vars, "", &mut rng).unwrap_or_default());
                    }
                }
            }
            match walker.apply(chain, t, &cur) {
                Move::Go(_) => cur = rendered.unwrap_or_default(),
                Move::Back(_, r) => {
                    backs += 1;
                    cur = r;
                }
                Move::Restart => {
                    backs += 1;
                    restarts += 1;
                    walker.restart(wl.start);
                    cur = render(wl.start, &vars, "", &mut rng).unwrap_or_default();
                }
                Move::End => {
                    ends += 1;
                    break;
                }
            }
        }
    }
    let mut pages = Map::new();
    for (i, c) in counts.iter().enumerate() {
        pages.insert(wl.pages[i].name.clone(), json!(c));
    }
    json!({"dry_run": {
        "requests": done,
        "sessions": sessions,
        "pages": Value::Object(pages),
        "back": backs,
        "end": ends,
        "session_min_ends": min_ends,
        "restart_on_empty_history": restarts,
        "capped_sessions": capped,
        "mean_pages_per_session": done as f64 / sessions.max(1) as f64,
        "mean_session_s": clock_s / sessions.max(1) as f64,
        "think_mean_s": think_sum / done.max(1) as f64,
    }})
    .to_string()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Mutex;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::TcpListener;

    type Seen = Arc<Mutex<Vec<String>>>;

    /// A keep-alive HTTP/1.1 server: `reply(path)` gives (status, body, delay before answering);
    /// returns its address, the paths requested in order and the connections accepted.
    async fn serve(reply: fn(&str) -> (u16, String, u64)) -> (std::net::SocketAddr, Seen, Arc<AtomicUsize>) {
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap();
        let seen: Seen = Arc::new(Mutex::new(vec![]));
        let conns = Arc::new(AtomicUsize::new(0));
        let (s2, c2) = (seen.clone(), conns.clone());
        tokio::task::spawn_local(async move {
            loop {
                let (mut sock, _) = l.accept().await.unwrap();
                c2.fetch_add(1, Ordering::SeqCst);
                let seen = s2.clone();
                tokio::task::spawn_local(async move {
                    let mut buf = Vec::new();
                    let mut chunk = [0u8; 4096];
                    loop {
                        while !buf.windows(4).any(|w| w == b"\r\n\r\n") {
                            match sock.read(&mut chunk).await {
                                Ok(0) | Err(_) => return,
                                Ok(n) => buf.extend_from_slice(&chunk[..n]),
                            }
                        }
                        let end = buf.windows(4).position(|w| w == b"\r\n\r\n").unwrap() + 4;
                        let head = String::from_utf8_lossy(&buf[..end]).into_owned();
                        buf.drain(..end);
                        let path = head.split_whitespace().nth(1).unwrap_or("").to_string();
                        seen.lock().unwrap().push(path.clone());
                        let (status, body, delay) = reply(&path);
                        tokio::time::sleep(Duration::from_millis(delay)).await;
                        let resp = format!("HTTP/1.1 {status} X\r\nContent-Length: {}\r\n\r\n{body}", body.len());
                        if sock.write_all(resp.as_bytes()).await.is_err() {
                            return;
                        }
                    }
                });
            }
        });
        (addr, seen, conns)
    }

    fn site(path: &str) -> (u16, String, u64) {
        if path.starts_with("/page") {
            // 5 distinct objects on the target (one twice, one elsewhere, one data: URL)
            let body = "<html><img src=\"/img/a.gif\"><IMG SRC='/img/b.gif'> <img src=\"img/c.gif\">\
                <img src=\"/img/a.gif\"> <img src=\"http://example.com/x.gif\"> <img src=\"data:image/gif;base64,AA\">\
                <input type=\"image\" src=\"/img/d.gif\"> <img alt=\"t\" src=\"/img/e.gif\"></html>";
            (200, body.to_string(), 10)
        } else if path.contains("missing") {
            (404, "no".into(), 0)
        } else if path.contains("busy") {
            (503, "busy".into(), 0)
        } else {
            (200, "GIF89a-image-bytes".into(), 40)
        }
    }

    fn workload(extra: &str) -> Workload {
        let text = format!("[workload]\nstart = \"P\"\n[users]\ncount = 1\n{extra}\n[[pages]]\nname = \"P\"\nurl = \"/page\"\n");
        super::super::workload::parse(&text, Path::new("t.toml")).unwrap()
    }

    fn block_on<F: std::future::Future>(f: F) -> F::Output {
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        LocalSet::new().block_on(&rt, f)
    }

    /// 10 objects, 4 connections, 40 ms each: three rounds (>= 120 ms), 4 connections opened
    /// once and kept alive for the next page; every object requested exactly once; 404s are
    /// failed objects, 503s and unreachable objects are page errors.
    #[test]
    fn embedded_pool_fetches_each_object_once_on_at_most_n_kept_alive_connections() {
        block_on(async {
            let (addr, seen, conns) = serve(site).await;
            let ctx = new_ctx(workload("[embedded]\nconnections = 4"), Target::parse(&format!("http://{addr}")).unwrap(), None, 1);
            tokio::task::spawn_local(watchdog(ctx.clone()));
            let urls: Vec<String> = (0..10).map(|i| format!("/img/{i}.gif")).collect();
            let mut pool = vec![];
            let t = Instant::now();
            let out = fetch_embedded(&ctx, &urls, &mut pool, 4, false).await;
            let el = t.elapsed();
            assert_eq!((out.count, out.failed, out.errors), (10, 0, 0));
            assert_eq!(out.bytes, 10 * "HTTP/1.1 200 X\r\nContent-Length: 18\r\n\r\nGIF89a-image-bytes".len() as u64);
            assert!(el >= Duration::from_millis(120) && el < Duration::from_millis(400), "{el:?}");
            assert_eq!(conns.load(Ordering::SeqCst), 4);
            assert_eq!(pool.len(), 4);
            let mut got = seen.lock().unwrap().clone();
            got.sort();
            let mut want = urls.clone();
            want.sort();
            assert_eq!(got, want);
            // the next page: the kept-alive connections are reused
            let out = fetch_embedded(&ctx, &urls[..3], &mut pool, 4, false).await;
            assert_eq!(out.count, 3);
            assert_eq!(conns.load(Ordering::SeqCst), 4);
            assert_eq!(pool.len(), 4);
            // one connection only: strictly sequential
            let mut one = vec![];
            let t = Instant::now();
            fetch_embedded(&ctx, &urls[..3], &mut one, 1, false).await;
            assert!(t.elapsed() >= Duration::from_millis(120));
            assert_eq!(one.len(), 1);
            // 404: a failed object, not a page error; 503: both
            let bad = vec!["/img/missing.gif".to_string(), "/img/busy.gif".to_string(), "/img/ok.gif".to_string()];
            let out = fetch_embedded(&ctx, &bad, &mut pool, 4, false).await;
            assert_eq!((out.count, out.failed, out.errors), (3, 2, 1));
        });
    }

    /// The page's logged time runs from its request to the last byte of its last object; the
    /// row counts the objects; the objects are not rows.
    #[test]
    fn page_time_includes_its_embedded_objects() {
        block_on(async {
            let (addr, seen, conns) = serve(site).await;
            let ctx = new_ctx(workload("[embedded]\nconnections = 4"), Target::parse(&format!("http://{addr}")).unwrap(), None, 1);
            tokio::task::spawn_local(watchdog(ctx.clone()));
            let mut uc = UserConns::default();
            let req = Req { path: Arc::from("/page"), form: None };
            let out = request(&ctx, 0, 0, 0, &req, 0.0, &mut uc, Prev::default()).await;
            assert_eq!(out.error, None);
            let batch = ctx.batch.borrow();
            assert_eq!(batch.len(), 1);
            let r = &batch[0];
            assert_eq!(r.embedded, Some(5));
            assert_eq!(r.embedded_failed, 0);
            // page 10 ms, then 5 objects of 40 ms on 4 connections: two rounds
            let ms = (r.end_ns - r.start_ns) as f64 / 1e6;
            assert!(ms >= 90.0, "{ms} ms");
            assert!(r.first_byte_ns - r.start_ns < 80_000_000);
            let mut got = seen.lock().unwrap().clone();
            assert_eq!(got[0], "/page");
            got.sort();
            assert_eq!(got, vec!["/img/a.gif", "/img/b.gif", "/img/c.gif", "/img/d.gif", "/img/e.gif", "/page"]);
            assert_eq!(conns.load(Ordering::SeqCst), 1 + 4);
            assert!(uc.page.is_some() && uc.embedded.len() == 4);
            assert!((out.end_s - ctx.now_s()).abs() < 0.05);
        });
    }

    /// TPC-W USMD: without END a session ends only at a move to the start page after its
    /// minimum duration; sessions last at least the mean of the truncated draw.
    #[test]
    fn sessions_end_at_home_after_their_minimum_duration() {
        let text = "[workload]\nstart = \"H\"\nmax_transitions = 100000\nsession_min_mean_s = 60\n[think]\nmean_s = 1.0\n\
            [[pages]]\nname = \"H\"\nurl = \"/h\"\n[[pages]]\nname = \"A\"\nurl = \"/a\"\n\
            [transitions]\nH = { A = 0.9 }\nA = { H = 0.5, A = 0.5 }\n";
        let wl = super::super::workload::parse(text, Path::new("t.toml")).unwrap();
        assert_eq!(wl.session_min_max_s, 240.0);
        let out: Value = serde_json::from_str(&simulate(&wl, 400_000, 3)).unwrap();
        let d = &out["dry_run"];
        let sessions = d["sessions"].as_u64().unwrap();
        assert_eq!(d["end"], 0);
        assert!(d["session_min_ends"].as_u64().unwrap() + 1 >= sessions);
        // E[min(X, 240)] = 60 (1 - e^-4) = 58.9 s, plus the wait for the next move to H
        // (about 2.5 s of think here); 400k requests at ~1 s: ~6,000 sessions
        let mean_s = d["mean_session_s"].as_f64().unwrap();
        assert!((58.0..66.0).contains(&mean_s), "mean session {mean_s} s over {sessions}");
    }
}
