"""Which backend serves a read (pure functions over the backends' state).

Least-Pending-Requests-First is Sequoia's RAIDb1_LPRF rule: scan the backends in configuration
order, skip those not enabled, keep the first one whose count of requests executing on it (reads
and writes) is strictly smaller than the best so far, and stop at the first with none. Ties go to
the earliest backend, so at light load the first backend serves most reads.
"""

from __future__ import annotations

from collections.abc import Sequence

LPRF, RR = "lprf", "rr"
POLICIES = (LPRF, RR)


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
