//! The MySQL-protocol front and back of the middleware (MariaDB behind it): a port of
//! `python/tierscope/middleware/mysql_server.py` with the same rules and counts, on the manager of
//! `middleware/mod.rs` (the read policies, labels, the write lock, disabling, the stats).
//!
//! Client side: a protocol-10 greeting offering mysql_native_password; the client must log in as
//! the configured user with the backends' password (nothing else gets in), to the served database.
//! COM_QUERY is one unit of work, classified read or write by `sql` and routed as a PostgreSQL unit
//! (reads to one backend by the policy, writes broadcast under the write lock, a transaction pinned
//! to one connection per backend with the lock held until it ends). COM_PING, COM_INIT_DB (the
//! served database only), COM_RESET_CONNECTION, COM_SET_OPTION and COM_QUIT are answered here, and
//! so are `USE <the served database>`, `SET NAMES utf8mb4` and `SELECT @@socket` (an empty string:
//! a backend's socket would take the client around the middleware).
//!
//! Prepared statements: COM_STMT_PREPARE runs on one backend (chosen like a read) and the client
//! gets the session's own statement id; COM_STMT_EXECUTE is a unit like a query (a read or a write
//! by the statement's SQL), and a backend connection that has not prepared that SQL yet prepares it
//! first (kept: up to 256 per connection). The parameter types the client bound last are sent with
//! every execute. Not supported (ERR 1235): cursors and COM_STMT_SEND_LONG_DATA.
//!
//! Transactions are seen in the backends' status flags (in transaction, autocommit off). A write
//! calling NOW(), CURRENT_TIMESTAMP, ... runs on every backend between `SET timestamp = <one
//! instant>` and `SET timestamp = DEFAULT` (their answers hidden), so every replica stores the same
//! value.
//!
//! The recovery log (`--recovery-log`, `recovery.rs`): a write unit's record is the `SET timestamp`
//! packets around it, `SET insert_id = <the AUTO_INCREMENT value it took>` (appended once the answer
//! is known, under the write lock) and the client's command: COM_QUERY's payload, or for COM_STMT_EXECUTE the
//! prepare+execute bytes (the statement's SQL and the execute payload after the id, parameters in
//! binary with their types), re-prepared on the replaying connection. The position is recorded by
//! hidden commands on each backend connection (`execute`): inside a transaction an `UPDATE
//! tierscope_recovery` before the unit; with none open the unit in the middleware's own `BEGIN`,
//! then `UPDATE` + `COMMIT` when it succeeded or `ROLLBACK` when it failed, so a unit that fails
//! never advances a position. `Cluster::recover` replays or refuses stale backends before listening.
//!
//! One idea per module:
//! * `server`   — the server: start (backends checked, recovery), the listener, the stats at exit
//! * `cluster`  — the manager with the MariaDB pools: release, disable, the check at start, stats
//! * `conn`     — one backend connection: login, packets, prepared statements, own statements
//! * `pool`     — the bounded pool of connections to one backend
//! * `recover`  — the recovery at start: positions, a stale backend replayed from the log or refused
//! * `client`   — a client connection: the session's state, its command loop, its end
//! * `login`    — the greeting, mysql_native_password, the served database
//! * `units`    — the statements answered here and the routing of a unit (read, write, transaction)
//! * `outgoing` — the commands a unit becomes on a backend connection (`SET timestamp` around it)
//! * `execute`  — one unit on one backend connection, its recovery position, its answers
//! * `read`     — reads: the balanced backend and the retry
//! * `write`    — writes: the lease under the write lock, the broadcast, the settling
//! * `record`   — a write's record in the recovery log (`SET insert_id` of the value it took)
//! * `prepared` — prepared statements: prepare, execute, close, reset

mod client;
mod cluster;
mod conn;
mod execute;
mod login;
mod outgoing;
mod pool;
mod prepared;
mod read;
mod record;
mod recover;
mod server;
mod units;
mod write;

#[cfg(test)]
mod tests;

// the names mysql_session.rs made public (used inside the session only: kept under their paths)
#[allow(unused_imports)]
pub use cluster::Cluster;
#[allow(unused_imports)]
pub use conn::{MyConn, STMT_CACHE};
#[allow(unused_imports)]
pub use pool::MyPool;
