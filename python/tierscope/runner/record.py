"""What a point leaves to be read later: its manifest (status, phases, tables, generator summary,
testbed, servers, notes) with the machine and the versions of every program it ran."""

from __future__ import annotations

import os
import platform
import subprocess
from pathlib import Path

from tierscope import __version__, manifest
from tierscope.engine import engine_version
from tierscope.runner.point import PointContext, users_of
from tierscope.services.databases import server_binaries
from tierscope.spec import Spec
from tierscope.tiers import TIERS


def machine() -> dict:
    return {
        "hostname": platform.node(),
        "kernel": platform.release(),
        "cpus": os.cpu_count(),
        "memory_bytes": os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"),
        "python": platform.python_version(),
    }


def versions() -> dict:
    def first_line(argv: list[str]) -> str | None:
        try:
            out = subprocess.run(argv, capture_output=True, text=True, timeout=10)
        except (OSError, subprocess.TimeoutExpired):
            return None
        text = (out.stdout or out.stderr).strip().splitlines()
        return text[0] if text else None

    return {
        "tierscope": __version__,
        "tierscope-engine": engine_version(),
        "nginx": first_line(["nginx", "-v"]),
        **{name: first_line([binary, "--version"]) if binary else None for name, binary in server_binaries().items()},
        "tcpdump": first_line(["tcpdump", "--version"]),
    }


def write_manifest(
    ctx: PointContext,
    status: str,
    reason: str | None,
    spec: Spec,
    counts: dict,
    summary: dict,
    vers: dict,
    seconds: float,
) -> None:
    c = ctx.point.config
    m = manifest.Manifest(
        kind="run",
        status=status,
        reason=reason,
        point=manifest.PointInfo(
            id=ctx.point.id,
            index=ctx.point.index,
            repeat=ctx.point.repeat,
            params=ctx.point.params,
            seed=ctx.point.seed,
            users=users_of(ctx.point),
            think_time_s=c.workload.think_time,
        ),
        topology=c.notation(),
        tiers={t: len(c.tier_servers(t)) for t in TIERS},
        phases=ctx.phases,
        tables=counts,
        generator=summary or None,
        testbed={
            "mode": ctx.testbed.mode if ctx.testbed is not None else None,
            "lost": ctx.testbed.lost if ctx.testbed is not None else [],
            "hosts": {n: {"address": h.address, "netns": h.netns, "cgroup": h.cgroup} for n, h in ctx.hosts.items()},
        },
        servers=[manifest.Server(address=a, tier=t, server=n, protocol=p) for a, t, n, p in ctx.server_map],
        notes=ctx.notes,
        seconds=round(seconds, 3),
        config=c.model_dump(mode="json"),
        spec_path=spec.path,
        versions=vers,
        machine=machine(),
    )
    manifest.write(m, ctx.dir / "manifest.json")


def point_status(point_dir: Path) -> str | None:
    """done / failed / None (never finished) from a point's manifest."""
    try:
        return manifest.read(point_dir / "manifest.json").status
    except (OSError, ValueError):
        return None
