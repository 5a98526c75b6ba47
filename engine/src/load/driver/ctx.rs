//! The shared state of a run: the workload, the target, the clock origin, the statistics, the
//! batches of rows on their way to the log writer, and what is precomputed per page.

use std::cell::{Cell, RefCell};
use std::rc::Rc;
use std::sync::mpsc::Sender;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::Semaphore;

use crate::load::clock;
use crate::load::grid::Grid;
use crate::load::http::{Conn, Target};
use crate::load::log::Record;
use crate::load::progress::Stats;
use crate::load::think::Think;
use crate::load::workload::{Method, Policy, Unit, Workload};

pub(super) const BATCH: usize = 4096;

/// The shared connections of policy `pool` (at most `pool_size` requests at a time).
pub(super) struct Pool {
    pub(super) sem: Semaphore,
    pub(super) idle: RefCell<Vec<Conn>>,
}

/// The pending requests' deadlines and wakers (see `deadline`): slots, and the free ones.
#[derive(Default)]
pub(super) struct Deadlines {
    pub(super) slots: Vec<Option<(Instant, std::task::Waker)>>,
    pub(super) free: Vec<usize>,
}

pub(super) struct Ctx {
    pub(super) wl: Workload,
    pub(super) target: Target,
    pub(super) t0: Instant,
    pub(super) t0_ns: i64,
    pub(super) end_s: f64,
    pub(super) stop: Cell<bool>,
    pub(super) stats: RefCell<Stats>,
    pub(super) batch: RefCell<Vec<Record>>,
    pub(super) log: RefCell<Option<Sender<Vec<Record>>>>,
    pub(super) active_users: Cell<u64>,
    pub(super) in_flight: Cell<u64>,
    pub(super) sessions: Cell<u64>,
    pub(super) think: RefCell<Think>,
    pub(super) pool: Option<Pool>,
    pub(super) words: Arc<Vec<String>>,
    pub(super) static_paths: Vec<Option<Arc<str>>>,
    pub(super) var_names: Vec<Vec<Arc<str>>>,
    pub(super) needs_body: bool,
    pub(super) seed: u64,
    pub(super) connect_timeout: Duration,
    pub(super) request_timeout: Duration,
    pub(super) policy: Policy,
    /// the largest think-time mean of any page (the truncation point is 10x this)
    pub(super) max_think_mean: f64,
    /// closed-loop wake-ups are aligned to this grid (s; 0 = exact)
    pub(super) quantum_s: f64,
    pub(super) deadlines: RefCell<Deadlines>,
    /// pre-built request bytes of pages with a literal URL and no body
    pub(super) static_requests: Vec<Option<Arc<[u8]>>>,
    /// per session type: whether it has `learn` variables
    pub(super) learns: Vec<bool>,
    /// closed loop on a timer grid with think times after every page and no embedded objects:
    /// responses are picked up at the next edge of `grid` (`crate::load::grid`; edges every
    /// millisecond, or every quantum if it is shorter: they are edges of the timer grid, where
    /// the users due then wake anyway) instead of waking the event loop each
    pub(super) paced: bool,
    pub(super) grid: Grid,
}

impl Ctx {
    pub(super) fn emit(&self, rec: Record) {
        self.stats.borrow_mut().add(&rec);
        let mut b = self.batch.borrow_mut();
        b.push(rec);
        if b.len() >= BATCH {
            self.flush_batch_locked(&mut b);
        }
    }
    pub(super) fn flush_batch_locked(&self, b: &mut Vec<Record>) {
        let full = std::mem::replace(b, Vec::with_capacity(BATCH));
        if let Some(tx) = self.log.borrow().as_ref() {
            let _ = tx.send(full);
        }
    }
    pub(super) fn flush_batch(&self) {
        let mut b = self.batch.borrow_mut();
        if !b.is_empty() {
            self.flush_batch_locked(&mut b);
        }
    }
}

