"""Driving a point's workload: the generator(s) on the client host, the live display fed from
their progress, the phase times recorded (tierscope.load runs the engine)."""

from __future__ import annotations

import threading
import time
from pathlib import Path

from tierscope.apps import provider
from tierscope.load import LoadError, engine_args, merge_client_logs, run_load, split_users, workload_options
from tierscope.runner.point import PointContext, PointFailed, Progress, phase_times, users_of


def workload_file(config) -> Path:
    try:
        return provider(config.benchmark).workload_file(config.mix, config)
    except FileNotFoundError as err:
        raise PointFailed(str(err)) from None


def drive(ctx: PointContext, url: str, progress: Progress) -> dict:
    """Run the generator from the client host; return its final summary. With `[client] hosts = K`
    K generators run at once, each with its share of the users and its own seed, and their logs
    become one client_requests table (`load.merge_client_logs`)."""
    c = ctx.point.config
    k = c.client.hosts
    if k == 1:
        return _drive_one(
            ctx,
            url,
            progress,
            users_of(ctx.point),
            ctx.point.seed,
            ctx.dir / "client_requests.parquet",
            ctx.dir / "generator.stderr.log",
            show=True,
        )
    shares = split_users(users_of(ctx.point), k)
    results: list = [None] * k
    errors: list = [None] * k

    def one(i: int) -> None:
        first, n = shares[i]
        try:
            results[i] = _drive_one(
                ctx,
                url,
                progress,
                n,
                ctx.point.seed + first,
                ctx.dir / f"client_requests.gen{i + 1}.parquet",
                ctx.dir / f"generator.gen{i + 1}.stderr.log",
                show=i == 0,
            )
        except BaseException as err:  # noqa: BLE001 - re-raised below, in the runner's thread
            errors[i] = err

    threads = [threading.Thread(target=one, args=(i,), daemon=True) for i in range(k)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()  # each generator ends after its ramp-up + run + ramp-down
    progress.users = users_of(ctx.point)
    parts = [(ctx.dir / f"client_requests.gen{i + 1}.parquet", shares[i][0], 0) for i in range(k)]
    merge_client_logs(parts, ctx.dir / "client_requests.parquet")
    for path, _, _ in parts:
        path.unlink(missing_ok=True)
    for err in errors:
        if err is not None:
            raise err
    return {
        "generators": [
            {"generator": f"gen{i + 1}", "users": shares[i][1], "first_user": shares[i][0], **(r or {})}
            for i, r in enumerate(results)
        ],
        "throughput_rps": sum(float((r or {}).get("throughput_rps") or 0) for r in results),
    }


def _drive_one(
    ctx: PointContext, url: str, progress: Progress, users: int, seed: int, log: Path, stderr_log: Path, show: bool
) -> dict:
    """One generator from the client host; `show`: it feeds the live display and the phase times."""
    c = ctx.point.config
    w = c.workload
    argv = engine_args(
        workload_file(c),
        target=url,
        log=log,
        users=users,
        seed=seed,
        **workload_options(w),
    )
    client = ctx.hosts.get("client1")

    def on_progress(msg: dict) -> None:
        if not show:
            return
        progress.phase = msg.get("phase", progress.phase)
        progress.active_users = int(msg.get("active_users", 0))
        progress.rps = float(msg.get("rps", 0.0))
        progress.p90_ms = msg.get("p90_ms")
        progress.errors = int(msg.get("errors_total", msg.get("errors", progress.errors)))

    if show:
        progress.users = users
        progress.phase = "ramp_up"
    t0 = time.time_ns()
    if show:
        ctx.phases["load_start_ns"] = t0
    with open(stderr_log, "w") as stderr:
        try:
            result = run_load(
                client.wrap(argv) if client is not None else argv, on_progress=on_progress, stderr_to=stderr
            )
        except LoadError as err:
            raise PointFailed(f"the workload generator failed: {err}") from None
    if show:
        ctx.phases.update(phase_times(t0, w.ramp_up, w.run, w.ramp_down))
    if result.interrupted:
        raise KeyboardInterrupt
    if result.returncode != 0:
        tail = stderr_log.read_text()[-2000:]
        raise PointFailed(f"the workload generator exited with status {result.returncode}: {tail.strip()}")
    return result.summary or {}
