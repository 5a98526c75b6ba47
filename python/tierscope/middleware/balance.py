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
"""

from __future__ import annotations

from collections.abc import Sequence

LPRF, RR, WRR, LRT = "lprf", "rr", "wrr", "lrt"
POLICIES = (LPRF, RR, WRR, LRT)


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


def choose_wrr(current: Sequence[float], weights: Sequence[float],
               enabled: Sequence[bool]) -> tuple[int | None, list[float]]:
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


def choose_lrt(pending: Sequence[int], latency_s: Sequence[float | None],
               enabled: Sequence[bool]) -> int | None:
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
