"""Analyses: pure functions, tables in and tables out.

Fine grain (this package's windows, saturation, alternation, pauses and fine modules): per-server
load and throughput in 50 ms windows, the main sequence and its saturation point N*, saturated
windows and episodes, alternation between tiers, and the verdict in words. See docs/analysis.md.
"""

from tierscope.contracts import DEFAULT_WINDOW_NS

__all__ = ["DEFAULT_WINDOW_NS"]  # the window's default lives in tierscope.contracts
