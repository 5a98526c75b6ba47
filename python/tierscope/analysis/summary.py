"""The verdict in words: where the bottleneck is, how sure tierscope is, what to look at next and
the numbers behind it, built from whatever analyses ran (`analysis.experiment.Analysis`). The report
and the terminal render it (`tierscope.report`)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from tierscope.analysis.experiment import Analysis
from tierscope.analysis.study import label_of
from tierscope.analysis.whitebox import bound_words, is_soft, resource_of, saturated_in_tiers
from tierscope.tiers import rank as tier_rank


@dataclass
class Summary:
    headline: str  # where the bottleneck is, in one sentence
    confidence: str  # how sure, in words
    look_at: list[str] = field(default_factory=list)  # what to look at next
    facts: list[tuple[str, str]] = field(default_factory=list)  # the numbers behind it


def resource_name(metric: str) -> str:
    """A white-box metric as the resource it stands for when that is not the CPU (`cpu_quota`: "CPU
    quota", `disk_util`: "disk", `mem_util`: "memory", `sockets_util`: "sockets", `connections_util`:
    "connections"); CPU metrics keep their name (cpu_util, cpu_user), which says how the CPU was
    measured."""

    name = resource_of(metric)
    return metric if name == "CPU" else name


def confidence_words(value: Any) -> str:
    """A confidence (0..1 number or a word) as words with the number."""
    if isinstance(value, (int, float)):
        word = "high" if value >= 0.8 else "medium" if value >= 0.5 else "low"
        return f"{word} ({value:.2f})"
    return str(value) if value is not None else "unknown"


def _pct(x: float) -> str:
    return f"{100 * x:.0f} %"


def _fine_lines(fine: Any, window_ms: float) -> tuple[list[str], list[tuple[str, str]]]:
    look, facts = [], []
    shares = getattr(fine, "saturated_share", {}) or {}
    paused = set()
    pauses = getattr(fine, "pauses", None)
    if isinstance(pauses, pa.Table) and pauses.num_rows and "paused_share" in pauses.column_names:
        paused = {r["tier"] for r in pauses.to_pylist() if r.get("paused_share", 0) > 0}
    for tier, share in sorted(shares.items(), key=lambda kv: -kv[1]):
        if share > 0:
            why = "load above N* or paused holding requests" if tier in paused else "load above N*"
            look.append(
                f"{tier}: saturated ({why}) in {_pct(share)} of the {window_ms:g} ms windows (strip chart and timeline)"
            )
    for key, ns in sorted((getattr(fine, "n_star", {}) or {}).items()):
        value = getattr(ns, "n_star", None)
        if not isinstance(value, (int, float)):
            continue
        if math.isfinite(value):
            facts.append(
                (
                    f"N* {key}",
                    f"{value:.1f} requests in the server ({getattr(ns, 'method', '?')}); "
                    f"max throughput {getattr(ns, 'max_throughput', float('nan')):.0f}/s",
                )
            )
        else:
            facts.append((f"N* {key}", f"none ({getattr(ns, 'method', 'no plateau')})"))
    switches = getattr(fine, "switches_per_s", None)
    if isinstance(switches, (int, float)) and switches > 0:
        facts.append(("saturated tier switches", f"{switches:.2f} per second"))
    episodes = getattr(fine, "episodes", None)
    if isinstance(episodes, pa.Table) and episodes.num_rows and {"tier", "duration_ns"} <= set(episodes.column_names):
        for tier in sorted(set(episodes.column("tier").to_pylist())):
            d = (
                np.asarray(
                    episodes.filter(pc.equal(episodes.column("tier"), tier))
                    .column("duration_ns")
                    .to_numpy(zero_copy_only=False),
                    float,
                )
                / 1e6
            )
            facts.append(
                (f"saturation episodes {tier}", f"{len(d)}, median {np.median(d):.0f} ms, longest {d.max():.0f} ms")
            )
    pauses = getattr(fine, "pauses", None)
    if isinstance(pauses, pa.Table) and pauses.num_rows and "paused_share" in pauses.column_names:
        for r in pauses.to_pylist():
            if r.get("paused_share", 0) > 0:
                corr = r.get("corr_load_vs_pause_ratio")
                corr_text = (
                    f"; correlation of its load with the pause ratio {corr:.2f}"
                    if isinstance(corr, float) and math.isfinite(corr)
                    else ""
                )
                look.append(f"{r['server']} was paused (GC, freezes) {_pct(r['paused_share'])} of the time{corr_text}")
    return look, facts


def server_tiers(data: Analysis) -> dict[str, str]:
    """Server (= testbed host) name -> tier, from the analysed requests."""
    req = data.requests
    if req is None or not {"tier", "server"} <= set(req.column_names):
        return {}
    pairs = req.select(["server", "tier"]).group_by(["server", "tier"]).aggregate([])
    return dict(zip(pairs.column("server").to_pylist(), pairs.column("tier").to_pylist()))


def _whitebox_level(data: Analysis) -> tuple[Any, Any, float] | None:
    """(black box, white box, users) of the analysed configuration at the level the fine-grained
    analysis looked at when a resource was saturated there, else at `saturated_level`."""
    config = data.focus_config if data.focus_config in data.blackbox else next(iter(data.blackbox), None)
    if config is None or config not in data.whitebox:
        return None
    bb, wb = data.blackbox[config], data.whitebox[config]
    fine_users = data.fine_users
    if fine_users is not None and wb.saturated.get(fine_users):
        return bb, wb, fine_users
    return bb, wb, saturated_level(bb.max_throughput_users, wb.saturated)


def saturated_level(max_throughput_users: float, saturated: dict[float, list[Any]]) -> float:
    """Where the white box is read (pure): at the maximum throughput's level; when nothing is
    saturated there but throughput fell past it (thrashing, or the maximum fell on the knee's level
    by a per cent of noise), at the first higher level where a resource is; else at the maximum's."""
    if saturated.get(max_throughput_users):
        return max_throughput_users
    return next((u for u in sorted(saturated) if u > max_throughput_users and saturated[u]), max_throughput_users)


