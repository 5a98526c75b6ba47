//! Drives the workload: emulated users (closed loop) or arrivals (open loop) on a single-threaded
//! tokio runtime. Users are cheap state machines (one task each, asleep on the timer wheel
//! while thinking); every request goes to the log and the statistics.
//!
//! One idea per module:
//! * `run`      — a run from start to summary (runtime, end, grace, summary line)
//! * `ctx`      — the shared state of a run and the batches of rows for the log
//! * `schedule` — the run's clock: phases, the wake-up grid, ramp-up start times
//! * `users`    — closed-loop users and open-loop arrivals
//! * `session`  — the user loop: one session's walk over the pages
//! * `request`  — one page request and its row
//! * `conn`     — connection policies and one exchange with its retry
//! * `deadline` — request timeouts (one watchdog, no timer per request)
//! * `objects`  — a page's embedded objects over parallel kept-alive connections
//! * `render`   — pages to requests (URL, form, request bytes)
//! * `dry_run`  — `--dry-run N`: the walk without the network

mod conn;
mod ctx;
mod deadline;
mod dry_run;
mod objects;
mod render;
mod request;
mod run;
mod schedule;
mod session;
mod users;

#[cfg(test)]
mod tests;

pub use dry_run::simulate;
pub use run::run;
