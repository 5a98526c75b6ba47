"""The passive network tracer's Python side.

* `run.trace_capture` runs `tierscope-engine trace` on a capture file and returns its counts;
* `capture.LiveCapture` runs tcpdump on an interface (or inside a host's network namespace) and
  stops it cleanly;
* `link.link_transactions` links rows across tiers into transactions, by request id or by time
  containment on the same host, and says which was used;
* `servermap.write_server_map` writes the `address:port tier server [protocol]` file the engine
  reads.

Import the submodule you use: this package imports none of them, so the analysis reads
`trace.link` (pure: tables in, tables out) without loading the capture's hosts (`testbed`).
"""
