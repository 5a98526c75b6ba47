"""Heavy requests (seed 000 §4): rare requests orders of magnitude slower than the usual request of
the same kind — e.g. a search SQL that the optimiser fails on and that reads a whole table from
disk. Rare enough to vanish in averages, heavy enough to move the bottleneck.

A request is **heavy** when its residence time (departure − arrival) is at least `factor` times the
median residence time of its ``(tier, label)`` (default 100×: two orders of magnitude), among labels
with at least `min_count` requests (so the median means something). Requests without a label are
grouped under ``(no label)``. The exact median is computed by DuckDB, streaming over the table.
"""

from __future__ import annotations

import duckdb
import pyarrow as pa

DEFAULT_FACTOR = 100.0
NO_LABEL = "(no label)"


def _arrow(con: duckdb.DuckDBPyConnection, query: str, params: list) -> pa.Table:
    rel = con.sql(query, params=params)
    return rel.to_arrow_table() if hasattr(rel, "to_arrow_table") else rel.arrow()  # duckdb 2 / 1


def heavy_requests(requests: pa.Table, factor: float = DEFAULT_FACTOR, min_count: int = 20) -> pa.Table:
    """The heavy requests: tier, server, label, arrival_ns, duration_ns, median_ns, ratio (sorted by arrival)."""
    con = duckdb.connect()
    try:
        con.register("r", requests.select(["tier", "server", "label", "arrival_ns", "departure_ns"]))
        return _arrow(
            con, """
            with d as (select tier, server, coalesce(label, ?) as label, arrival_ns,
                              departure_ns - arrival_ns as duration_ns from r),
                 m as (select tier, label, median(duration_ns) as median_ns, count(*) as n from d group by all)
            select d.tier, d.server, d.label, d.arrival_ns, d.duration_ns, m.median_ns::double as median_ns,
                   d.duration_ns / greatest(m.median_ns, 1) as ratio
            from d join m using (tier, label)
            where m.n >= ? and d.duration_ns >= ? * greatest(m.median_ns, 1)
            order by d.arrival_ns
            """,
            [NO_LABEL, int(min_count), float(factor)],
        )
    finally:
        con.close()


def heavy_summary(requests: pa.Table, heavy: pa.Table) -> pa.Table:
    """Per (tier, label) with heavy requests: count, all requests, share, median and max (ms), first
    and last time seen (ns), and the share of the label's total residence time they account for."""
    con = duckdb.connect()
    try:
        con.register("r", requests.select(["tier", "label", "arrival_ns", "departure_ns"]))
        con.register("h", heavy)
        return _arrow(
            con, """
            with a as (select tier, coalesce(label, ?) as label, count(*) as requests,
                              sum(departure_ns - arrival_ns) as total_ns from r group by all)
            select h.tier, h.label, count(*) as heavy, any_value(a.requests) as requests,
                   count(*) / any_value(a.requests) as share,
                   any_value(h.median_ns) / 1e6 as median_ms, max(h.duration_ns) / 1e6 as max_ms,
                   min(h.arrival_ns) as first_ns, max(h.arrival_ns) as last_ns,
                   sum(h.duration_ns) / any_value(a.total_ns) as time_share
            from h join a using (tier, label)
            group by h.tier, h.label order by heavy desc, h.tier, h.label
            """,
            [NO_LABEL],
        )
    finally:
        con.close()


def heavy_timeline(heavy: pa.Table, bin_ns: int = 1_000_000_000) -> pa.Table:
    """When they happened: heavy requests per (tier, label) per time bin (bin_start_ns, count)."""
    con = duckdb.connect()
    try:
        con.register("h", heavy)
        return _arrow(
            con, "select tier, label, (arrival_ns // ?) * ? as bin_start_ns, count(*) as heavy "
            "from h group by all order by bin_start_ns, tier, label",
            [int(bin_ns), int(bin_ns)],
        )
    finally:
        con.close()
