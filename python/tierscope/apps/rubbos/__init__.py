"""RUBBoS, the Slashdot-like bulletin board of the seed papers, re-implemented for tierscope.

- `app`: the WSGI application (24 interactions, static pages, logo), run by gunicorn;
- `dal`: one data-access module over PostgreSQL and MariaDB;
- `schema_postgres.sql`, `schema_mariadb.sql`: the 8 tables and their indexes;
- `datagen`: the deterministic data generator and bulk loader;
- `snapshot`: snapshot/restore of a loaded database's files;
- `mixes`: the transition tables of the digest and the workload files in `workloads/`;
- `events`: GC and injected pauses as `events` rows.

See docs/rubbos.md.
"""
