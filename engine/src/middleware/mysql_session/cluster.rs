//! The manager and the MariaDB connection pools (one per backend, in the manager's order): giving
//! connections back, disabling a backend, the backends checked at start, the stats under this
//! protocol's name.

use std::sync::atomic::Ordering;
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use serde_json::json;

use super::conn::MyConn;
use super::pool::MyPool;
use crate::middleware::{Manager, NoBackend};

/// The manager and the MariaDB connection pools (one per backend, in the manager's order).
pub struct Cluster {
    pub(super) m: Arc<Manager>,
    pub(super) pools: Vec<MyPool>,
    pub(super) password: String,
    /// the first backend's server version (the clients' greeting names it)
    pub(super) version: OnceLock<String>,
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
    pub(super) fn release(&self, b: usize, conn: MyConn) {
        self.pools[b].release(conn);
        if !self.m.backends[b].enabled() {
            self.pools[b].drop_idle();
        }
    }

    pub(super) fn disable(&self, b: usize, reason: &str) {
        self.m.disable(b, reason);
        self.pools[b].drop_idle();
    }

    /// Disable `b` because it stopped answering (it may rejoin: `recover::rejoin`).
    pub(super) fn disable_unreachable(&self, b: usize, reason: &str) {
        self.m.disable_unreachable(b, reason);
        self.pools[b].drop_idle();
    }

    /// Open one connection to every backend (retrying up to `timeout`); a backend that never
    /// answers is disabled.
    pub(super) async fn check_backends(&self, timeout: Duration) -> Result<(), NoBackend> {
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
                        self.disable_unreachable(i, &format!("unreachable at start: {err}"));
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

    /// The manager's counts with this protocol's name and pools.
    pub(super) fn stats(&self) -> serde_json::Value {
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
