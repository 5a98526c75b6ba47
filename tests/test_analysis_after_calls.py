"""`analysis.after_calls`: the lead and tail of a caller's requests, by arithmetic."""

from __future__ import annotations

import numpy as np

from tierscope.analysis.after_calls import lead_and_tail, own_windows, time_in_windows

BASE = 1_700_000_000_000_000_000  # epoch ns: products of such numbers overflow int64


def test_time_in_windows_is_the_overlap_of_each_interval_with_each_window():
    start = BASE + np.array([5, 12, 0, 29])
    end = BASE + np.array([25, 13, 3, 29])
    # [5,25): 5 + 10 + 5; [12,13): 1 in the second; [0,3): 3 in the first; [29,29): nothing
    assert time_in_windows(start, end, BASE, 10, 3).tolist() == [8.0, 11.0, 5.0]


def test_lead_runs_to_the_first_call_and_tail_from_the_last_call():
    # row 0 calls rows 1 and 2 (out of order); row 3 calls nothing; row 2's call outlives row 0
    arrival = np.array([0, 40, 10, 0])
    departure = np.array([100, 60, 70, 50])
    parent = np.array([-1, 0, 0, -1])
    lead, tail = lead_and_tail(arrival, departure, parent)
    assert lead.tolist() == [10, -1, -1, -1]
    assert tail.tolist() == [30, -1, -1, -1]


def test_a_wait_before_calls_only_is_not_the_callers_own_and_a_wait_after_is():
    # 40 requests in each 10 ms window; in the first 5 windows each waits 9 ms before its call
    # and takes 0.2 ms after it (a connection wait); in the last 5, 4 ms before and 4 ms after
    # (a wait for the caller's cores slows both)
    w, n = 10_000_000, 10
    rows = []
    for k in range(n):
        for j in range(40):
            a = BASE + k * w + j * 10_000
            before, after = (9_000_000, 200_000) if k < 5 else (4_000_000, 4_000_000)
            rows.append((a, a + before, a + before + 300_000, a + before + 300_000 + after))
    a, call_start, call_end, d = (np.array(c, np.int64) for c in zip(*rows))
    arrival = np.concatenate([a, call_start])
    departure = np.concatenate([d, call_end])
    parent = np.concatenate([np.full(a.size, -1), np.arange(a.size)])
    lead, tail = lead_and_tail(arrival, departure, parent)
    callers = slice(0, a.size)
    own = own_windows(arrival[callers], departure[callers], lead[callers], tail[callers], BASE, w, n)
    # requests straddle the window edges by up to 13.3 ms: judge the windows they do not spill into
    assert not own[1:4].any()
    assert own[6:9].all()
