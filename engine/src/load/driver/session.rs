//! The user loop: one session's walk over the chain of pages, with think times, the TPC-W
//! minimum session duration, RUBBoS restarts on errors and learned session variables.

use rand::rngs::SmallRng;
use rand::Rng;

use super::conn::UserConns;
use super::ctx::Ctx;
use super::render::Req;
use super::request::{request, Prev};
use crate::load::http::ErrorKind;
use crate::load::markov::{Move, Target as To, Walker};
use crate::load::params::{Env, Fallback};

pub(super) fn pick_type(ctx: &Ctx, rng: &mut SmallRng) -> usize {
    let types = &ctx.wl.session_types;
    if types.len() == 1 {
        return 0;
    }
    let total: f64 = types.iter().map(|t| t.weight).sum();
    let mut u = rng.gen::<f64>() * total;
    for (i, t) in types.iter().enumerate() {
        if u < t.weight {
            return i;
        }
        u -= t.weight;
    }
    types.len() - 1
}

fn think_for(ctx: &Ctx, page: usize, at_s: f64, rng: &mut SmallRng) -> f64 {
    let mean = ctx.wl.pages[page].think_mean_s.unwrap_or(ctx.wl.think_mean_s);
    if mean <= 0.0 {
        return 0.0;
    }
    let z = ctx.think.borrow_mut().draw(mean, at_s, rng);
    let mut st = ctx.stats.borrow_mut();
    st.think_drawn_sum += z;
    st.think_drawn_n += 1;
    z
}

/// Walk one session starting at `intended` (s). Returns the instant the next session may start
/// (after the final think time), or None when the run is over.
pub(super) async fn session(
    ctx: &Ctx,
    user: u32,
    stype: usize,
    rng: &mut SmallRng,
    conns: &mut UserConns,
    mut intended: f64,
    prev: &mut Prev,
) -> Option<f64> {
    let chain = &ctx.wl.chains[ctx.wl.session_types[stype].chain];
    let start = ctx.wl.start;
    let sid = ctx.sessions.get();
    ctx.sessions.set(sid + 1);
    let mut vars = ctx.draw_vars(stype, rng);
    // TPC-W user session minimum duration: the session ends at the first move to the start
    // page whose request would start after it
    let min_end = if ctx.wl.session_min_mean_s > 0.0 {
        Some(intended + crate::load::think::truncated_exp_at(ctx.wl.session_min_mean_s, ctx.wl.session_min_max_s, rng))
    } else {
        None
    };
    let mut walker: Walker<Req> = Walker::new(start);
    let mut cur = ctx.render_start(&vars, rng);
    let mut n = 0u32;
    loop {
        if ctx.stop.get() || intended >= ctx.end_s {
            return None;
        }
        let out = request(ctx, user, sid, walker.current, &cur, intended, conns, *prev).await;
        n += 1;
        let z = think_for(ctx, walker.current, out.end_s, rng);
        // realized think times are measured for requests of the run phase whose think time
        // cannot be cut off by the end of the run (10 x the largest mean before the end)
        let measured = ctx.phase_at(intended) == 1 && out.end_s + 10.0 * ctx.max_think_mean <= ctx.end_s;
        *prev = Prev { end_ns: out.end_ns, think_s: z, uncensored: measured };
        // the next request is scheduled on the timer grid (rounded to the nearest multiple of
        // the quantum: the mean think time is unchanged, and users due in the same quantum
        // share one wake-up of the event loop)
        let next = if z > 0.0 { ctx.align(out.end_s + z) } else { out.end_s };
        let mut ended = false;
        if out.error.is_some_and(|e| e != ErrorKind::Embedded) {
            // RUBBoS: an error restarts the session at the start page (same session); a failed
            // embedded object does not (the page itself arrived)
            walker.restart(start);
            cur = ctx.render_start(&vars, rng);
        } else {
            let body: &[u8] = out.body.as_deref().unwrap_or(b"");
            ctx.learn(stype, &mut vars, body);
            if n >= ctx.wl.max_transitions {
                ended = true;
            } else {
                let mut t = walker.draw(chain, out.force_back, rng);
                if t == To::Page(start) && min_end.is_some_and(|e| next >= e) {
                    ended = true;
                } else {
                    let mut rendered = None;
                    if let To::Page(j) = t {
                        match ctx.render(j, &Env::new(&vars, body, &cur.path, &ctx.words), rng) {
                            Ok(r) => rendered = Some(r),
                            Err(Fallback::Back) => t = To::Back,
                            Err(Fallback::Restart) => {
                                walker.restart(start);
                                t = To::Page(start);
                                rendered = Some(ctx.render_start(&vars, rng));
                            }
                        }
                    }
                    match walker.apply(chain, t, &cur) {
                        Move::Go(_) => cur = rendered.expect("rendered page"),
                        Move::Back(_, r) => cur = r,
                        Move::Restart => {
                            walker.restart(start);
                            cur = ctx.render_start(&vars, rng);
                        }
                        Move::End => ended = true,
                    }
                }
            }
        }
        drop(out);
        if next >= ctx.end_s || ctx.stop.get() {
            return None;
        }
        if ended {
            return Some(next);
        }
        ctx.sleep_until_s(next).await;
        intended = next;
    }
}
