"""Independent test cases: N-tier systems simulated with SimPy (not tierscope's simulator), exported
as OTLP/JSON the way an OpenTelemetry collector's file exporter writes them, with their truth known
by construction.

Why a second simulator: tierscope's own (`tierscope.simulate`) shares its authors' idea of a
system with the analysis; a verdict tuned on it can be wrong on the world. This one is written
separately, on a different engine and with different modelling choices: first-come-first-served
cores (not processor sharing), thread pools and connection pools as SimPy resources, freezes that
stop a server's cores (SIGSTOP-like: work in progress resumes afterwards), spans cut at the
capture window's edges as a real export is.

A `System` is a list of `Server`s by tier; a request enters at the front tier and each tier's
`Page` says how much CPU it takes before and after its calls downstream. `simulate()` returns the
spans; `write_otlp()` writes them as one OTLP/JSON document (ids in hex, times as strings, kind 2
= SERVER, resource attributes `service.name` and `service.instance.id`); `freeze_events()` gives the
freezes as a tierscope `events` table; `truth_*` functions compute what the analysis must find from
the simulation's own state (the windows in which a server was frozen while holding requests).
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import simpy

EPOCH_S = 1_763_800_000  # the simulation's time 0 on the Unix epoch (a multiple of 50 ms)


@dataclass
class Server:
    """One server: `cores` first-come-first-served cores, an optional pool of `threads` a request
    holds for its whole stay, a pool of `connections` per downstream tier it calls, and freezes
    `(start_s, end_s)` during which its cores do no work."""

    tier: str
    name: str
    cores: int = 1
    threads: int | None = None
    connections: int | None = None  # per server, to the next tier down
    freezes: list[tuple[float, float]] = field(default_factory=list)


@dataclass
class Page:
    """A kind of request: CPU per tier before and after its downstream call(s), mean seconds,
    exponential; `calls` downstream requests per tier visit (0 at the last tier); `label` per tier."""

    name: str
    weight: float
    cpu: dict[str, float]  # tier -> mean CPU seconds at that tier (split half before, half after the calls)
    calls: dict[str, int]  # tier -> number of calls to the next tier
    labels: dict[str, str] | None = None  # tier -> span name (default: the page name)


@dataclass
class System:
    tiers: list[str]  # front first
    servers: list[Server]
    pages: list[Page]
    users: int
    think_s: float
    seed: int = 1

    def of(self, tier: str) -> list[Server]:
        return [s for s in self.servers if s.tier == tier]


@dataclass
class Span:
    trace_id: str
    span_id: str
    parent_id: str | None
    tier: str
    server: str
    name: str
    start_s: float
    end_s: float
    # when its caller took the reply: the caller got a core to go on after the call (in-process
    # instrumentation stamps a CLIENT span's end then); None at the front
    picked_s: float | None = None


class _Node:
    """A server at run time: its cores, pools and freeze schedule."""

    def __init__(self, env: simpy.Environment, server: Server):
        self.server = server
        self.cores = simpy.Resource(env, server.cores)
        self.threads = simpy.Resource(env, server.threads) if server.threads else None
        self.connections = simpy.Resource(env, server.connections) if server.connections else None
        self.freezes = sorted(server.freezes)

    def finish(self, now: float, work: float) -> float:
        """When `work` seconds of CPU started at `now` end, with the freezes' time not counting."""
        t = now
        for a, b in self.freezes:
            if b <= t:
                continue
            if a >= t + work:
                break
            if a > t:
                work -= a - t
            t = max(t, b)
        return t + work

    def thaw(self, now: float) -> float:
        """The first instant at or after `now` at which the server is not frozen."""
        return self.finish(now, 0.0)


@dataclass
class Result:
    spans: list[Span]  # inside the capture window
    waits: dict[str, list[tuple[float, float]]]  # server -> stretches a request waited for a core


