//! Reads: one backend chosen by the read policy (after the writes started before it have run
//! there), a stale pooled connection retried once, a failed backend disabled and the read routed
//! again.

use std::sync::Arc;
use std::time::Instant;

use super::client::{SResult, Session};
use super::execute::{execute, Sink};
use super::outgoing::Unit;
use crate::middleware::answer;

impl Session {
    pub(super) async fn read(&mut self, unit: &Unit, label: Option<Arc<str>>) -> SResult<()> {
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
                    c.disable_unreachable(b, &format!("read failed: {err}"));
                    m.count(|c| c.read_retries += 1);
                    m.read_over(b, token);
                    continue;
                }
            };
            let mut sink = Sink::streaming(&mut self.io.wr);
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
            if answer::read_done(&m, c.as_ref(), b, token, x, &mut sink, &mut self.io.out)? {
                return Ok(());
            }
        }
    }
}
