//! One page request: sent under the connection policy, its embedded objects fetched, its row
//! logged (also when it is cut off by the end of the run).

use super::conn::{exchange, UserConns};
use super::ctx::Ctx;
use super::objects::fetch_embedded;
use super::render::Req;
use crate::load::clock;
use crate::load::embedded::embedded_urls;
use crate::load::http::ErrorKind;
use crate::load::log::Record;
use crate::load::workload::Policy;

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
pub(super) struct Prev {
    pub(super) end_ns: i64,
    pub(super) think_s: f64,
    pub(super) uncensored: bool,
}

pub(super) struct Outcome {
    pub(super) error: Option<ErrorKind>,
    pub(super) end_s: f64,
    pub(super) end_ns: i64,
    pub(super) force_back: bool,
    pub(super) body: Option<Vec<u8>>,
}

/// Send one request under the connection policy (and, with `[embedded]`, fetch the page's
/// embedded objects) and log it.
#[allow(clippy::too_many_arguments)] // what a request needs from its user loop: a struct would be unpacked at once
pub(super) async fn request(
    ctx: &Ctx,
    user: u32,
    session: u64,
    page: usize,
    req: &Req,
    intended_s: f64,
    conns: &mut UserConns,
    prev: Prev,
) -> Outcome {
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
    let conn = ctx.take_conn(conns);
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
    let (result, conn) = exchange(ctx, conn, &bytes, body.as_mut(), close, ctx.paced).await;
    // give the connection back
    if let Some(c) = conn {
        ctx.give_back(conns, c);
    }
    drop(permit);
    // a response picked up at a grid edge ended when its last byte arrived
    let end_ns = match &result {
        Ok(r) if r.last_byte_ns > 0 => r.last_byte_ns.max(start_ns),
        _ => clock::now_ns(),
    };
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
