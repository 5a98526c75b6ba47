//! A page's embedded objects (TPC-W WIRT): fetched once each over up to `[embedded] connections`
//! parallel kept-alive connections of the user's own.

use std::cell::Cell;

use super::conn::exchange;
use super::ctx::Ctx;
use crate::load::http::Conn;

/// What fetching a page's embedded objects gave.
#[derive(Default, Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct EmbeddedOut {
    /// objects requested
    pub(super) count: u32,
    /// response bytes on the wire
    pub(super) bytes: u64,
    /// objects that did not come back 2xx/3xx
    pub(super) failed: u32,
    /// of those, the page errors: no response (connect, timeout, reset, unparseable) or 5xx
    pub(super) errors: u32,
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
        let (res, c) = exchange(ctx, conn.take(), &bytes, None, close, false).await;
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
pub(super) async fn fetch_embedded(ctx: &Ctx, urls: &[String], pool: &mut Vec<Conn>, connections: usize, close: bool) -> EmbeddedOut {
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
