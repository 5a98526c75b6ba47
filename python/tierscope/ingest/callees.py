"""A callee's own times replace its callers' stamps of it (issue 26: "one server is one server").

An uninstrumented callee (a database behind an app's OpenTelemetry CLIENT spans) is timed by its
caller: each call starts when the caller sends it and ends when the caller gets round to the reply
(`requests.recorder` names the caller). A caller that is paused, or busy in its one event loop or
its one GIL, makes the callee look slow, and the trace cannot tell the two apart. When the
callee's own rows come along -- its port captured on the wire and turned into rows by
`tierscope trace` (`server_addr`/`server_port` set, no recorder) -- those are its times: each of
the caller's calls is matched with the callee's row that answered it (on the same endpoint, the
row lying within the call), the row takes the call's parent (so the call tree stays whole), and
the caller's stamp goes. Calls with no answering row go too (counted): a callee must not be half
timed by itself and half by its callers. Rows of the callee that answer no call (other clients,
monitoring) stay: they are load on it.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

#: How far (ns) the callee's row may lie outside the call it answers: timestamps of whole
#: milliseconds (some SDKs stamp starts so) and the two clocks' reading of one host.
TOLERANCE_NS = 1_000_000
#: How many rows of the endpoint after the first candidate are tried for one call.
LOOKAHEAD = 32

_LOCAL = {"localhost": "127.0.0.1", "::1": "127.0.0.1", "[::1]": "127.0.0.1"}


@dataclass(frozen=True)
class Replaced:
    """What `own_times_for_calls` did: calls replaced by the callee's rows, calls dropped unanswered."""

    matched: int = 0
    unanswered: int = 0
    endpoints: tuple[str, ...] = ()

    def note(self) -> str | None:
        if not self.matched and not self.unanswered:
            return None
        text = (
            f"{self.matched} call(s) to {', '.join(self.endpoints)} timed by their callers were replaced by the "
            "callee's own rows (its wire capture)"
        )
        if self.unanswered:
            text += f"; {self.unanswered} call(s) no row of the callee answered were dropped"
        return text


def _endpoint(host: str | None, port) -> str | None:
    if host is None or port is None:
        return None
    return f"{_LOCAL.get(host, host)}:{int(port)}"


def _parse(server: str | None) -> str | None:
    """'host:port' (IPv6 in brackets) -> the normalised endpoint, else None."""
    if not server or ":" not in server:
        return None
    host, _, port = server.rpartition(":")
    if not port.isdigit() or not host:
        return None
    return _endpoint(host, port)


def own_times_for_calls(requests: pa.Table) -> tuple[pa.Table, Replaced]:
    """`requests` with the calls their callers stamped replaced by the callee's own rows, where the
    callee has rows of its own (see the module docstring)."""
    names = requests.column_names
    if requests.num_rows == 0 or not {"recorder", "server_addr", "server_port"} <= set(names):
        return requests, Replaced()
    recorder = requests.column("recorder")
    if recorder.null_count == requests.num_rows:
        return requests, Replaced()
    # rows of a server's own on an address (the wire): without them there is nothing to replace
    wire = pc.and_(pc.is_valid(requests.column("server_addr")), pc.is_null(recorder))
    if not pc.any(wire).as_py():
        return requests, Replaced()
    server = requests.column("server").to_pylist()
    rec = recorder.to_pylist()
    addr = requests.column("server_addr").to_pylist()
    port = requests.column("server_port").to_pylist()
    own_ep = [_endpoint(a, p) if r is None else None for a, p, r in zip(addr, port, rec)]
    call_ep = [_parse(s) if (r is not None and r != s) else None for s, r in zip(server, rec)]
    endpoints = sorted({e for e in own_ep if e} & {e for e in call_ep if e})
    if not endpoints:
        return requests, Replaced()
    arrival = requests.column("arrival_ns").to_numpy(zero_copy_only=False).astype(np.int64)
    departure = requests.column("departure_ns").to_numpy(zero_copy_only=False).astype(np.int64)
    parent = requests.column("parent_id").to_pylist()
    drop = np.zeros(requests.num_rows, bool)
    new_parent = list(parent)
    matched = unanswered = 0
    own_ep_arr = np.asarray(own_ep, dtype=object)
    call_ep_arr = np.asarray(call_ep, dtype=object)
    for ep in endpoints:
        rows = np.flatnonzero(own_ep_arr == ep)
        rows = rows[np.argsort(arrival[rows], kind="stable")]
        taken = np.zeros(rows.size, bool)
        starts = arrival[rows]
        calls = np.flatnonzero(call_ep_arr == ep)
        calls = calls[np.argsort(arrival[calls], kind="stable")]
        for c in calls:
            lo, hi = arrival[c] - TOLERANCE_NS, departure[c] + TOLERANCE_NS
            k = int(np.searchsorted(starts, lo, "left"))
            found = -1
            for j in range(k, min(k + LOOKAHEAD, rows.size)):
                if starts[j] > hi:
                    break
                if not taken[j] and departure[rows[j]] <= hi:
                    found = j
                    break
            drop[c] = True
            if found < 0:
                unanswered += 1
                continue
            taken[found] = True
            new_parent[rows[found]] = parent[c]
            matched += 1
    out = requests.set_column(names.index("parent_id"), "parent_id", pa.array(new_parent, pa.string()))
    out = out.filter(pa.array(~drop))
    return out, Replaced(matched, unanswered, tuple(endpoints))
