//! `--dry-run N`: the walk without the network.

use std::sync::Arc;

use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use serde_json::{json, Map, Value};

use super::render::render_page;
use crate::load::markov::{Move, Target as To, Walker};
use crate::load::params::{Env, Fallback};
use crate::load::workload::Workload;

/// `--dry-run N`: walk sessions for N requests without sending anything (empty responses,
/// so extraction takes its `otherwise`). Counts per page, sessions, BACK/END moves.
pub fn simulate(wl: &Workload, requests: u64, seed: u64) -> String {
    let mut rng = SmallRng::seed_from_u64(seed);
    let words = crate::load::workload::builtin_words();
    let mut counts = vec![0u64; wl.pages.len()];
    let (mut sessions, mut backs, mut ends, mut restarts, mut capped, mut min_ends) = (0u64, 0u64, 0u64, 0u64, 0u64, 0u64);
    let mut think_sum = 0.0;
    let mut done = 0u64;
    // simulated time: think times only (responses take no time)
    let mut clock_s = 0.0;
    let render = |i: usize, vars: &[(Arc<str>, String)], url: &str, rng: &mut SmallRng| -> Result<String, Fallback> {
        // a dry run assumes every extraction finds a link ("1")
        let env = Env { vars, body: b"", url, words: &words, dry: true };
        render_page(wl, "", i, &env, rng).map(|r| r.path.to_string())
    };
    let total_w: f64 = wl.session_types.iter().map(|t| t.weight).sum();
    while done < requests {
        let mut u = rng.gen::<f64>() * total_w;
        let mut stype = 0;
        for (i, t) in wl.session_types.iter().enumerate() {
            stype = i;
            if u < t.weight {
                break;
            }
            u -= t.weight;
        }
        let st = &wl.session_types[stype];
        let chain = &wl.chains[st.chain];
        let vars: Vec<(Arc<str>, String)> = st
            .vars
            .iter()
            .map(|(n, p)| {
                let mut v = String::new();
                let _ = p.value(&Env::new(&[], b"", "", &words), &mut rng, &mut v);
                (Arc::from(n.as_str()), v)
            })
            .collect();
        sessions += 1;
        let min_end = if wl.session_min_mean_s > 0.0 {
            Some(clock_s + crate::load::think::truncated_exp_at(wl.session_min_mean_s, wl.session_min_max_s, &mut rng))
        } else {
            None
        };
        let mut walker: Walker<String> = Walker::new(wl.start);
        let mut cur = render(wl.start, &vars, "", &mut rng).unwrap_or_default();
        let mut n = 0;
        loop {
            counts[walker.current] += 1;
            done += 1;
            n += 1;
            let mean = wl.pages[walker.current].think_mean_s.unwrap_or(wl.think_mean_s);
            let z = crate::load::think::truncated_exp(mean, &mut rng);
            think_sum += z;
            clock_s += z;
            if done >= requests {
                break;
            }
            if n >= wl.max_transitions {
                capped += 1;
                break;
            }
            let mut t = walker.draw(chain, false, &mut rng);
            if t == To::Page(wl.start) && min_end.is_some_and(|e| clock_s >= e) {
                min_ends += 1;
                break;
            }
            let mut rendered = None;
            if let To::Page(j) = t {
                match render(j, &vars, &cur, &mut rng) {
                    Ok(r) => rendered = Some(r),
                    Err(Fallback::Back) => t = To::Back,
                    Err(Fallback::Restart) => {
                        walker.restart(wl.start);
                        t = To::Page(wl.start);
                        rendered = Some(render(wl.start, &vars, "", &mut rng).unwrap_or_default());
                    }
                }
            }
            match walker.apply(chain, t, &cur) {
                Move::Go(_) => cur = rendered.unwrap_or_default(),
                Move::Back(_, r) => {
                    backs += 1;
                    cur = r;
                }
                Move::Restart => {
                    backs += 1;
                    restarts += 1;
                    walker.restart(wl.start);
                    cur = render(wl.start, &vars, "", &mut rng).unwrap_or_default();
                }
                Move::End => {
                    ends += 1;
                    break;
                }
            }
        }
    }
    let mut pages = Map::new();
    for (i, c) in counts.iter().enumerate() {
        pages.insert(wl.pages[i].name.clone(), json!(c));
    }
    json!({"dry_run": {
        "requests": done,
        "sessions": sessions,
        "pages": Value::Object(pages),
        "back": backs,
        "end": ends,
        "session_min_ends": min_ends,
        "restart_on_empty_history": restarts,
        "capped_sessions": capped,
        "mean_pages_per_session": done as f64 / sessions.max(1) as f64,
        "mean_session_s": clock_s / sessions.max(1) as f64,
        "think_mean_s": think_sum / done.max(1) as f64,
    }})
    .to_string()
}
