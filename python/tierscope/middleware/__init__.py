"""A C-JDBC-like clustering middleware for PostgreSQL: RAIDb-1 (full replication) in one process.

Clients speak the PostgreSQL v3 protocol to it as to one database; it keeps a connection pool to
every database server (backend). Each unit of work (a simple `Query`, or the extended-protocol
messages up to `Sync`) is classified read or write from its SQL: a read goes to one backend chosen
by Least-Pending-Requests-First (or round robin, weighted round robin, least response time, or the
resource-aware `aware`, which avoids replicas busy with heavy queries), a write is broadcast to
every enabled backend under one database-wide write lock, with NOW()-like macros rewritten to one
literal first.

Pure parts: `wire` (framing), `sql` (classification, macro rewriting), `balance` (backend choice),
`replies` (which backend reply answers which request message). I/O: `pool`, `manager`, `server`.
`heavy` runs the heavy-query comparison of the policies.
Run it with `python -m tierscope.middleware --help`. Docs: docs/middleware.md.
"""