def simulate(system: System, duration_s: float, warmup_s: float = 5.0) -> Result:
    """Run the closed system for warmup + duration seconds: the spans inside the capture window
    [warmup, warmup + duration] (started and ended inside it) and every wait for a core."""
    env = simpy.Environment()
    rng = random.Random(system.seed)
    nodes = {s.name: _Node(env, s) for s in system.servers}
    by_tier = {t: [nodes[s.name] for s in system.of(t)] for t in system.tiers}
    turn = {t: 0 for t in system.tiers}
    spans: list[Span] = []
    waits: dict[str, list[tuple[float, float]]] = {s.name: [] for s in system.servers}
    weights = [p.weight for p in system.pages]

    def ident(bits: int) -> str:
        return f"{rng.getrandbits(bits):0{bits // 4}x}"

    def cpu(node: _Node, mean: float):
        """Run `mean` seconds (exponential) of CPU on one of the node's cores; returns when the
        core was taken."""
        work = rng.expovariate(1.0 / mean) if mean > 0 else 0.0
        with node.cores.request() as req:
            asked = env.now
            yield req
            if env.now > asked:
                waits[node.server.name].append((asked, env.now))
            got = env.now
            yield env.timeout(node.finish(env.now, work) - env.now)
        return got

    def visit(level: int, page: Page, trace: str, parent: str | None):
        tier = system.tiers[level]
        group = by_tier[tier]
        node = group[turn[tier] % len(group)]
        turn[tier] += 1
        span_id = ident(64)
        start = env.now
        thread = node.threads.request() if node.threads else None
        if thread is not None:
            yield thread
        yield env.timeout(node.thaw(env.now) - env.now)
        mean = page.cpu.get(tier, 0.0)
        yield from cpu(node, mean / 2)
        child = None
        for _ in range(page.calls.get(tier, 0)):
            conn = node.connections.request() if node.connections else None
            if conn is not None:
                yield conn
            child = yield env.process(visit(level + 1, page, trace, span_id))
            if conn is not None:
                node.connections.release(conn)
            yield env.timeout(node.thaw(env.now) - env.now)  # a frozen caller cannot take the reply
            child.picked_s = env.now
        got = yield from cpu(node, mean / 2)
        if child is not None:
            child.picked_s = max(child.picked_s or got, got)  # the last reply: taken with a core
        if thread is not None:
            node.threads.release(thread)
        name = (page.labels or {}).get(tier, page.name)
        span = Span(trace, span_id, parent, tier, node.server.name, name, start, env.now)
        spans.append(span)
        return span

    def user():
        while True:
            yield env.timeout(rng.expovariate(1.0 / system.think_s))
            page = rng.choices(system.pages, weights)[0]
            yield env.process(visit(0, page, ident(128), None))

    for _ in range(system.users):
        env.process(user())
    env.run(until=warmup_s + duration_s)
    end = warmup_s + duration_s
    return Result([s for s in spans if s.start_s >= warmup_s and s.end_s <= end], waits)


def ns(t_s: float) -> int:
    """Simulation seconds as epoch nanoseconds (microsecond resolution, as exporters round)."""
    return EPOCH_S * 1_000_000_000 + int(round(t_s * 1e6)) * 1000


def write_otlp(spans: list[Span], path: Path) -> Path:
    """One OTLP/JSON document: a resourceSpans entry per server (OTLP/JSON spec encoding)."""
    groups: dict[tuple[str, str], list[dict]] = {}
    for s in spans:
        body = {
            "traceId": s.trace_id,
            "spanId": s.span_id,
            "name": s.name,
            "kind": 2,
            "startTimeUnixNano": str(ns(s.start_s)),
            "endTimeUnixNano": str(ns(s.end_s)),
            "status": {},
        }
        if s.parent_id:
            body["parentSpanId"] = s.parent_id
        groups.setdefault((s.tier, s.server), []).append(body)
    doc = {
        "resourceSpans": [
            {
                "resource": {
                    "attributes": [
                        {"key": "service.name", "value": {"stringValue": tier}},
                        {"key": "service.instance.id", "value": {"stringValue": server}},
                    ]
                },
                "scopeSpans": [{"scope": {"name": "independent-sim"}, "spans": body}],
            }
            for (tier, server), body in sorted(groups.items())
        ]
    }
    path.write_text(json.dumps(doc))
    return path


def _thaw_of(system: System) -> dict[str, callable]:
    """Per server: the instant its process can stamp something happening at t (t, or the end of
    the freeze t falls in: a frozen process stamps nothing)."""

    def thaw(freezes: list[tuple[float, float]]):
        def at(t: float) -> float:
            for a, b in freezes:
                if a <= t < b:
                    return b
            return t

        return at

    return {s.name: thaw(sorted(s.freezes)) for s in system.servers}


def write_otlp_inprocess(
    spans: list[Span], system: System, path: Path, uninstrumented: tuple[str, ...] = (), db_system: str = "postgresql"
) -> Path:
    """OTLP/JSON as in-process instrumentation (an OpenTelemetry SDK) would record the run: every
    time is stamped by the process that records it, so an event falling in a freeze of that
    process is stamped at the thaw (a request arriving during the freeze starts its span then; a
    call whose reply came during the freeze ends then). The servers of the `uninstrumented` tiers
    export nothing: they appear only as CLIENT spans (kind 3, `db.system`, `server.address`,
    `server.port`, `db.statement`) in their caller's resource, stamped by the caller: such a span
    ends when the caller took the reply (`Span.picked_s`: it had a core again), not when the callee
    sent it, as a thread waiting for the GIL or a busy event loop stamps it."""
    thaw = _thaw_of(system)
    by_id = {s.span_id: s for s in spans}
    groups: dict[tuple[str, str], list[dict]] = {}
    for s in spans:
        if s.tier in uninstrumented:
            caller = by_id.get(s.parent_id or "")
            if caller is None:
                continue
            rec = caller
            body = {
                "traceId": s.trace_id,
                "spanId": s.span_id,
                "parentSpanId": s.parent_id,
                "name": s.name,
                "kind": 3,
                "startTimeUnixNano": str(ns(thaw[rec.server](s.start_s))),
                "endTimeUnixNano": str(ns(thaw[rec.server](s.picked_s if s.picked_s is not None else s.end_s))),
                "attributes": [
                    {"key": "db.system", "value": {"stringValue": db_system}},
                    {"key": "server.address", "value": {"stringValue": s.server}},
                    {"key": "server.port", "value": {"intValue": "5432"}},
                    {"key": "db.statement", "value": {"stringValue": s.name}},
                ],
                "status": {},
            }
            groups.setdefault((rec.tier, rec.server), []).append(body)
            continue
        body = {
            "traceId": s.trace_id,
            "spanId": s.span_id,
            "name": s.name,
            "kind": 2,
            "startTimeUnixNano": str(ns(thaw[s.server](s.start_s))),
            "endTimeUnixNano": str(ns(thaw[s.server](s.end_s))),
            "status": {},
        }
        if s.parent_id:
            body["parentSpanId"] = s.parent_id
        groups.setdefault((s.tier, s.server), []).append(body)
    doc = {
        "resourceSpans": [
            {
                "resource": {
                    "attributes": [
                        {"key": "service.name", "value": {"stringValue": tier}},
                        {"key": "service.instance.id", "value": {"stringValue": server}},
                    ]
                },
                "scopeSpans": [{"scope": {"name": "independent-sim"}, "spans": body}],
            }
            for (tier, server), body in sorted(groups.items())
        ]
    }
    path.write_text(json.dumps(doc))
    return path


