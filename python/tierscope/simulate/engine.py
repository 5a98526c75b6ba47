"""Discrete-event simulation of a closed N-tier system (the model is described in docs/simulate.md).

Users think, then send one request to the first tier. At a server a request first needs a worker
thread (FIFO accept queue when all are busy), then alternates CPU segments (FIFO queue for the
server's cores) with synchronous calls to the next tier, holding its thread while it waits; its
CPU time is split evenly into calls + 1 segments. A frozen server (stop-the-world pause) makes no
CPU progress: a segment that meets a pause finishes that much later. Everything is exact event
time arithmetic in float seconds inside the loop; times are converted to integer ns once, at the
end, relative to the spec's epoch start.

Ground truth: a server is *saturated* while (a) it is frozen and holds at least one request,
(b) all its cores are busy and a segment waits for a core, or (c) all its threads are busy and a
request waits for a thread. The simulator records these intervals as it runs.
"""

from __future__ import annotations

import bisect
import heapq
import random
from collections import deque
from dataclasses import dataclass, field

from .arrivals import Modulation, mmpp2_for
from .spec import Spec

_THINK_END = 0
_SEGMENT_DONE = 1


class _Server:
    __slots__ = (
        "index",
        "name",
        "tier",
        "cores",
        "threads",
        "cores_busy",
        "threads_busy",
        "present",
        "cpu_queue",
        "accept_queue",
        "freeze_start",
        "freeze_end",
        "flags",
        "since",
        "truth",
        "busy_start",
        "busy_end",
    )

    def __init__(self, index: int, name: str, tier: int, cores: int, threads: int):
        self.index = index
        self.name = name
        self.tier = tier
        self.cores = cores
        self.threads = threads
        self.cores_busy = 0
        self.threads_busy = 0
        self.present = 0
        self.cpu_queue: deque = deque()
        self.accept_queue: deque = deque()
        self.freeze_start: list[float] = []
        self.freeze_end: list[float] = []
        # condition flags: cpu saturated, threads saturated, holding a request
        self.flags = [False, False, False]
        self.since = [0.0, 0.0, 0.0]
        self.truth: tuple[list, list, list] = ([], [], [])  # intervals per condition
        self.busy_start: list[float] = []  # CPU work pieces (for utilisation)
        self.busy_end: list[float] = []


class _Request:
    __slots__ = ("rid", "parent", "tier", "server", "label", "arrival", "calls_left", "segment", "user", "start")

    def __init__(self, rid, parent, tier, server, label, arrival, calls_left, segment, user, start):
        self.rid = rid
        self.parent = parent
        self.tier = tier
        self.server = server
        self.label = label
        self.arrival = arrival
        self.calls_left = calls_left
        self.segment = segment
        self.user = user
        self.start = start


@dataclass
class Trace:
    """Everything the simulation produced, in float seconds since simulated time 0."""

    servers: list[tuple[str, str, int]]  # (tier, server, cores)
    labels: list[str]
    # requests: server index, request id, parent id (-1 none), label index, arrival, departure
    req_server: list[int] = field(default_factory=list)
    req_id: list[int] = field(default_factory=list)
    req_parent: list[int] = field(default_factory=list)
    req_label: list[int] = field(default_factory=list)
    req_arrival: list[float] = field(default_factory=list)
    req_departure: list[float] = field(default_factory=list)
    # client requests: user, label index, start, end
    cli_user: list[int] = field(default_factory=list)
    cli_label: list[int] = field(default_factory=list)
    cli_start: list[float] = field(default_factory=list)
    cli_end: list[float] = field(default_factory=list)
    freezes: list[tuple[int, float, float]] = field(default_factory=list)  # server, start, end
    surges: list[tuple[float, float]] = field(default_factory=list)
    truth: list[tuple[int, str, float, float]] = field(default_factory=list)  # server, cause, start, end
    busy: list[tuple[int, list[float], list[float]]] = field(default_factory=list)
    events_processed: int = 0


