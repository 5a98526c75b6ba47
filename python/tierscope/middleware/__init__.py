"""A C-JDBC-like clustering middleware for PostgreSQL and MariaDB: RAIDb-1 (full replication) in one
process.

Clients speak the database's protocol to it as to one database (`--protocol postgres`: PostgreSQL
v3; `--protocol mysql`: MySQL's text protocol and prepared statements, mysql_native_password);
it keeps a connection pool to every database server (backend). Each
unit of work (a simple `Query` or COM_QUERY, or the extended-protocol messages up to `Sync`) is
classified read or write from its SQL: a read goes to one backend chosen
by Least-Pending-Requests-First (or round robin, weighted round robin, least response time, or the
resource-aware `aware`, which avoids replicas busy with heavy queries), a write is broadcast to
every enabled backend under one database-wide write lock, with NOW()-like macros fixed to one
instant first (a literal for PostgreSQL, `SET timestamp` for MariaDB).

Pure parts: `wire` (PostgreSQL framing), `mysql_wire` (MySQL framing, login, where an answer ends),
`sql` (classification, macro rewriting), `balance` (backend choice), `replies` (which backend reply
answers which request message). I/O: `pool`, `manager`, `routing` (what both protocols share: reads
by policy, writes broadcast under the write lock, transactions, disabling), `server` (PostgreSQL
sessions), `mysql_server` (MySQL sessions and backend logins; time functions fixed per write by
`SET timestamp`).
`heavy` runs the heavy-query comparison of the policies.
Run it with `python -m tierscope.middleware --help`. Docs: docs/middleware.md.
"""
