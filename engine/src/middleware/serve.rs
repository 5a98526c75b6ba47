//! The server, either protocol: the backends checked and recovered, the listener, a session per
//! client, the 50 ms series sampled, a backend that stopped answering brought back once it answers
//! (with a recovery log: `recover::rejoin`), and at SIGTERM/SIGINT the writes still running
//! awaited, the idle connections closed and the stats written.
//!
//! What differs between the protocols is a `Front`: the PostgreSQL one is the manager itself (its
//! pools are the backends' connections), MySQL's is `mysql_session::Cluster`.

use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result};
use serde_json::Value;
use tokio::net::TcpStream;

use super::recover::Rejoin;
use super::{log, pylist, write_stats, Manager, MiddlewareArgs, NoBackend};

/// How often a backend that stopped answering is tried again (with a recovery log).
const REJOIN_EVERY: Duration = Duration::from_secs(1);

/// A protocol's front end, as the server uses it.
pub(crate) trait Front: Send + Sync + 'static {
    /// how the start line names the protocol ("" for PostgreSQL, " (mysql)")
    const NAME: &'static str;
    fn manager(self: &Arc<Self>) -> Arc<Manager>;
    /// Open a connection to every backend (retrying up to `timeout`); one that never answers is
    /// disabled, none answering is an error.
    async fn check_backends(&self, timeout: Duration) -> Result<(), NoBackend>;
    /// The recovery at start (`--recovery-log`; nothing without one).
    async fn recover(&self) -> Result<(), NoBackend>;
    /// Serve one client connection (a task of its own).
    fn spawn_session(self: &Arc<Self>, stream: TcpStream, id: u32);
    /// Try to bring back backend `i`, disabled because it stopped answering (`recover::rejoin`).
    async fn rejoin(&self, i: usize) -> Rejoin;
    /// Close the backends' idle connections.
    fn drop_idle(&self);
    fn stats(&self) -> Value;
}

/// Serve until SIGTERM/SIGINT; the exit status (1: no backend, or the address cannot be had).
pub(crate) async fn serve<F: Front>(front: Arc<F>, args: MiddlewareArgs, host: String, port: u16) -> Result<i32> {
    use tokio::signal::unix::{signal, SignalKind};
    let mut term = signal(SignalKind::terminate()).context("SIGTERM handler")?;
    let mut int = signal(SignalKind::interrupt()).context("SIGINT handler")?;
    let m = front.manager();
    if let Err(err) = front.check_backends(Duration::from_secs_f64(args.connect_timeout.max(0.0))).await {
        log(&err.0);
        return Ok(1);
    }
    if let Err(err) = front.recover().await {
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
        "listening on {}{}; backends {}; policy {}; wait {}; pool {}; runtime tokio ({threads} threads)",
        args.listen,
        F::NAME,
        args.backend.join(", "),
        m.policy.name(),
        args.wait,
        args.pool
    ));
    let accept = {
        let front = front.clone();
        tokio::spawn(async move {
            let mut ids: u32 = 0;
            loop {
                match listener.accept().await {
                    Ok((stream, _)) => {
                        let _ = stream.set_nodelay(true);
                        ids = ids.wrapping_add(1);
                        front.spawn_session(stream, ids);
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
    // with a recovery log, a backend that stopped answering is tried every REJOIN_EVERY and
    // brought back once the log has brought it to the head (a signal cancels a rejoin in progress:
    // each replayed unit moved its position with it, so the next start goes on from there)
    let rejoining = m.recovery.is_some();
    let mut tick = tokio::time::interval(REJOIN_EVERY);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = term.recv() => break,
            _ = int.recv() => break,
            _ = async {
                tick.tick().await;
                for i in m.rejoinable() {
                    front.rejoin(i).await;
                }
            }, if rejoining => {}
        }
    }
    if let Some(s) = series {
        s.abort();
    }
    accept.abort();
    // a write answered with wait=first may still run on a slower backend
    let mut rx = m.inflight.subscribe();
    let _ = tokio::time::timeout(Duration::from_secs(10), rx.wait_for(|&n| n == 0)).await;
    front.drop_idle();
    let stats = front.stats();
    if let Some(path) = &args.stats {
        if let Err(err) = write_stats(path, &stats) {
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