def _freeze_schedule(spec_freeze, horizon: float, rng: random.Random) -> tuple[list[float], list[float]]:
    starts: list[float] = []
    ends: list[float] = []
    t = spec_freeze.offset_s
    first = True
    while True:
        jitter = spec_freeze.jitter * spec_freeze.period_s
        step = 0.0 if first else spec_freeze.period_s
        t = t + step + (rng.uniform(-jitter, jitter) if not first else rng.uniform(0, jitter))
        first = False
        if t >= horizon:
            return starts, ends
        if starts and t < ends[-1]:
            t = ends[-1]
        starts.append(t)
        ends.append(t + spec_freeze.duration_s)


def run(spec: Spec) -> Trace:
    """Simulate `spec` and return the raw trace (see `tierscope.simulate.output` for the tables)."""
    rng = random.Random(spec.seed)
    horizon = spec.duration_s
    labels = list(spec.workload.mix)
    weights = [spec.workload.mix[k] for k in labels]
    n_tiers = len(spec.tier)

    servers: list[_Server] = []
    tier_servers: list[list[_Server]] = []
    for ti, tier in enumerate(spec.tier):
        group = []
        for k in range(tier.servers):
            name = f"{tier.name}{k + 1}"
            s = _Server(len(servers), name, ti, tier.cores, tier.threads)
            if tier.freeze is not None:
                s.freeze_start, s.freeze_end = _freeze_schedule(tier.freeze, horizon, rng)
            servers.append(s)
            group.append(s)
        tier_servers.append(group)
    # per tier and label: mean CPU seconds, calls; exponential or deterministic
    service = [[t.service_for(label) for label in labels] for t in spec.tier]
    calls = [[t.calls_for(label) if ti < n_tiers - 1 else 0 for label in labels] for ti, t in enumerate(spec.tier)]
    exponential = [t.distribution == "exponential" for t in spec.tier]
    rr = [0] * n_tiers

    trace = Trace(servers=[(spec.tier[s.tier].name, s.name, s.cores) for s in servers], labels=labels)
    req_server, req_id, req_parent = trace.req_server, trace.req_id, trace.req_parent
    req_label, req_arrival, req_departure = trace.req_label, trace.req_arrival, trace.req_departure

    wl = spec.workload
    modulation = None
    if wl.index_of_dispersion > 1 and wl.think_time_s > 0:
        modulation = Modulation(
            mmpp2_for(wl.users, wl.think_time_s, wl.index_of_dispersion, wl.surge_share, wl.surge_factor),
            horizon,
            rng,
        )
        trace.surges = modulation.surge_intervals(horizon)
    think_rate = 1.0 / wl.think_time_s if wl.think_time_s > 0 else 0.0

    heap: list = []
    seq = 0
    next_rid = 0
    expo = rng.expovariate
    cum_weights = []
    acc = 0.0
    for w in weights:
        acc += w
        cum_weights.append(acc)

    def think_until(t: float) -> float:
        if think_rate == 0.0:
            return t
        if modulation is None:
            return t + expo(think_rate)
        return modulation.next_arrival(t, rng)

    def check(s: _Server, t: float) -> None:
        flags = s.flags
        now = (
            s.cores_busy == s.cores and len(s.cpu_queue) > 0,
            s.threads_busy == s.threads and len(s.accept_queue) > 0,
            s.present > 0,
        )
        for i in (0, 1, 2):
            if now[i] != flags[i]:
                if flags[i]:
                    if t > s.since[i]:
                        s.truth[i].append((s.since[i], t))
                else:
                    s.since[i] = t
                flags[i] = now[i]

    def advance(s: _Server, t: float, work: float) -> float:
        """End of `work` CPU seconds started at t on server s, skipping its pauses; records pieces."""
        fs = s.freeze_start
        if not fs:
            s.busy_start.append(t)
            s.busy_end.append(t + work)
            return t + work
        fe = s.freeze_end
        i = bisect.bisect_right(fs, t) - 1
        if i >= 0 and t < fe[i]:
            t = fe[i]
        j = i + 1
        n = len(fs)
        while j < n and t + work > fs[j]:
            if fs[j] > t:
                s.busy_start.append(t)
                s.busy_end.append(fs[j])
                work -= fs[j] - t
            t = fe[j]
            j += 1
        s.busy_start.append(t)
        s.busy_end.append(t + work)
        return t + work

    def start_segment(req: _Request, s: _Server, t: float) -> None:
        nonlocal seq
        end = advance(s, t, req.segment)
        seq += 1
        heapq.heappush(heap, (end, seq, _SEGMENT_DONE, req))

    def want_cpu(req: _Request, s: _Server, t: float) -> None:
        if s.cores_busy < s.cores:
            s.cores_busy += 1
            start_segment(req, s, t)
        else:
            s.cpu_queue.append(req)
            check(s, t)

    def arrive(req: _Request, t: float) -> None:
        s = servers[req.server]
        s.present += 1
        if s.threads_busy < s.threads:
            s.threads_busy += 1
            want_cpu(req, s, t)
        else:
            s.accept_queue.append(req)
        check(s, t)

    def new_request(tier: int, parent, label: int, t: float, user: int, start: float) -> _Request:
        nonlocal next_rid
        group = tier_servers[tier]
        server = group[rr[tier] % len(group)]
        rr[tier] += 1
        mean = service[tier][label]
        total = expo(1.0 / mean) if (exponential[tier] and mean > 0) else mean
        n_calls = calls[tier][label]
        next_rid += 1
        return _Request(next_rid, parent, tier, server.index, label, t, n_calls, total / (n_calls + 1), user, start)

    def depart(req: _Request, s: _Server, t: float) -> None:
        nonlocal seq
        req_server.append(s.index)
        req_id.append(req.rid)
        req_parent.append(req.parent.rid if req.parent is not None else -1)
        req_label.append(req.label)
        req_arrival.append(req.arrival)
        req_departure.append(t)
        s.present -= 1
        s.threads_busy -= 1
        if s.accept_queue:
            nxt = s.accept_queue.popleft()
            s.threads_busy += 1
            want_cpu(nxt, s, t)
        check(s, t)
        parent = req.parent
        if parent is not None:
            want_cpu(parent, servers[parent.server], t)
        else:
            trace.cli_user.append(req.user)
            trace.cli_label.append(req.label)
            trace.cli_start.append(req.start)
            trace.cli_end.append(t)
            seq += 1
            heapq.heappush(heap, (think_until(t), seq, _THINK_END, req.user))

    for user in range(wl.users):
        seq += 1
        heapq.heappush(heap, (think_until(0.0), seq, _THINK_END, user))

    processed = 0
    pop = heapq.heappop
    while heap:
        t, _, kind, obj = pop(heap)
        if t >= horizon:
            break
        processed += 1
        if kind == _SEGMENT_DONE:
            req = obj
            s = servers[req.server]
            s.cores_busy -= 1
            if s.cpu_queue:
                nxt = s.cpu_queue.popleft()
                s.cores_busy += 1
                start_segment(nxt, s, t)
            if req.calls_left > 0:
                req.calls_left -= 1
                child = new_request(req.tier + 1, req, req.label, t, req.user, req.start)
                arrive(child, t)
                check(s, t)
            else:
                depart(req, s, t)
        else:
            label = bisect.bisect_left(cum_weights, rng.random() * acc)
            label = min(label, len(labels) - 1)
            req = new_request(0, None, label, t, obj, t)
            arrive(req, t)

    for s in servers:
        for i, cause in ((0, "cpu"), (1, "threads")):
            if s.flags[i] and horizon > s.since[i]:
                s.truth[i].append((s.since[i], horizon))
            for a, b in s.truth[i]:
                trace.truth.append((s.index, cause, a, b))
        if s.flags[2] and horizon > s.since[2]:
            s.truth[2].append((s.since[2], horizon))
        # frozen while holding a request: intersect the pauses with the busy intervals
        holding = s.truth[2]
        j = 0
        for a, b in zip(s.freeze_start, s.freeze_end):
            b = min(b, horizon)
            trace.freezes.append((s.index, a, b))
            while j < len(holding) and holding[j][1] <= a:
                j += 1
            k = j
            while k < len(holding) and holding[k][0] < b:
                lo, hi = max(a, holding[k][0]), min(b, holding[k][1])
                if hi > lo:
                    trace.truth.append((s.index, "freeze", lo, hi))
                k += 1
        trace.busy.append((s.index, s.busy_start, s.busy_end))
    trace.events_processed = processed
    return trace
