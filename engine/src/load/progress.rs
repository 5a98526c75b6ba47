//! Live statistics: a JSON line once a second, and the final summary per page and in total
//! (HDR histograms; the summary counts the run phase only).

use hdrhistogram::Histogram;
use serde_json::{json, Map, Value};

use super::http::ErrorKind;
use super::log::{Record, PHASES};

const N_KINDS: usize = ErrorKind::ALL.len();

fn hist() -> Histogram<u64> {
    // microseconds, 1 us .. 1 hour, 3 significant digits
    Histogram::new_with_bounds(1, 3_600_000_000, 3).expect("histogram bounds")
}

pub struct PageStats {
    pub hist: Histogram<u64>,
    pub count: u64,
    pub completed: u64,
    pub errors: [u64; N_KINDS],
    pub sum_us: f64,
}

impl PageStats {
    fn new() -> PageStats {
        PageStats { hist: hist(), count: 0, completed: 0, errors: [0; N_KINDS], sum_us: 0.0 }
    }
    #[inline]
    fn add(&mut self, r: &Record, latency_us: u64) {
        self.count += 1;
        if let Some(e) = r.error {
            self.errors[e.index()] += 1;
        }
        if r.status != 0 {
            self.completed += 1;
            self.sum_us += latency_us as f64;
            let _ = self.hist.record(latency_us.clamp(1, 3_600_000_000));
        }
    }
    fn to_json(&self, run_s: f64) -> Value {
        let ms = |us: u64| (us as f64) / 1000.0;
        let q = |p: f64| if self.completed == 0 { Value::Null } else { json!(ms(self.hist.value_at_quantile(p))) };
        let mut errors = Map::new();
        for k in ErrorKind::ALL {
            if self.errors[k.index()] > 0 {
                errors.insert(k.name().into(), json!(self.errors[k.index()]));
            }
        }
        json!({
            "count": self.count,
            "completed": self.completed,
            "errors": self.errors.iter().sum::<u64>(),
            "errors_by_kind": errors,
            "mean_ms": if self.completed == 0 { Value::Null } else { json!(self.sum_us / self.completed as f64 / 1000.0) },
            "p50_ms": q(0.5), "p90_ms": q(0.9), "p99_ms": q(0.99), "p999_ms": q(0.999),
            "max_ms": if self.completed == 0 { Value::Null } else { json!(ms(self.hist.max())) },
            "throughput_rps": if run_s > 0.0 { json!(self.completed as f64 / run_s) } else { Value::Null },
        })
    }
}

pub struct Stats {
    pub names: Vec<String>,
    /// open loop: latency runs from the intended start (no coordinated omission);
    /// closed loop: from the actual start (the user was waiting anyway)
    pub from_intended: bool,
    // this second
    interval: Histogram<u64>,
    interval_count: u64,
    interval_errors: u64,
    // run phase
    pub pages: Vec<PageStats>,
    pub total: PageStats,
    pub lateness: Histogram<u64>,
    // every phase
    pub all_count: u64,
    pub all_errors: [u64; N_KINDS],
    pub by_phase: [u64; 3],
    // think times
    pub think_drawn_sum: f64,
    pub think_drawn_n: u64,
    pub think_real_sum: f64,
    pub think_real_n: u64,
    /// the drawn think times of the realized pairs (same pairs as think_real_*)
    pub think_pair_drawn_sum: f64,
    /// embedded objects of run-phase pages: pages fetched for, objects, bytes, failed
    pub embedded: Option<[u64; 4]>,
}

impl Stats {
    pub fn new(names: Vec<String>) -> Stats {
        Stats {
            from_intended: false,
            pages: names.iter().map(|_| PageStats::new()).collect(),
            names,
            interval: hist(),
            interval_count: 0,
            interval_errors: 0,
            total: PageStats::new(),
            lateness: hist(),
            all_count: 0,
            all_errors: [0; N_KINDS],
            by_phase: [0; 3],
            think_drawn_sum: 0.0,
            think_drawn_n: 0,
            think_real_sum: 0.0,
            think_real_n: 0,
            think_pair_drawn_sum: 0.0,
            embedded: None,
        }
    }

