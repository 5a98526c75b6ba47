//! Client sessions: the PostgreSQL front end of the middleware and the routing of units of work
//! (a port of `python/tierscope/middleware/server.py`).
//!
//! A unit of work is one simple Query, or the extended-protocol messages up to and including Sync.
//! Named prepared statements are kept by the proxy (per client session) and run on the backends as
//! the unnamed statement, so any pooled backend connection can serve any unit.
//!
//! One idea per module:
//! * `client`   — a client connection: the session's state, its message loop, its end
//! * `startup`  — the startup packet, SCRAM-SHA-256 authentication, the served database
//! * `units`    — what a unit is (read, write, COPY; a read's label) and the units answered here
//! * `outgoing` — the bytes and the reply plan a unit becomes on a backend connection
//! * `execute`  — one unit on one backend connection, the answers the client sees in a sink
//! * `read`     — reads: the balanced backend, the prepared variant, the retry
//! * `write`    — writes: the lease under the write lock, the broadcast, the settling
//! * `position` — the recovery position a write unit records on each backend
//! * `open`     — units the client flushes before Sync (pipeline mode)

mod client;
mod execute;
mod open;
mod outgoing;
mod position;
mod read;
mod startup;
mod units;
mod write;

#[cfg(test)]
mod tests;

pub use client::Session;
// the names session.rs made public (used inside the session only: kept under their paths)
#[allow(unused_imports)]
pub use outgoing::Outgoing;
#[allow(unused_imports)]
pub use write::Txn;
