"""The experiment runner: every point of a spec's sweep, one after the other, start to finish.

For each point: build the hosts (testbed), restore the database from its snapshot, start the
tiers and wait for health, start the capture, the resource monitor and the interference, drive the
workload (ramp-up, run, ramp-down), then stop everything and collect: the generator's log, the
capture traced into `requests`, `resources`, `events`, the servers' logs, and `manifest.json`.
Results go to `OUT/<run>/<point>/`. A point whose tier dies is recorded as failed with the reason
and the sweep goes on; Ctrl-C stops cleanly, keeps finished points and leaves nothing running.
At the end the analysis runs over the whole run and `report.html` is written.

One idea a module, each stage a small function over a `PointContext`; I/O is here, the analysis
is elsewhere:

- `point`: the point's context, status words, the live display's state, workload level and phases;
- `lifecycle`: one point start to finish (hosts, tiers, capture, monitor, interference, teardown);
- `drive`: the generator(s) on the client host;
- `collect`: stopping what runs and gathering the tables (the capture traced and linked);
- `record`: the manifest, with the machine and the programs' versions;
- `experiment`: the whole run, then the analysis and report.html.

What this package exports below is its public API: the CLI, the `--hosts` runner
(tierscope.remote, which runs the same point lifecycle on real hosts) and the benches use only
these names.
"""

from tierscope import assembly
from tierscope.runner.collect import collect, link_point_requests, note_disabled_backends, stop_services
from tierscope.runner.drive import drive, workload_file
from tierscope.runner.experiment import RunResult, remove_orphaned_labs, run_experiment, write_run_report
from tierscope.runner.lifecycle import (
    CAPTURE_FILTER,
    check_db_topology,
    prepare_data,
    run_point,
    socket_limits,
    start_tiers,
)
from tierscope.runner.point import (
    DONE,
    FAILED,
    Placement,
    PointContext,
    PointFailed,
    Progress,
    phase_times,
    users_of,
)
from tierscope.runner.record import point_status, versions, write_manifest

#: the ports inside the hosts (web, app, middleware; a database server listens on its DBMS's port):
#: the assembly's, named here too for the remote controller
WEB_PORT, APP_PORT, MIDDLEWARE_PORT = assembly.WEB_PORT, assembly.APP_PORT, assembly.MIDDLEWARE_PORT

__all__ = [
    "APP_PORT",
    "CAPTURE_FILTER",
    "DONE",
    "FAILED",
    "MIDDLEWARE_PORT",
    "WEB_PORT",
    "Placement",
    "PointContext",
    "PointFailed",
    "Progress",
    "RunResult",
    "check_db_topology",
    "collect",
    "drive",
    "link_point_requests",
    "note_disabled_backends",
    "phase_times",
    "point_status",
    "prepare_data",
    "remove_orphaned_labs",
    "run_experiment",
    "run_point",
    "socket_limits",
    "start_tiers",
    "stop_services",
    "users_of",
    "versions",
    "workload_file",
    "write_manifest",
    "write_run_report",
]
