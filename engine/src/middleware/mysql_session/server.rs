//! The MySQL-protocol server: the backends checked and recovered, the listener, the sessions, the
//! series sampled, and the stats written at SIGTERM/SIGINT.

use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result};

use super::client::Session;
use super::cluster::Cluster;
use crate::middleware::{log, pylist, Manager, MiddlewareArgs};

/// Serve the MySQL protocol until SIGTERM/SIGINT (`tierscope-engine middleware --protocol mysql`).
pub async fn serve(m: Arc<Manager>, password: String, args: MiddlewareArgs, host: String, port: u16) -> Result<i32> {
    use tokio::signal::unix::{signal, SignalKind};
    let mut term = signal(SignalKind::terminate()).context("SIGTERM handler")?;
    let mut int = signal(SignalKind::interrupt()).context("SIGINT handler")?;
    let c = Arc::new(Cluster::new(m.clone(), &password, args.pool));
    if let Err(err) = c.check_backends(Duration::from_secs_f64(args.connect_timeout.max(0.0))).await {
        log(&err.0);
        return Ok(1);
    }
    if let Err(err) = c.recover().await {
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
        "listening on {} (mysql); backends {}; policy {}; wait {}; pool {}; runtime tokio ({threads} threads)",
        args.listen,
        args.backend.join(", "),
        m.policy.name(),
        args.wait,
        args.pool
    ));
    let accept = {
        let c = c.clone();
        tokio::spawn(async move {
            let mut ids: u32 = 0;
            loop {
                match listener.accept().await {
                    Ok((stream, _)) => {
                        let _ = stream.set_nodelay(true);
                        ids = ids.wrapping_add(1);
                        tokio::spawn(Session::new(c.clone(), stream, ids).run());
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
    tokio::select! {
        _ = term.recv() => {}
        _ = int.recv() => {}
    }
    if let Some(s) = series {
        s.abort();
    }
    accept.abort();
    // a write answered with wait=first may still run on a slower backend
    let mut rx = m.inflight.subscribe();
    let _ = tokio::time::timeout(Duration::from_secs(10), rx.wait_for(|&n| n == 0)).await;
    for p in &c.pools {
        p.drop_idle();
    }
    let stats = c.stats();
    if let Some(path) = &args.stats {
        if let Err(err) = crate::middleware::write_stats(path, &stats) {
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