    /// Account one finished request.
    #[inline]
    pub fn add(&mut self, r: &Record) {
        let from = if self.from_intended { r.intended_ns } else { r.start_ns };
        let latency_us = ((r.end_ns - from).max(0) / 1000) as u64;
        self.all_count += 1;
        self.by_phase[r.phase as usize] += 1;
        self.interval_count += 1;
        if let Some(e) = r.error {
            self.all_errors[e.index()] += 1;
            self.interval_errors += 1;
        }
        if r.status != 0 {
            let _ = self.interval.record(latency_us.clamp(1, 3_600_000_000));
        }
        if r.phase == 1 {
            self.pages[r.state as usize].add(r, latency_us);
            self.total.add(r, latency_us);
            let late_us = ((r.start_ns - r.intended_ns).max(0) / 1000) as u64;
            let _ = self.lateness.record(late_us.clamp(1, 3_600_000_000));
            if let (Some(e), Some(n)) = (self.embedded.as_mut(), r.embedded) {
                e[0] += 1;
                e[1] += n as u64;
                e[2] += r.embedded_bytes;
                e[3] += r.embedded_failed as u64;
            }
        }
    }

    /// The progress line for the second that just ended (resets the interval counters).
    pub fn tick(&mut self, t: f64, phase: u8, active_users: u64, in_flight: u64, dt: f64) -> String {
        let ms = |p: f64| if self.interval.is_empty() { Value::Null } else { json!((self.interval.value_at_quantile(p) as f64) / 1000.0) };
        let line = json!({
            "t": (t * 1000.0).round() / 1000.0,
            "phase": PHASES[phase as usize],
            "active_users": active_users,
            "in_flight": in_flight,
            "rps": (self.interval_count as f64 / dt * 10.0).round() / 10.0,
            "p50_ms": ms(0.5), "p90_ms": ms(0.9), "p99_ms": ms(0.99),
            "errors": self.interval_errors,
            "requests_total": self.all_count,
            "errors_total": self.all_errors.iter().sum::<u64>(),
        });
        self.interval.reset();
        self.interval_count = 0;
        self.interval_errors = 0;
        line.to_string()
    }

    pub fn summary(&self, run_s: f64, extra: Map<String, Value>) -> String {
        let mut pages = Map::new();
        for (i, p) in self.pages.iter().enumerate() {
            if p.count > 0 {
                pages.insert(self.names[i].clone(), p.to_json(run_s));
            }
        }
        let mut all_errors = Map::new();
        for k in ErrorKind::ALL {
            all_errors.insert(k.name().into(), json!(self.all_errors[k.index()]));
        }
        let mut s = Map::new();
        s.insert("run_s".into(), json!(run_s));
        s.insert("throughput_rps".into(), if run_s > 0.0 { json!(self.total.completed as f64 / run_s) } else { Value::Null });
        s.insert("total".into(), self.total.to_json(run_s));
        s.insert("pages".into(), Value::Object(pages));
        s.insert(
            "all_phases".into(),
            json!({
                "requests": self.all_count,
                "errors_by_kind": all_errors,
                "ramp_up": self.by_phase[0], "run": self.by_phase[1], "ramp_down": self.by_phase[2],
            }),
        );
        s.insert(
            "lateness_ms".into(),
            if self.lateness.is_empty() {
                Value::Null
            } else {
                json!({"p50": self.lateness.value_at_quantile(0.5) as f64 / 1000.0, "p99": self.lateness.value_at_quantile(0.99) as f64 / 1000.0, "max": self.lateness.max() as f64 / 1000.0})
            },
        );
        s.insert(
            "think".into(),
            json!({
                "draws": self.think_drawn_n,
                "mean_drawn_s": if self.think_drawn_n > 0 { json!(self.think_drawn_sum / self.think_drawn_n as f64) } else { Value::Null },
                "realized": self.think_real_n,
                "mean_realized_s": if self.think_real_n > 0 { json!(self.think_real_sum / self.think_real_n as f64) } else { Value::Null },
                "mean_drawn_of_realized_s": if self.think_real_n > 0 { json!(self.think_pair_drawn_sum / self.think_real_n as f64) } else { Value::Null },
            }),
        );
        if let Some(e) = self.embedded {
            s.insert(
                "embedded".into(),
                json!({
                    "pages": e[0],
                    "objects": e[1],
                    "bytes": e[2],
                    "failed": e[3],
                    "objects_per_page": if e[0] > 0 { json!(e[1] as f64 / e[0] as f64) } else { Value::Null },
                }),
            );
        }
        for (k, v) in extra {
            s.insert(k, v);
        }
        json!({ "summary": Value::Object(s) }).to_string()
    }
}
