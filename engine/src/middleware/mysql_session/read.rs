//! Reads: one backend chosen by the read policy (after the writes started before it have run
//! there), a stale pooled connection retried once, a failed backend disabled and the read routed
//! again.

use std::sync::Arc;
use std::time::Instant;

use super::client::{Fail, SResult, Session};
use super::execute::{execute, Sink};
use super::outgoing::Unit;

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
                c.disable_unreachable(b, &format!("read failed: {}", x.error.as_deref().unwrap_or("None")));
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
}
