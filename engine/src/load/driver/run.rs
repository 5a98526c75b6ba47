//! A run: the runtime, the users or arrivals, the progress lines, the end (time, SIGINT or
//! SIGTERM, then a bounded grace for requests in flight) and the summary.

use std::path::Path;
use std::rc::Rc;
use std::time::{Duration, Instant};

use anyhow::Result;
use serde_json::{json, Map};
use tokio::task::LocalSet;

use super::ctx::{new_ctx, Ctx};
use super::deadline::watchdog;
use super::users::{closed_user, open_loop};
use crate::load::http::Target;
use crate::load::log::LogWriter;
use crate::load::workload::Workload;

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
                let at = ctx.ramp_up_at(u, n);
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
    println!("{}", summary(&ctx, elapsed, signal, writer)?);
    drop(rt);
    Ok(match signal {
        Some("SIGINT") => 130,
        Some(_) => 143,
        None => 0,
    })
}

/// The summary line, once the log is complete: the statistics of the run phase (the part of it
/// that was reached), the run's own facts, and the log's path and row count.
fn summary(ctx: &Ctx, elapsed: f64, signal: Option<&str>, writer: Option<LogWriter>) -> Result<String> {
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
    Ok(ctx.stats.borrow().summary(run_s, extra))
}
