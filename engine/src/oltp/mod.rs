//! Database benchmark drivers: YCSB (`ycsb`) and TPC-C (`tpcc`) against PostgreSQL and
//! MariaDB/MySQL, talking to the server directly with prepared statements.
//!
//! Each driver has a `load` phase (creates and fills its tables) and a `run` phase (a fixed number
//! of client threads, one connection each, bounded by time and by operation count) that prints a
//! summary JSON on stdout and can write one row per operation to Parquet.
//!
//! * [`error`] — the errors a user can cause (bad values, a DSN, a refused login, missing tables).
//! * [`db`] — one client interface over both servers (`?` placeholders, typed values).
//! * [`pgwire`] — a small synchronous PostgreSQL client: the YCSB run's connections.
//! * [`generators`] — YCSB's Zipfian / scrambled Zipfian / latest key choosers.
//! * [`stats`] — per-operation counts, HDR latency histograms, the Parquet op log.
//! * [`ycsb`] — the YCSB core workloads A–F.
//! * [`tpcc`] — TPC-C: nine tables, five transactions, terminals with keying and think times.

pub mod db;
pub mod error;
pub mod generators;
pub mod pgwire;
pub mod stats;
pub mod tpcc;
pub mod ycsb;
