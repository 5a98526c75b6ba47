//! What a backend answered to a unit, either protocol, and what the write path does with the
//! answers of every backend: where the replies the client sees go (`Sink`), one backend's outcome
//! (`Exec`, `Res`), and the settling of a write (`settle`).
//!
//! The protocols differ in the transaction status a backend reports (PostgreSQL: ReadyForQuery's
//! byte, `I` when idle; MySQL: the status flags) and in their connections, which the recovery's
//! `Backends` already abstracts (acquire, release, disable, close).

use tokio::io::AsyncWriteExt;
use tokio::net::tcp::OwnedWriteHalf;

use super::client_io::Fail;
use super::recover::Backends;
use super::{pylist, Manager};

/// What one backend answered to a unit (the replies themselves are in the sink); `S` is the
/// protocol's transaction status.
#[derive(Clone, Default)]
pub(crate) struct Exec<S> {
    pub(crate) ok: bool,
    pub(crate) error: Option<String>,
    pub(crate) tags: Vec<String>,
    pub(crate) status: S,
    pub(crate) broken: bool,
}

/// Where the replies the client must see go: kept (`held`), and for a read also written to the
/// client once 64 KiB are held.
pub(crate) struct Sink<'a> {
    pub(crate) held: Vec<u8>,
    pub(crate) client: Option<&'a mut OwnedWriteHalf>,
    pub(crate) saw: bool,
    pub(crate) client_failed: bool,
}

impl Sink<'_> {
    /// A sink that only keeps (a write's: the client is answered once the wait policy says).
    pub(crate) fn collect() -> Sink<'static> {
        Sink { held: Vec::new(), client: None, saw: false, client_failed: false }
    }

    /// A sink that also writes to the client once 64 KiB are held (a read's).
    pub(crate) fn streaming(client: &mut OwnedWriteHalf) -> Sink<'_> {
        Sink { held: Vec::new(), client: Some(client), saw: false, client_failed: false }
    }

    pub(crate) async fn maybe_flush(&mut self) {
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

/// A read ran on backend `b` (routed with `token`): its answers the client has not seen yet queued
/// in `out`, the read counted and over there, a broken backend disabled. Ok(true): answered;
/// Ok(false): route it again (nothing reached the client yet); Err: the session ends (part of the
/// answer is out, or the client's socket failed).
#[allow(clippy::too_many_arguments)]
pub(crate) fn read_done<B: Backends, S>(
    m: &Manager,
    bs: &B,
    b: usize,
    token: Option<u64>,
    x: Exec<S>,
    sink: &mut Sink<'_>,
    out: &mut Vec<u8>,
) -> Result<bool, Fail> {
    if !x.broken && !sink.held.is_empty() {
        out.append(&mut sink.held);
    }
    m.read_over(b, token);
    {
        let mut st = m.state();
        st.b[b].reads += 1;
        st.counts.reads += 1;
    }
    if x.broken {
        bs.disable_unreachable(b, &format!("read failed: {}", x.error.as_deref().unwrap_or("None")));
        if sink.saw {
            return Err(Fail::End(x.error)); // part of the answer is out: the client connection cannot continue
        }
        m.count(|c| c.read_retries += 1);
        return Ok(false);
    }
    if !x.ok {
        m.count(|c| c.errors_to_clients += 1);
    }
    if sink.client_failed {
        return Err(Fail::End(None));
    }
    Ok(true)
}

/// One backend's complete answer to a unit of a write.
pub(crate) struct Res<C, S> {
    pub(crate) b: usize,
    pub(crate) conn: Option<C>,
    pub(crate) replies: Vec<u8>,
    pub(crate) x: Exec<S>,
}

/// After a write unit ran on every leased backend: disable the backends that failed where another
/// succeeded (or whose result differs), then either keep the connections for the transaction the
/// unit left open (returned: the lock stays with them) or give them back. `idle` says whether a
/// status is outside any transaction. Returns the position of the result that answers the client.
#[allow(clippy::type_complexity)]
pub(crate) fn settle<B: Backends, S: Copy>(
    m: &Manager,
    bs: &B,
    mut results: Vec<Res<B::Conn, S>>,
    chosen: Option<usize>,
    idle: fn(S) -> bool,
) -> (usize, Vec<Res<B::Conn, S>>, Option<Vec<(usize, B::Conn)>>) {
    let any_ok = results.iter().any(|r| r.x.ok);
    let c = chosen.or_else(|| results.iter().position(|r| r.x.ok)).or_else(|| results.iter().position(|r| !r.x.broken)).unwrap_or(0);
    let chosen_name = m.backends[results[c].b].name.clone();
    let chosen_tags = results[c].x.tags.clone();
    if any_ok {
        for r in &results {
            let err = r.x.error.as_deref().unwrap_or("None");
            if !r.x.ok {
                m.state().b[r.b].failed_writes += 1;
                let reason = format!("write failed where {chosen_name} succeeded: {err}");
                if r.x.broken {
                    bs.disable_unreachable(r.b, &reason); // its position says what it applied
                } else {
                    bs.disable(r.b, &reason);
                }
            } else if r.x.tags != chosen_tags {
                bs.disable(r.b, &format!("write result {} differs from {chosen_name}'s {}", pylist(&r.x.tags), pylist(&chosen_tags)));
            }
        }
    } else if results.iter().all(|r| r.x.broken) {
        for r in &results {
            bs.disable_unreachable(r.b, &format!("write failed: {}", r.x.error.as_deref().unwrap_or("None")));
        }
    }
    let alive: Vec<bool> = results.iter().map(|r| m.backends[r.b].enabled() && r.conn.is_some() && !r.x.broken).collect();
    let in_txn = results.iter().zip(&alive).any(|(r, &a)| a && !idle(r.x.status));
    let mut lease = Vec::new();
    for (r, &a) in results.iter_mut().zip(&alive) {
        let Some(mut conn) = r.conn.take() else { continue };
        if in_txn && a {
            lease.push((r.b, conn));
        } else {
            if in_txn {
                B::close(&mut conn); // a backend dropped from the transaction
            }
            bs.release(r.b, conn);
        }
    }
    (c, results, in_txn.then_some(lease))
}
