"""The passive network tracer's Python side.

* `run.trace_capture` runs `tierscope-engine trace` on a capture file and returns its counts;
* `capture.LiveCapture` runs tcpdump on an interface (or inside a host's network namespace) and
  stops it cleanly;
* `link.link_transactions` links rows across tiers into transactions, by request id or by time
  containment on the same host, and says which was used;
* `servermap.write_server_map` writes the `address:port tier server [protocol]` file the engine
  reads.
"""

from tierscope.trace.capture import CaptureStats, LiveCapture
from tierscope.trace.link import link_transactions
from tierscope.trace.run import TraceError, TraceResult, trace_capture
from tierscope.trace.servermap import ServerEntry, write_server_map

__all__ = [
    "CaptureStats",
    "LiveCapture",
    "ServerEntry",
    "TraceError",
    "TraceResult",
    "link_transactions",
    "trace_capture",
    "write_server_map",
]
