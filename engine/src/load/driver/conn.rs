//! Connection handling: connections taken from and given back to the shared pool (policy
//! `pool`) or the user's own (policy `per-user`, and the embedded objects' kept-alive pool), and
//! one exchange on a connection under the request timeout, with the retry of a stale kept-alive
//! connection.

use super::ctx::Ctx;
use super::deadline::Deadline;
use crate::load::http::{self, Conn, ErrorKind, ExchangeError};
use crate::load::workload::Policy;

const BODY_CAP: usize = 4 << 20;

/// A user's own connections: the page connection (policy per-user) and the small kept-alive
/// pool for embedded objects (at most `[embedded] connections`).
#[derive(Default)]
pub(super) struct UserConns {
    pub(super) page: Option<Conn>,
    pub(super) embedded: Vec<Conn>,
}

impl Ctx {
    /// A connection for the next page request under the policy (None: open a new one).
    pub(super) fn take_conn(&self, conns: &mut UserConns) -> Option<Conn> {
        match (self.policy, &self.pool) {
            (Policy::Pool, Some(p)) => p.idle.borrow_mut().pop(),
            (Policy::PerUser, _) => conns.page.take(),
            _ => None,
        }
    }

    /// Give a kept-alive connection back (to the pool or the user); per-request drops it.
    pub(super) fn give_back(&self, conns: &mut UserConns, c: Conn) {
        match (self.policy, &self.pool) {
            (Policy::Pool, Some(p)) => p.idle.borrow_mut().push(c),
            (Policy::PerUser, _) => conns.page = Some(c),
            _ => {}
        }
    }
}

/// One exchange on `conn` (or a new connection), under the request timeout; a kept-alive
/// connection found closed before any response byte is retried once on a new one. Returns the
/// response and the connection when it can be kept. `paced`: the response is picked up at the
/// next edge of the timer grid (`Ctx::paced`, `crate::load::grid`).
pub(super) async fn exchange(
    ctx: &Ctx,
    mut conn: Option<Conn>,
    bytes: &[u8],
    mut body: Option<&mut Vec<u8>>,
    close: bool,
    paced: bool,
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
        let grid = if paced && c.set_paced() { Some(&ctx.grid) } else { None };
        let res = {
            let exchange = std::pin::pin!(c.exchange(bytes, body.as_deref_mut(), BODY_CAP, grid));
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