def bound_tiers(data: Analysis, tiers: list[str]) -> dict[str, str]:
    """For each of `tiers` with a saturated white-box resource at the level `whitebox_saturated_tiers`
    reads: "db, disk-bound" (`whitebox.bound_words`)."""

    level = _whitebox_level(data)
    if level is None or not tiers:
        return {}
    _bb, wb, users = level
    found = saturated_in_tiers(wb.shares, tiers, users, host_tiers=server_tiers(data))
    return {t: bound_words(t, items) for t, items in found.items() if items}


def whitebox_saturated_tiers(data: Analysis) -> tuple[dict[str, list[str]], str, bool]:
    """Tiers with a resource above 95 % most of the time at the workload level the fine-grained
    analysis looked at, else at the maximum throughput of the analysed configuration:
    tier -> ["db1 cpu_util above 95 % in 98 % of the samples", ...], the level in words, and
    whether it is the analysed point's level. A software limit (connections, sockets) in the tier
    of a saturated hardware resource or upstream of it is left out: the queue it holds waits on
    that hardware."""
    level = _whitebox_level(data)
    if level is None:
        return {}, "", False
    bb, wb, users = level
    tiers = server_tiers(data)
    saturated = [(h, m) for h, m in wb.saturated.get(users) or [] if tiers.get(h) is not None]
    # a software limit (an app server's pool) pinned upstream of a saturated piece of hardware is
    # the queue that hardware causes, waiting for a connection: not a bottleneck of its own (seed
    # 004 §5: software limits count when no hardware is saturated)
    hard = [tier_rank(tiers[h], None) for h, m in saturated if not is_soft(m)]
    out: dict[str, list[str]] = {}
    for host, metric in saturated:
        tier = tiers[host]
        if is_soft(metric) and any(r >= tier_rank(tier, None) for r in hard):
            continue
        share = max(
            (
                r["share_above"]
                for r in wb.shares.to_pylist()
                if r["host"] == host and r["metric"] == metric and r["users"] == users
            ),
            default=float("nan"),
        )
        out.setdefault(tier, []).append(f"{host} {resource_name(metric)} above 95 % in {_pct(share)} of the samples")
    where = (
        " (maximum throughput)"
        if users == bb.max_throughput_users
        else f" (past the maximum throughput, at {bb.max_throughput_users:g} users)"
        if users != data.fine_users
        else ""
    )
    return out, f"at {users:g} users{where}", users == data.fine_users


