"""Turn a simulation trace into the tables a real run writes, plus the ground truth."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa

from .. import tables
from ..manifest import Interval, Manifest, Phases, PointInfo
from ..manifest import write as write_manifest
from .engine import Trace
from .spec import Spec

#: Ground truth: one row per interval in which a server was saturated (see docs/simulate.md).
SATURATION_TRUTH = pa.schema(
    [
        pa.field("tier", pa.string(), nullable=False),
        pa.field("server", pa.string(), nullable=False),
        pa.field("start_ns", pa.int64(), nullable=False),
        pa.field("end_ns", pa.int64(), nullable=False),
        pa.field("cause", pa.string(), nullable=False),  # freeze, cpu, threads (joined by +)
    ]
)

FILES = {
    "requests": "requests.parquet",
    "client_requests": "client_requests.parquet",
    "events": "events.parquet",
    "resources": "resources.parquet",
    "saturation_truth": "saturation_truth.parquet",
}


@dataclass
class Simulation:
    """The tables of one simulated run (all times epoch ns)."""

    spec: Spec
    requests: pa.Table
    client_requests: pa.Table
    events: pa.Table
    resources: pa.Table
    saturation_truth: pa.Table
    events_processed: int

    def write(self, directory: str | Path) -> dict[str, Path]:
        """Write every table as Parquet plus manifest.json into `directory`; returns the paths."""
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        out = {}
        for name in ("requests", "client_requests", "events", "resources"):
            out[name] = tables.write(getattr(self, name), directory / FILES[name], name)
        import pyarrow.parquet as pq

        out["saturation_truth"] = directory / FILES["saturation_truth"]
        pq.write_table(self.saturation_truth, out["saturation_truth"])
        start_ns = self.spec.start_ns + int(round(self.spec.warmup_s * 1e9))
        end_ns = self.spec.start_ns + int(round(self.spec.duration_s * 1e9))
        m = Manifest(
            kind="simulation",
            point=PointInfo(
                seed=self.spec.seed, users=self.spec.workload.users, think_time_s=self.spec.workload.think_time_s
            ),
            tiers={t.name: t.servers for t in self.spec.tier},
            phases=Phases(run=Interval(start_ns=start_ns, end_ns=end_ns)),  # after the warm-up
            tables={name: getattr(self, name).num_rows for name in FILES},
            spec=self.spec.model_dump(mode="json"),
            events_processed=self.events_processed,
            files={name: FILES[name] for name in FILES},
        )
        out["manifest"] = directory / "manifest.json"
        write_manifest(m, out["manifest"])
        return out


def _ns(seconds, start_ns: int) -> np.ndarray:
    """Float seconds since simulated time 0 → epoch ns (rounded to the nearest ns)."""
    return np.int64(start_ns) + np.rint(np.asarray(seconds, np.float64) * 1e9).astype(np.int64)


def _merge_truth(rows: list[tuple[int, str, float, float]]) -> list[tuple[int, float, float, str]]:
    """Union of the cause intervals per server; each merged interval names the causes it contains."""
    out = []
    by_server: dict[int, list[tuple[float, float, str]]] = {}
    for server, cause, a, b in rows:
        by_server.setdefault(server, []).append((a, b, cause))
    for server, items in sorted(by_server.items()):
        items.sort()
        cur_a, cur_b, causes = items[0][0], items[0][1], {items[0][2]}
        for a, b, cause in items[1:]:
            if a <= cur_b:
                cur_b = max(cur_b, b)
                causes.add(cause)
            else:
                out.append((server, cur_a, cur_b, "+".join(sorted(causes))))
                cur_a, cur_b, causes = a, b, {cause}
        out.append((server, cur_a, cur_b, "+".join(sorted(causes))))
    return out


def _cpu_per_second(trace: Trace, horizon: float) -> tuple[list, list, list]:
    """Busy share of all cores per server and per second (request work plus one core per pause)."""
    n = int(np.ceil(horizon))
    ts, host, value = [], [], []
    pauses: dict[int, list[tuple[float, float]]] = {}
    for server, a, b in trace.freezes:
        pauses.setdefault(server, []).append((a, b))
    for server, starts, ends in trace.busy:
        tier, name, cores = trace.servers[server]
        s = np.asarray(starts, np.float64)
        e = np.minimum(np.asarray(ends, np.float64), horizon)
        if pauses.get(server):
            p = np.asarray(pauses[server], np.float64)
            s = np.concatenate([s, p[:, 0]])
            e = np.concatenate([e, np.minimum(p[:, 1], horizon)])
        keep = e > s
        s, e = s[keep], e[keep]
        busy = np.zeros(n + 1)
        ks, ke = np.floor(s).astype(np.int64), np.floor(e).astype(np.int64)
        same = ks == ke
        np.add.at(busy, ks[same], e[same] - s[same])
        o = ~same
        np.add.at(busy, ks[o], ks[o] + 1 - s[o])
        np.add.at(busy, ke[o], e[o] - ke[o])
        full = np.zeros(n + 2)
        np.add.at(full, ks[o] + 1, 1)
        np.add.at(full, ke[o], -1)
        busy += np.cumsum(full)[: n + 1]
        for sec in range(n):
            width = min(1.0, horizon - sec)
            ts.append(sec + width)
            host.append(name)
            value.append(min(100.0, 100.0 * busy[sec] / (cores * width)))
    return ts, host, value


def to_tables(spec: Spec, trace: Trace) -> Simulation:
    """Build the requests, client_requests, events, resources and saturation_truth tables."""
    start_ns = spec.start_ns
    warm = spec.warmup_s
    horizon = spec.duration_s
    tiers = [t for t, _, _ in trace.servers]
    names = [n for _, n, _ in trace.servers]
    n_tiers = len(spec.tier)
    last_tier = spec.tier[-1].name

    server = np.asarray(trace.req_server, np.int32)
    arrival = np.asarray(trace.req_arrival, np.float64)
    keep = arrival >= warm
    server = server[keep]
    rid = np.asarray(trace.req_id, np.int64)[keep]
    parent = np.asarray(trace.req_parent, np.int64)[keep]
    label = np.asarray(trace.req_label, np.int32)[keep]
    arr_ns = _ns(arrival[keep], start_ns)
    dep_ns = _ns(np.asarray(trace.req_departure, np.float64)[keep], start_ns)
    # children may start in the same ns as a parent's rounding; keep intervals ordered
    dep_ns = np.maximum(dep_ns, arr_ns)
    tier_arr = pa.array(tiers, pa.string()).take(pa.array(server))
    server_arr = pa.array(names, pa.string()).take(pa.array(server))
    is_last = np.asarray([t == last_tier for t in tiers])[server] if n_tiers > 1 else np.ones(server.size, bool)
    requests = pa.table(
        {
            "tier": tier_arr,
            "server": server_arr,
            "request_id": pa.array(rid.astype(str).tolist(), pa.string()),
            "parent_id": pa.array([str(p) if p >= 0 else None for p in parent.tolist()], pa.string()),
            "label": pa.DictionaryArray.from_arrays(pa.array(label), pa.array(trace.labels)).cast(pa.string()),
            "arrival_ns": pa.array(arr_ns),
            "departure_ns": pa.array(dep_ns),
            "status": pa.array(np.where(is_last, "OK", "200").tolist(), pa.string()),
            "source": pa.array(["simulate"] * server.size, pa.string()),
        }
    )
    requests = tables.conform(requests, "requests")

    cstart = np.asarray(trace.cli_start, np.float64)
    ckeep = cstart >= warm
    cstart_ns = _ns(cstart[ckeep], start_ns)
    cend_ns = _ns(np.asarray(trace.cli_end, np.float64)[ckeep], start_ns)
    users = np.asarray(trace.cli_user, np.int64)[ckeep]
    clabels = np.asarray(trace.cli_label, np.int32)[ckeep]
    client = pa.table(
        {
            "user": pa.array(users),
            "session": pa.array(users),
            "state": pa.DictionaryArray.from_arrays(pa.array(clabels), pa.array(trace.labels)).cast(pa.string()),
            "path": pa.DictionaryArray.from_arrays(pa.array(clabels), pa.array(["/" + x for x in trace.labels])).cast(
                pa.string()
            ),
            "intended_ns": pa.array(cstart_ns),
            "start_ns": pa.array(cstart_ns),
            "first_byte_ns": pa.array(cend_ns),
            "end_ns": pa.array(cend_ns),
            "status": pa.array(np.full(users.size, 200, np.int32)),
            "phase": pa.array(["run"] * users.size, pa.string()),
        }
    )
    client = tables.conform(client, "client_requests")

    ev_start, ev_end, ev_host, ev_kind, ev_detail = [], [], [], [], []
    for s, a, b in trace.freezes:
        a2, b2 = max(a, warm), min(b, horizon)
        if b2 > a2:
            ev_start.append(a2)
            ev_end.append(b2)
            ev_host.append(names[s])
            ev_kind.append("injected_pause")
            ev_detail.append(f"tier={tiers[s]} stop-the-world")
    for a, b in trace.surges:
        a2, b2 = max(a, warm), min(b, horizon)
        if b2 > a2:
            ev_start.append(a2)
            ev_end.append(b2)
            ev_host.append("client")
            ev_kind.append("burst")
            ev_detail.append("workload surge (MMPP state)")
    events = tables.conform(
        pa.table(
            {
                "start_ns": pa.array(_ns(ev_start, start_ns) if ev_start else np.zeros(0, np.int64)),
                "end_ns": pa.array(_ns(ev_end, start_ns) if ev_end else np.zeros(0, np.int64)),
                "host": pa.array(ev_host, pa.string()),
                "kind": pa.array(ev_kind, pa.string()),
                "detail": pa.array(ev_detail, pa.string()),
            }
        ),
        "events",
    )

    ts, host, value = _cpu_per_second(trace, horizon)
    rkeep = [t > warm for t in ts]
    resources = tables.conform(
        pa.table(
            {
                "ts_ns": pa.array(
                    _ns([t for t, k in zip(ts, rkeep) if k], start_ns) if any(rkeep) else np.zeros(0, np.int64)
                ),
                "host": pa.array([h for h, k in zip(host, rkeep) if k], pa.string()),
                "metric": pa.array(["cpu_user"] * sum(rkeep), pa.string()),
                "value": pa.array([v for v, k in zip(value, rkeep) if k], pa.float64()),
                "unit": pa.array(["percent"] * sum(rkeep), pa.string()),
            }
        ),
        "resources",
    )

    merged = _merge_truth(trace.truth)
    t_server, t_start, t_end, t_cause = [], [], [], []
    for s, a, b, cause in merged:
        a2, b2 = max(a, warm), min(b, horizon)
        if b2 > a2:
            t_server.append(s)
            t_start.append(a2)
            t_end.append(b2)
            t_cause.append(cause)
    truth = pa.table(
        {
            "tier": pa.array([tiers[s] for s in t_server], pa.string()),
            "server": pa.array([names[s] for s in t_server], pa.string()),
            "start_ns": pa.array(_ns(t_start, start_ns) if t_start else np.zeros(0, np.int64)),
            "end_ns": pa.array(_ns(t_end, start_ns) if t_end else np.zeros(0, np.int64)),
            "cause": pa.array(t_cause, pa.string()),
        },
        schema=SATURATION_TRUTH,
    )
    return Simulation(spec, requests, client, events, resources, truth, trace.events_processed)
