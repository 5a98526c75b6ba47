"""Contracts shared across tierscope, on the ground floor: this package imports nothing of the
project, so every other package can import it without a cycle (issue 23 item 1;
tests/test_package_cycles.py keeps new cycles out).

Windows of the fine-grained analysis, in nanoseconds: one unit, one default, one range, used by the
analysis, the spec (`monitor.window`) and the CLI (`--window-ms`).
"""

#: the window of the fine-grained analysis (seed 001's 50 ms)
DEFAULT_WINDOW_NS = 50_000_000
#: the smallest window: below 1 ms a window holds a fraction of one request's service
MIN_WINDOW_NS = 1_000_000
#: the largest: a minute (past that the analysis is the coarse one's)
MAX_WINDOW_NS = 60_000_000_000