def corroborate(
    verdict: Any, saturated_tiers: dict[str, list[str]], level: str, same_point: bool = True
) -> tuple[str | None, str]:
    """Combine the fine-grained verdict with the white-box saturated resources (docs/analysis.md,
    "The headline"). `same_point`: the white box was read at the analysed point's level. Returns
    (a replacement headline or None, a sentence to append)."""

    kind, tiers = getattr(verdict, "kind", None), list(getattr(verdict, "tiers", []) or [])
    if not saturated_tiers or kind not in ("single", "several"):
        return None, ""
    names = "; ".join(x for t in sorted(saturated_tiers) for x in saturated_tiers[t])
    if kind == "single":
        if set(saturated_tiers) == set(tiers):
            return None, f" The white box agrees: {names} {level}."
        # the named tier has no saturated resource at that very level, a tier downstream of it
        # has: the upstream queue waits on it (for a connection or a thread: time exclusive load
        # cannot attribute to a call that has not started)
        (x,) = tiers
        if same_point and len(saturated_tiers) == 1:
            (y,) = saturated_tiers
            if tier_rank(x, None) < tier_rank(y, None):
                head = (
                    f"Single bottleneck at {y}: {names} {level}; the {x} tier, saturated in the fine-grained "
                    f"analysis, has no saturated resource of its own: its queue waits on {y}."
                )
                return head, ""
        return None, f" The white box points elsewhere too: {names} {level}."
    # several tiers saturated at once, but only one of them has a saturated resource and all the
    # others are upstream of it: their queues are requests waiting on it, not work of their own
    if len(saturated_tiers) == 1:
        (only,) = saturated_tiers
        others = [t for t in tiers if t != only]
        if only in tiers and all(tier_rank(t, None) < tier_rank(only, None) for t in others):
            head = (
                f"Single bottleneck at {only}: {names} {level}; {_join_names(others)} "
                f"{'was' if len(others) == 1 else 'were'} saturated at the same time only as "
                f"{'its caller' if len(others) == 1 else 'its callers'} waiting on it, with no saturated "
                f"resource of {'its' if len(others) == 1 else 'their'} own."
            )
            return head, ""
    return None, f" The white box: {names} {level}."


def _join_names(names: list[str]) -> str:
    return names[0] if len(names) == 1 else ", ".join(names[:-1]) + " and " + names[-1]


