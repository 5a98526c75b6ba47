"""Link rows of the requests table across tiers into transactions.

A row's parent is the request at an upstream tier that caused it. Two ways to find it, tried in
this order and recorded in the `link` column:

* `request_id`: the parent carries the same request id (X-Request-Id forwarded by nginx, a
  sqlcommenter `request_id` in the statement) at the nearest upstream tier; among several, one
  whose interval contains the child's, then the latest to arrive.
* `time_containment`: no id. The parent is a request at the nearest upstream tier, served on the
  host the child's connection came from (parent `server_addr` = child `client_addr`), whose
  interval [arrival, departure] contains the child's. When several do (concurrent requests on
  that server), the latest to arrive is taken and the link is `time_containment_ambiguous`.

Rows without a parent are roots. Linking makes `request_id` unique (`row_ids`): a page's id
stays on its top row (the web row), a downstream row that carried it becomes `<id>/<row key>`,
a row without one its row key `<server>#<conn>@<arrival_ns>`. Then `parent_id` is the parent
row's `request_id`, as for imported spans, and `transaction` the root row's.

Tier order: web < app < middleware < db (other tier names: HTTP rows count as app, SQL rows as db).
"""

from __future__ import annotations

import heapq
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc

from tierscope import tables, tiers


def _column(table: pa.Table, name: str, default=None) -> list:
    if name in table.column_names:
        return table.column(name).to_pylist()
    return [default] * table.num_rows


def row_ids(rid: list, link: list, server: list, conn: list, arr: list) -> list[str]:
    """Every row's own id, unique in the table: the id it carried when it is the one row at the top
    of that id's rows (no parent found by the id: the web row of a page); a downstream row that
    carried the id (found its parent by it) `<id>/<row key>`; a row without an id its row key
    `<server>#<conn>@<arrival_ns>`."""
    tops: dict[str, int] = {}
    for r, how in zip(rid, link):
        if r and how != "request_id":
            tops[r] = tops.get(r, 0) + 1
    out = []
    for r, how, s, c, a in zip(rid, link, server, conn, arr):
        key = f"{s}#{c}@{a}"
        if not r:
            out.append(key)
        elif how != "request_id" and tops[r] == 1:
            out.append(r)
        else:
            out.append(f"{r}/{key}")
    return out


def link_transactions(table: pa.Table) -> pa.Table:
    """Make `request_id` unique and fill `parent_id`, `link` and `transaction` (see module docs);
    other columns unchanged."""
    n = table.num_rows
    tier = _column(table, "tier")
    proto = _column(table, "protocol")
    rid = _column(table, "request_id")
    arr = _column(table, "arrival_ns")
    dep = _column(table, "departure_ns")
    server = _column(table, "server")
    conn = _column(table, "conn")
    saddr = _column(table, "server_addr")
    caddr = _column(table, "client_addr")
    if "server_addr" not in table.column_names:
        saddr = [s.rsplit(":", 1)[0].strip("[]") if s else None for s in server]
    if "client_addr" not in table.column_names:
        caddr = [c.rsplit(":", 1)[0].strip("[]") if c else None for c in _column(table, "client")]
    rank = [tiers.rank(t, p) for t, p in zip(tier, proto)]
    parent: list[int | None] = [None] * n
    link: list[str | None] = [None] * n

    # 1. by request id
    by_id: dict[str, list[int]] = {}
    for i, r in enumerate(rid):
        if r:
            by_id.setdefault(r, []).append(i)
    for rows in by_id.values():
        if len(rows) < 2:
            continue
        for c in rows:
            cands = [p for p in rows if rank[p] < rank[c]]
            if not cands:
                continue
            best = max(rank[p] for p in cands)
            cands = [p for p in cands if rank[p] == best]
            contain = [p for p in cands if arr[p] <= arr[c] and dep[p] >= dep[c]]
            pick = max(contain or cands, key=lambda p: arr[p])
            parent[c] = pick
            link[c] = "request_id"

    # 2. by time containment on the child's client host, one sweep per (host, child tier)
    groups: dict[tuple, list[int]] = {}
    for i in range(n):
        if parent[i] is None and caddr[i] is not None:
            groups.setdefault((caddr[i], rank[i]), []).append(i)
    by_host: dict[str, list[int]] = {}
    for i in range(n):
        if saddr[i] is not None:
            by_host.setdefault(saddr[i], []).append(i)
    for (host, crank), children in groups.items():
        ups = [p for p in by_host.get(host, []) if rank[p] < crank]
        if not ups:
            continue
        best_rank = max(rank[p] for p in ups)
        ups = sorted((p for p in ups if rank[p] == best_rank), key=lambda p: arr[p])
        children.sort(key=lambda c: arr[c])
        active: list[tuple[int, int]] = []  # heap of (departure, parent)
        k = 0
        for c in children:
            while k < len(ups) and arr[ups[k]] <= arr[c]:
                heapq.heappush(active, (dep[ups[k]], ups[k]))
                k += 1
            while active and active[0][0] < arr[c]:
                heapq.heappop(active)  # ended before this child arrived: can contain no later child
            cands = [p for d, p in active if d >= dep[c] and p != c]
            if not cands:
                continue
            parent[c] = max(cands, key=lambda p: arr[p])
            link[c] = "time_containment" if len(cands) == 1 else "time_containment_ambiguous"

    uid = row_ids(rid, link, server, conn, arr)
    transaction: list[str] = [""] * n
    for i in range(n):
        j, hops = i, 0
        while (p := parent[j]) is not None and hops < 64:
            j = p
            hops += 1
        transaction[i] = uid[j]
    parent_id = [uid[p] if p is not None else None for p in parent]
    out = table
    for name, values in (("request_id", uid), ("parent_id", parent_id), ("link", link), ("transaction", transaction)):
        arr_ = pa.array(values, type=pa.string())
        if name in out.column_names:
            out = out.set_column(out.column_names.index(name), name, arr_)
        else:
            out = out.append_column(name, arr_)
    return out


def rows_linked_to_their_own_id(table: pa.Table) -> int:
    """Rows whose `parent_id` is their own `request_id`: what a tierscope from before ids were unique
    per row wrote when it linked a row by the id it carried (its parent and siblings carry that id
    too, so the link is ambiguous; `link_transactions` links such a table again). Linking here
    never makes a row its own parent: 0 for a table linked here, or not linked."""
    if not {"request_id", "parent_id"} <= set(table.column_names) or table.num_rows == 0:
        return 0
    return int(pc.sum(pc.equal(table.column("parent_id"), table.column("request_id"))).as_py() or 0)


def link_file(path: str | Path) -> dict[str, int]:
    """Link the requests table at `path` in place, right after tracing (the one place traced rows
    are linked: `tierscope trace` and the runner both call this); returns the rows per way their
    parent was found (`request_id`, `time_containment`, ..., and `root`)."""

    linked = link_transactions(tables.read(path, "requests"))
    tables.write(linked, path, "requests")
    kinds: dict[str, int] = {}
    for kind in linked.column("link").to_pylist():
        kinds[kind or "root"] = kinds.get(kind or "root", 0) + 1
    return kinds
