//! Who sends: closed-loop users (one task each, session after session) and open-loop arrivals
//! (a high-resolution timer thread hands each arrival to the event loop).

use std::rc::Rc;
use std::time::{Duration, Instant};

use rand::rngs::SmallRng;
use rand::SeedableRng;

use super::conn::UserConns;
use super::ctx::Ctx;
use super::request::{request, Prev};
use super::session::{pick_type, session};
use crate::load::arrivals::Arrivals;
use crate::load::workload::Unit;

fn mix(seed: u64, k: u64) -> u64 {
    // splitmix64
    let mut z = seed.wrapping_add(k.wrapping_mul(0x9E37_79B9_7F4A_7C15));
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

struct Active<'a>(&'a Ctx);

impl<'a> Active<'a> {
    fn new(ctx: &'a Ctx) -> Active<'a> {
        ctx.active_users.set(ctx.active_users.get() + 1);
        Active(ctx)
    }
}

impl Drop for Active<'_> {
    fn drop(&mut self) {
        self.0.active_users.set(self.0.active_users.get() - 1);
    }
}

pub(super) async fn closed_user(ctx: Rc<Ctx>, user: u32, first_at: f64) {
    let ctx = &*ctx;
    let mut rng = SmallRng::seed_from_u64(mix(ctx.seed, user as u64));
    let stype = pick_type(ctx, &mut rng);
    let mut conns = UserConns::default();
    let first_at = ctx.align(first_at);
    ctx.sleep_until_s(first_at).await;
    let _active = Active::new(ctx);
    let mut at = first_at;
    let mut prev = Prev::default();
    while let Some(next) = session(ctx, user, stype, &mut rng, &mut conns, at, &mut prev).await {
        ctx.sleep_until_s(next).await;
        at = next;
    }
}

async fn open_arrival(ctx: Rc<Ctx>, k: u64, at: f64) {
    let ctx = &*ctx;
    let mut rng = SmallRng::seed_from_u64(mix(ctx.seed, k));
    let stype = pick_type(ctx, &mut rng);
    let mut conns = UserConns::default();
    let _active = Active::new(ctx);
    let mut prev = Prev::default();
    match ctx.wl.arrivals.as_ref().map(|a| a.unit) {
        Some(Unit::Session) => {
            let _ = session(ctx, k as u32, stype, &mut rng, &mut conns, at, &mut prev).await;
        }
        _ => {
            let sid = ctx.sessions.get();
            ctx.sessions.set(sid + 1);
            let vars = ctx.draw_vars(stype, &mut rng);
            let start = ctx.wl.start;
            let req = ctx.render_start(&vars, &mut rng);
            let _ = request(ctx, k as u32, sid, start, &req, at, &mut conns, Prev::default()).await;
        }
    }
}

/// Open-loop arrivals. The arrival instants are kept by a small thread that sleeps with the
/// OS's high-resolution timer (not the runtime's 1 ms wheel) and hands each arrival to the event
/// loop when it is due, so requests start within tens of microseconds of their intended instant
/// and the latency measured from that instant is not inflated by the generator's own timer.
pub(super) async fn open_loop(ctx: Rc<Ctx>) {
    let a = ctx.wl.arrivals.clone().expect("arrivals");
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<(u64, f64)>();
    let (t0, end_s, seed) = (ctx.t0, ctx.end_s, ctx.seed);
    std::thread::Builder::new()
        .name("arrivals".into())
        .spawn(move || {
            let mut arr = Arrivals::new(a.rate_per_s, a.dispersion, a.contrast, seed);
            let mut k = 0u64;
            loop {
                let t = arr.next();
                if t >= end_s {
                    break;
                }
                let due = t0 + Duration::from_secs_f64(t);
                let now = Instant::now();
                if due > now {
                    std::thread::sleep(due - now);
                }
                if tx.send((k, t)).is_err() {
                    break; // the run is over
                }
                k += 1;
            }
        })
        .expect("arrivals thread");
    while let Some((k, t)) = rx.recv().await {
        if ctx.stop.get() {
            break;
        }
        tokio::task::spawn_local(open_arrival(ctx.clone(), k, t));
    }
}
