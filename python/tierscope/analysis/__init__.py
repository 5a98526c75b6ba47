"""Analyses: pure functions, tables in and tables out.

Fine grain (this package's windows, saturation, alternation, pauses and fine modules): per-server
load and throughput in 50 ms windows, the main sequence and its saturation point N*, saturated
windows and episodes, alternation between tiers, and the verdict in words. See docs/analysis.md.
"""

#: the window of the fine-grained analysis, in ns (seed 001's 50 ms); the CLI's --window-ms and a
#: spec's monitor.window default to it
DEFAULT_WINDOW_NS = 50_000_000