/// The shared state of a run (the clock starts now).
pub(super) fn new_ctx(wl: Workload, target: Target, log: Option<Sender<Vec<Record>>>, seed: u64) -> Rc<Ctx> {
    let names: Vec<String> = wl.pages.iter().map(|p| p.name.clone()).collect();
    let (t0, t0_ns) = {
        let _ = clock::base();
        let t0 = Instant::now();
        (t0, clock::now_ns())
    };
    let static_paths = wl
        .pages
        .iter()
        .map(|p| if p.url.is_literal() && p.method == Method::Get { Some(Arc::from(format!("{}{}", target.prefix, p.url.literal()))) } else { None })
        .collect();
    let var_names = wl.session_types.iter().map(|t| t.vars.iter().map(|(n, _)| Arc::from(n.as_str())).collect()).collect();
    let learns = wl.session_types.iter().map(|t| t.vars.iter().any(|(_, p)| matches!(p, crate::load::params::Param::Learn { .. }))).collect();
    let policy = match (wl.policy, wl.arrivals.as_ref().map(|a| a.unit)) {
        (Policy::PerUser, Some(Unit::Request)) => Policy::PerRequest,
        (p, _) => p,
    };
    // the think-time MMPP is that of one user (rate 1 / mean, as in Mi et al. 2009); its state
    // is shared by all users so that their surges coincide
    let nominal_rate = if wl.think_mean_s > 0.0 { 1.0 / wl.think_mean_s } else { 0.0 };
    let think = Think::new(if wl.arrivals.is_some() { 1.0 } else { wl.think_dispersion }, wl.think_contrast, nominal_rate, seed);
    let end_s = wl.ramp_up_s + wl.run_s + wl.ramp_down_s;
    let mut stats = Stats::new(names);
    stats.from_intended = wl.arrivals.is_some();
    if wl.embedded.is_some() {
        stats.embedded = Some([0; 4]);
    }
    let mut ctx = Ctx {
        target,
        t0,
        t0_ns,
        end_s,
        stop: Cell::new(false),
        stats: RefCell::new(stats),
        batch: RefCell::new(Vec::with_capacity(BATCH)),
        log: RefCell::new(log),
        active_users: Cell::new(0),
        in_flight: Cell::new(0),
        sessions: Cell::new(0),
        think: RefCell::new(think),
        pool: if policy == Policy::Pool {
            Some(Pool { sem: Semaphore::new(wl.pool_size), idle: RefCell::new(Vec::with_capacity(wl.pool_size)) })
        } else {
            None
        },
        words: crate::load::workload::builtin_words(),
        static_paths,
        var_names,
        needs_body: wl.needs_body(),
        seed,
        connect_timeout: Duration::from_secs_f64(wl.connect_timeout_s),
        request_timeout: Duration::from_secs_f64(wl.request_timeout_s),
        policy,
        quantum_s: wl.think_quantum_ms / 1000.0,
        deadlines: RefCell::new(Deadlines::default()),
        static_requests: vec![],
        learns,
        paced: wl.think_quantum_ms > 0.0
            && wl.arrivals.is_none()
            && wl.embedded.is_none()
            && wl.think_mean_s > 0.0
            && wl.pages.iter().all(|p| p.think_mean_s.is_none_or(|m| m > 0.0)),
        // responses are picked up every millisecond (or every quantum, if shorter): a think time
        // shorter than that is the only one whose next request can start late (by less than it)
        grid: Grid::new(t0, Duration::from_secs_f64((wl.think_quantum_ms / 1000.0).clamp(1e-6, 1e-3))),
        max_think_mean: wl.pages.iter().filter_map(|p| p.think_mean_s).fold(wl.think_mean_s, f64::max),
        wl,
    };
    ctx.static_requests = (0..ctx.wl.pages.len()).map(|i| ctx.static_request(i)).collect();
    Rc::new(ctx)
}
