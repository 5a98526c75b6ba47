"""Which backend serves a read (pure functions over the backends' state).

Least-Pending-Requests-First is Sequoia's RAIDb1_LPRF rule: scan the backends in configuration
order, skip those not enabled, keep the first one whose count of requests executing on it (reads
and writes) is strictly smaller than the best so far, and stop at the first with none. Ties go to
the earliest backend, so at light load the first backend serves most reads.

The other policies: round robin (Sequoia's RAIDb1_RR); weighted round robin (nginx's smooth
weighted round robin: with weights 5, 1, 1 the order is a a b a c a a, not a a a a a b c); and
least response time x in flight (`lrt`, an adaptive policy in the family of Envoy's and
Finagle's least-loaded balancers: the backend with the smallest (pending + 1) x recent read
latency, so a replica slowed by heavy queries gets fewer reads even when its queue is short).

The resource-aware policy (`aware`) knows *what* each replica is busy with, not only how many
requests: every read has a label (its statement text with literals replaced, `sql.label`), the
manager keeps each label's moving-average service time, and a replica's score is its expected
wait, the sum over the requests in flight there of their expected remaining service time
(`expected_remaining`: the label's average minus the time already spent, never below a quarter of
the average; a write or a read of an unknown label counts as the typical read). The read goes to
the replica with the smallest expected wait (ties: fewer pending, then the earliest), so a replica
running a heavy query (a label whose average is far above the typical read's, `heavy_labels`) gets
no light reads while another replica is free of heavy work. A heavy read itself joins a replica
already running heavy reads when it would wait there less than it runs (heavy work kept on as few
replicas as possible, each heavy read at most twice as long). With all requests alike it is
least-pending (LPRF's choice, up to ties).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

LPRF, RR, WRR, LRT, AWARE = "lprf", "rr", "wrr", "lrt", "aware"
POLICIES = (LPRF, RR, WRR, LRT, AWARE)


def choose_lprf(pending: Sequence[int], enabled: Sequence[bool] | None = None) -> int | None:
    """The index of the backend LPRF picks, or None when no backend is enabled."""
    best, best_pending = None, None
    for i, n in enumerate(pending):
        if enabled is not None and not enabled[i]:
            continue
        if best_pending is None or n < best_pending:
            best, best_pending = i, n
            if n == 0:
                break
    return best


def choose_rr(next_index: int, enabled: Sequence[bool]) -> tuple[int | None, int]:
    """Round robin (Sequoia's RAIDb1_RR): starting at `next_index`, the first enabled backend, at
    most one lap; returns (chosen or None, the index to start from next time)."""
    n = len(enabled)
    for k in range(n):
        i = (next_index + k) % n
        if enabled[i]:
            return i, (i + 1) % n
    return None, next_index % n if n else 0


def choose_wrr(
    current: Sequence[float], weights: Sequence[float], enabled: Sequence[bool]
) -> tuple[int | None, list[float]]:
    """Smooth weighted round robin: every enabled backend's `current` grows by its weight, the
    largest is chosen (ties: the earliest) and loses the total; returns (chosen or None, the new
    `current`). Disabled backends keep their value and take no part."""
    cur = list(current)
    total, best = 0.0, None
    for i, (w, on) in enumerate(zip(weights, enabled)):
        if not on or w <= 0:
            continue
        cur[i] += w
        total += w
        if best is None or cur[i] > cur[best]:
            best = i
    if best is not None:
        cur[best] -= total
    return best, cur


def choose_lrt(pending: Sequence[int], latency_s: Sequence[float | None], enabled: Sequence[bool]) -> int | None:
    """Least (pending + 1) x recent read latency among the enabled backends; a backend with no
    latency yet scores 0, so each is tried once before the averages decide; ties: the earliest."""
    best, best_score = None, None
    for i, (n, lat, on) in enumerate(zip(pending, latency_s, enabled)):
        if not on:
            continue
        score = (n + 1) * (lat or 0.0)
        if best_score is None or score < best_score:
            best, best_score = i, score
    return best


def ewma(previous: float | None, sample: float, alpha: float = 0.2) -> float:
    """The exponentially weighted moving average after `sample` (the sample itself at first)."""
    return sample if previous is None else previous + alpha * (sample - previous)


def expected_remaining(expected_s: float, elapsed_s: float, floor: float = 0.25) -> float:
    """The expected remaining service of a request whose label takes `expected_s` on average and
    which has run `elapsed_s`: the difference, but at least `floor` x the average (a request past
    its average is not about to end for sure)."""
    return max(expected_s - elapsed_s, floor * expected_s)


def expected_wait(inflight: Iterable[tuple], now: float, others: int = 0, typical_s: float = 0.0) -> float:
    """A replica's expected wait: the expected remaining service of its requests in flight,
    given as (expected seconds, started at, ...), plus `others` requests (writes) of `typical_s`
    each."""
    return sum(expected_remaining(x[0], now - x[1]) for x in inflight) + others * typical_s


def choose_aware(
    wait_s: Sequence[float],
    pending: Sequence[int],
    enabled: Sequence[bool],
    heavy: Sequence[int] | None = None,
    own_s: float | None = None,
) -> int | None:
    """The enabled backend with the smallest expected wait; ties: fewer pending, then the earliest.

    For a heavy read (`own_s`, its expected service, and `heavy`, the heavy reads in flight per
    backend, given): the backend already running the most heavy reads (ties: the smaller wait) if
    the read would wait there less than its own service, so heavy reads share as few replicas as
    possible and each waits at most as long as it runs; otherwise the rule above."""
    if heavy is not None and own_s is not None:
        best = None
        for i, (w, h, on) in enumerate(zip(wait_s, heavy, enabled)):
            if on and h > 0 and w <= own_s and (best is None or (h, -w) > (heavy[best], -wait_s[best])):
                best = i
        if best is not None:
            return best
    best, best_key = None, None
    for i, (w, n, on) in enumerate(zip(wait_s, pending, enabled)):
        if not on:
            continue
        key = (w, n)
        if best_key is None or key < best_key:
            best, best_key = i, key
    return best


def weighted_median(values: Sequence[float], weights: Sequence[float]) -> float | None:
    """The lower weighted median: the smallest value whose cumulative weight reaches half the total
    (None when there is no weight)."""
    pairs = sorted((v, w) for v, w in zip(values, weights) if w > 0)
    total = sum(w for _, w in pairs)
    if total <= 0:
        return None
    acc = 0.0
    for v, w in pairs:
        acc += w
        if acc >= total / 2:
            return v
    return pairs[-1][0]


def heavy_labels(
    service_s: Mapping[str, float], counts: Mapping[str, float], factor: float = 10.0, floor_s: float = 0.005
) -> tuple[set[str], float | None]:
    """The heavy labels and the typical service time: the typical time is the median over the
    executions (labels weighted by their counts), and a label is heavy when its average is more
    than `factor` times the typical time and above `floor_s` (nothing is heavy at sub-ms scale)."""
    labels = list(service_s)
    typical = weighted_median([service_s[k] for k in labels], [counts.get(k, 0) for k in labels])
    if typical is None:
        return set(), None
    limit = max(factor * typical, floor_s)
    return {k for k in labels if service_s[k] > limit}, typical