def build_summary(data: Analysis) -> Summary:
    """The summary for `data` (see the module docstring)."""
    window_ms = data.window_ns / 1e6
    headline, confidence = None, "unknown"
    look: list[str] = []
    facts: list[tuple[str, str]] = []
    verdict = getattr(data.fine, "verdict", None) if data.fine is not None else None
    fine_says_none = verdict is not None and getattr(verdict, "kind", None) == "none"
    if verdict is not None:
        headline = getattr(verdict, "text", None) or str(verdict)
        headline = headline[:1].upper() + headline[1:] + ("" if headline.endswith(".") else ".")
        confidence = confidence_words(getattr(verdict, "confidence", None))
        n_windows = getattr(data.fine, "n_windows", 0) or 0
        if 0 < n_windows < 100:
            confidence += f", but from only {n_windows} windows of {window_ms:g} ms: collect a longer trace"
        evidence = getattr(verdict, "evidence", None)
        if evidence:
            facts.append(("evidence", str(evidence)))
        if data.fine_point:
            facts.append(("fine-grained analysis of", data.fine_point))
        replaced, more_text = corroborate(verdict, *whitebox_saturated_tiers(data))
        if replaced:
            facts.append(("fine-grained verdict", headline))
            headline = replaced
        else:
            headline += more_text
        for words in bound_tiers(data, list(getattr(verdict, "tiers", []) or [])).values():
            facts.append(("bound by", words))
        lines, more = _fine_lines(data.fine, window_ms)
        look += lines
        facts += more
    # coarse grain: saturated resources at the maximum throughput of each configuration
    for config, bb in data.blackbox.items():
        tag = "" if len(data.blackbox) == 1 else f" ({label_of(data, config)})"
        facts.append(
            (f"maximum throughput{tag}", f"{bb.max_throughput:.1f} requests/s at {bb.max_throughput_users:g} users")
        )
        if bb.knee is not None:
            facts.append((f"knee{tag}", f"{bb.knee.users:g} users ({bb.knee.detail})"))
        if bb.knee_bounds is not None:
            facts.append((f"N* from bounds{tag}", bb.knee_bounds.detail))
        wb = data.whitebox.get(config)
        if wb is not None:
            level = saturated_level(bb.max_throughput_users, wb.saturated)
            sat = wb.saturated.get(level) or []
            where = (
                "at maximum throughput"
                if level == bb.max_throughput_users
                else f"at {level:g} users (past the maximum throughput, at {bb.max_throughput_users:g} users)"
            )
            if sat:
                names = ", ".join(f"{h} {resource_name(m)}" for h, m in sat)
                look.append(
                    f"at {level:g} users{tag}, {names} spent most of the time above 95 % (utilisation densities)"
                )
                if headline is None or fine_says_none:
                    # hardware before a software limit (whitebox.SOFT_RESOURCES), a utilisation
                    # rather than the time its CPU quota bites
                    host, metric = sorted(sat, key=lambda hm: (is_soft(hm[1]), hm[1] == "cpu_quota"))[0]
                    share = max(
                        r["share_above"]
                        for r in wb.shares.to_pylist()
                        if r["host"] == host and r["metric"] == metric and r["users"] == level
                    )
                    tier = server_tiers(data).get(host)
                    tier_text = f" in the {tier} tier" if tier else ""
                    headline = (
                        f"Bottleneck at {host} ({resource_name(metric)}){tier_text}: above 95 % utilisation in {_pct(share)} of the "
                        f"samples {where}{tag}."
                    )
                    if fine_says_none:  # the coarse grain found what the analysed point did not show
                        headline += (
                            f" (The fine-grained analysis of {data.fine_point or 'the traced point'} "
                            f"found no saturated tier.)"
                        )
                        fine_says_none = False
                    confidence = confidence_words(share)
            elif headline is None:
                headline = (
                    f"No resource is saturated at maximum throughput{tag}: the limit is elsewhere (software "
                    f"resources, or short bottlenecks that one-second averages hide: look at the "
                    f"fine-grained sections)."
                )
                confidence = "low"
    if data.bmap is not None and data.bmap.num_rows:
        groups: dict[int, list[dict[str, Any]]] = {}
        for r in data.bmap.to_pylist():
            groups.setdefault(r["group"], []).append(r)
        for g, rows in sorted(groups.items()):
            bottlenecks = sorted({r["bottleneck"] or "no saturated resource" for r in rows})
            look.append(
                f"configuration group {g} ({'; '.join(label_of(data, r['config']) for r in rows)}): max throughput "
                f"{min(r['max_throughput'] for r in rows):.0f}-{max(r['max_throughput'] for r in rows):.0f}/s, "
                f"bottleneck {', '.join(bottlenecks)} (bottleneck map)"
            )
    if data.heavy_summary is not None and data.heavy_summary.num_rows:
        top = data.heavy_summary.to_pylist()[0]
        look.append(
            f"{top['heavy']} heavy request(s) '{top['label']}' at {top['tier']}: up to {top['max_ms']:.0f} ms "
            f"of their own against a median of {top['median_ms']:.1f} ms (heavy requests)"
        )
    if data.stalls is not None and data.stalls.num_rows:
        st = data.stalls.to_pylist()
        longest = max(st, key=lambda r: r["duration_ns"])
        look.append(
            f"{len(st)} stall(s): a server held requests and completed none, longest {longest['duration_ns'] / 1e6:.0f} ms "
            f"at {longest['server']} holding {longest['requests']} request(s) ({longest['labels']}); their "
            f"requests are victims, not heavy requests"
        )
    if data.imported is not None:
        facts.append(("imported", data.imported.summary()))
    if headline is None:
        headline = "Not enough data to locate a bottleneck." if data.fine is None else "No verdict."
    return Summary(headline=headline, confidence=confidence, look_at=look, facts=facts)