def freeze_events(system: System, warmup_s: float, duration_s: float):
    """The freezes inside the capture window as a tierscope `events` table (kind injected_pause)."""
    import pyarrow as pa

    rows = [
        (ns(a), ns(b), s.name)
        for s in system.servers
        for a, b in s.freezes
        if a >= warmup_s and b <= warmup_s + duration_s
    ]
    return pa.table(
        {
            "start_ns": pa.array([r[0] for r in rows], pa.int64()),
            "end_ns": pa.array([r[1] for r in rows], pa.int64()),
            "host": pa.array([r[2] for r in rows], pa.string()),
            "kind": pa.array(["injected_pause"] * len(rows), pa.string()),
            "detail": pa.array(["SIGSTOP freeze (independent simulator)"] * len(rows), pa.string()),
        }
    )


def periodic(first_s: float, every_s: float, length_s: float, until_s: float) -> list[tuple[float, float]]:
    """Freezes of `length_s` every `every_s` from `first_s` until `until_s`."""
    out, t = [], first_s
    while t + length_s <= until_s:
        out.append((t, t + length_s))
        t += every_s
    return out


def _union(stretches: list[tuple[float, float]]) -> list[tuple[float, float]]:
    out: list[list[float]] = []
    for x, y in sorted(stretches):
        if out and x <= out[-1][1]:
            out[-1][1] = max(out[-1][1], y)
        else:
            out.append([x, y])
    return [(x, y) for x, y in out]


def _per_window(stretches: list[tuple[float, float]], base_s: float, window_s: float, n_windows: int) -> np.ndarray:
    out = np.zeros(n_windows)
    for x, y in _union(stretches):
        k0, k1 = int((x - base_s) // window_s), int((y - base_s) // window_s)
        for k in range(max(k0, 0), min(k1, n_windows - 1) + 1):
            lo, hi = base_s + k * window_s, base_s + (k + 1) * window_s
            out[k] += max(0.0, min(hi, y) - max(lo, x)) / window_s
    return out


def saturated_truth(
    result: Result, system: System, server: str, base_s: float, window_s: float, n_windows: int
) -> np.ndarray:
    """Per window, whether `server` was saturated for at least half of it, by construction: a
    request waited for one of its cores, or it was frozen while holding a request."""
    mine = [(s.start_s, s.end_s) for s in result.spans if s.server == server]
    (srv,) = [s for s in system.servers if s.name == server]
    held = [(max(a, x), min(b, y)) for a, b in srv.freezes for x, y in mine if x < b and y > a]
    return _per_window(list(result.waits[server]) + held, base_s, window_s, n_windows) >= 0.5


def window_grid(result: Result, window_s: float) -> tuple[float, int]:
    """The analysis's window axis for these spans: base (simulation seconds) and window count
    (windows of `window_s` from the first arrival floored to a multiple of the window on the
    epoch, through the last departure)."""
    w = int(round(window_s * 1e9))
    first = min(ns(s.start_s) for s in result.spans)
    last = max(ns(s.end_s) for s in result.spans)
    base = first // w * w
    return (base - EPOCH_S * 1_000_000_000) / 1e9, (last - base) // w + 1


def truth_windows(result: Result, system: System, window_s: float = 0.05) -> dict[str, np.ndarray]:
    """Per tier: per window, whether at least half of its servers were saturated (by construction)."""
    base, n = window_grid(result, window_s)
    out = {}
    for tier in system.tiers:
        sat = np.array([saturated_truth(result, system, s.name, base, window_s, n) for s in system.of(tier)])
        out[tier] = sat.sum(0) >= np.ceil(sat.shape[0] / 2)
    return out


def truth_shares(result: Result, system: System, window_s: float = 0.05) -> dict[str, float]:
    """Per tier: the share of windows in which at least half of its servers were saturated."""
    return {t: float(v.mean()) for t, v in truth_windows(result, system, window_s).items()}
