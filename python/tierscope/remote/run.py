"""The sweep of a `--hosts` run: every point on the inventory's hosts, then the local run's tables.

Per point: the playbooks up, load, down (`playbooks`), then here: the hosts' files unpacked under
`<point>/remote/<host>/`, each server's capture merged into `capture.pcap` (each host captures
its own servers' ports, so every connection is captured once) and shifted by its host's clock
offset, the resource samples into `resources.parquet`, the generator's log into
`client_requests.parquet`, the servers' logs into `logs/`, then the runner's own collect (trace,
link, events) and manifest, with `clock_offsets_ns` added.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tarfile
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from tierscope import manifest, tables
from tierscope.load import merge_client_logs, split_users
from tierscope.remote import RemoteError, clock, playbooks, preflight
from tierscope.remote.agent import CAPTURE_LO
from tierscope.remote.inventory import Inventory, load_inventory
from tierscope.runner import (
    DONE,
    FAILED,
    WEB_PORT,
    Placement,
    PointContext,
    Progress,
    RunResult,
    collect,
    phase_times,
    point_status,
    stop_services,
    versions,
    write_manifest,
    write_run_report,
)
from tierscope.services.credentials import lab_credentials
from tierscope.spec import expand
from tierscope.testbed.host import Host


def check_spec(spec, inv: Inventory) -> list:
    """The spec's points, each assigned to hosts; RemoteError for what a remote run cannot do."""
    points = expand(spec)
    for p in points:
        c = p.config
        if c.interference.pause or c.interference.noisy_neighbour:
            raise RemoteError(
                f"point {p.id}: interference (pauses, noisy neighbours) runs only on the "
                "local testbed; remove [interference] for --hosts"
            )
        inv.assign(c)
    return points


def run_remote(
    spec,
    out: Path,
    inventory: Path,
    *,
    resume: bool = False,
    run_name: str | None = None,
    progress=None,
    report: bool = True,
    clock_shift_ns: dict[str, int] | None = None,
):
    """Run every point of `spec` on the hosts of `inventory` into `out/<run>/`; the runner's RunResult."""
    progress = progress or Progress()
    inv = load_inventory(inventory)
    points = check_spec(spec, inv)
    run_dir = Path(out) / (run_name or spec.name)
    run_dir.mkdir(parents=True, exist_ok=True)
    run_id = f"{run_dir.name}-{time.time_ns() // 1_000_000}"
    used = sorted({h.name for p in points for h in inv.assign(p.config).values()})
    progress.phase = "measuring the hosts' clocks"
    offsets = clock.measure_all([inv.hosts[h] for h in used], shift_ns=clock_shift_ns)
    (run_dir / "clocks.json").write_text(
        json.dumps({n: {"offset_ns": o.offset_ns, "rtt_ns": o.rtt_ns} for n, o in offsets.items()}, indent=1)
    )
    clock.check(offsets, inv.clock_bound_s, str(inventory))
    # a host that cannot run the agent is said once, in one line, before any point
    preflight.check_tierscope([inv.hosts[h] for h in used], str(inventory))
    (run_dir / "run.json").write_text(
        json.dumps({"started_ns": time.time_ns(), "spec": spec.path, "hosts": str(inventory)})
    )
    (run_dir / "spec.json").write_text(json.dumps(spec.model_dump(mode="json"), indent=1, default=str))
    cfg = playbooks.write_config(run_dir, inventory)
    result = RunResult(run_dir, [], [], [])
    progress.points_total = len(points)
    vers = versions()
    try:
        for i, p in enumerate(points):
            if resume and point_status(run_dir / p.id) == DONE:
                result.skipped.append(p.id)
                progress.finished.append((p.id, "skipped", "finished in an earlier run"))
                continue
            progress.point_index, progress.point_id = i + 1, p.id
            progress.point_started = time.monotonic()
            w = p.config.workload
            progress.point_seconds = w.ramp_up + w.run + w.ramp_down
            status, reason = run_remote_point(p, spec, run_dir, run_id, inv, cfg, offsets, progress, vers)
            (result.done.append(p.id) if status == DONE else result.failed.append((p.id, reason or "failed")))
            progress.finished.append((p.id, status, reason or ""))
    except KeyboardInterrupt:
        result.interrupted = True
    finally:
        try:
            playbooks.run_playbook(
                cfg, playbooks.cleanup_playbook(run_dir, run_id, used), run_dir / "ansible" / "cleanup.log", timeout=300
            )
        except RemoteError as err:
            progress.say(f"cleanup on the hosts failed: {err}")
        playbooks.close_connections(run_dir)
    if result.interrupted:
        return result
    if report and (result.done or result.skipped):
        progress.phase = "analysing"
        result.report, result.summary, result.data = write_run_report(run_dir, spec)
    return result


def run_remote_point(
    point, spec, run_dir: Path, run_id: str, inv: Inventory, cfg: Path, offsets: dict, progress, vers: dict
) -> tuple[str, str | None]:
    """One point on the hosts; always runs down.yml; returns (status, reason)."""
    pdir = run_dir / point.id
    if pdir.exists():
        shutil.rmtree(pdir)
    (pdir / "remote").mkdir(parents=True)
    ctx = PointContext(point, pdir)
    ctx.phases["point_start_ns"] = time.time_ns()
    started = time.monotonic()
    c = point.config
    assigned = inv.assign(c)
    servers = {
        s.name: {"tier": s.tier, "host": assigned[s.name].name, "address": assigned[s.name].address}
        for s in c.servers()
    }
    ctx.hosts = {n: Host(name=n, address=h.address) for n, h in assigned.items()}
    shares = split_users(int(c.workload.users[0]), c.client.hosts)
    generators = {
        assigned[f"client{k + 1}"].name: {"name": f"client{k + 1}", "users": n, "first": first}
        for k, (first, n) in enumerate(shares)
    }
    ctx.testbed = Placement(mode="remote")
    point_file = pdir / "remote" / "point.json"
    # the point's secret, for every host's servers: the file (and its copies) are root's alone
    creds = lab_credentials(pdir)
    point_file.unlink(missing_ok=True)
    fd = os.open(point_file, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(
            json.dumps(
                {
                    "point": point.model_dump(mode="json"),
                    "servers": servers,
                    "tag": f"{run_id}-{point.id}",
                    "credentials": {"user": creds.user, "password": creds.password},
                }
            )
        )
    web = c.tier_servers("web")[0].name
    url = f"http://{servers[web]['address']}:{WEB_PORT}"
    w = c.workload
    books = playbooks.point_playbooks(
        pdir,
        run_id,
        point.id,
        servers,
        generators,
        point_file,
        url,
        w.ramp_up + w.run + w.ramp_down,
        assigned["client1"].python,
    )
    log = pdir / "ansible.log"
    status, reason, counts, summary = FAILED, None, {}, {}
    timings: dict[str, float] = {}
    interrupted = False
    try:
        progress.phase = "deploying and starting the tiers (up.yml)"
        timings["up_s"] = playbooks.run_playbook(cfg, books["up"], log, timeout=900)
        progress.phase = "run"
        progress.users = int(w.users[0])
        timings["load_s"] = playbooks.run_playbook(
            cfg, books["load"], log, timeout=w.ramp_up + w.run + w.ramp_down + 300
        )
        status = DONE
    except KeyboardInterrupt:
        interrupted, reason = True, "interrupted"
    except RemoteError as err:
        reason = str(err)
    finally:
        progress.phase = "stopping and fetching (down.yml)"
        try:
            timings["down_s"] = playbooks.run_playbook(cfg, books["down"], log, timeout=600)
        except RemoteError as err:
            ctx.notes.append(f"down.yml: {err}")
        try:
            summary = gather(ctx, servers, assigned, offsets, generators)
            counts = collect(ctx)
        except Exception as err:
            ctx.notes.append(f"collect: {type(err).__name__}: {err}")
            if status == DONE:
                status, reason = FAILED, f"collect failed: {err}"
        stop_services(ctx)
        if status == DONE and counts.get("client_requests", 0) == 0:
            status, reason = FAILED, "the generator logged no request"
        died = [n for n in ctx.notes if "tier died" in n]
        if status == DONE and died:
            status, reason = FAILED, died[0]
        if not interrupted:
            write_manifest(ctx, status, reason, spec, counts, summary, vers, time.monotonic() - started)
            m = manifest.read(pdir / "manifest.json")
            extra = {
                "clock_offsets_ns": {n: o.offset_ns for n, o in offsets.items()},
                "clock_rtt_ns": {n: o.rtt_ns for n, o in offsets.items()},
                "remote": {
                    "inventory": str(inv.path),
                    "hosts": {n: s["host"] for n, s in servers.items()} | {g["name"]: h for h, g in generators.items()},
                    "playbook_s": timings,
                },
            }
            m = manifest.Manifest.model_validate({**m.model_dump(mode="json"), **extra})
            manifest.write(m, pdir / "manifest.json")
    if interrupted:
        shutil.rmtree(pdir, ignore_errors=True)
        raise KeyboardInterrupt
    return status, reason


def gather(ctx, servers: dict, assigned: dict, offsets: dict, generators: dict) -> dict:
    """Unpack what down.yml fetched and put it where the runner's collect finds it; returns the
    generator's summary."""
    pdir = ctx.dir
    remote = pdir / "remote"
    for tgz in sorted(remote.glob("*.tar.gz")):
        dest = remote / tgz.name[: -len(".tar.gz")]
        dest.mkdir(exist_ok=True)
        with tarfile.open(tgz) as tar:
            tar.extractall(dest, filter="data")
        tgz.unlink()
    shift = {n: _correction(offsets.get(h.name)) for n, h in assigned.items()}
    pcaps, resources = [], []
    for name, s in servers.items():
        d = remote / s["host"] / name
        for f in ("stopped.json", "state.json"):
            if (d / f).exists():
                st = json.loads((d / f).read_text())
                ctx.notes.extend(x for x in st.get("notes", []) if x not in ctx.notes)
                if st.get("died"):
                    ctx.notes.append(st["died"])
                if st.get("error"):
                    ctx.notes.append(f"{name}: {st['error']}")
                for entry in st.get("server_map", []):
                    if tuple(entry) not in ctx.server_map:
                        ctx.server_map.append(tuple(entry))
                break
        for pcap in ("capture.pcap", CAPTURE_LO):  # a server's capture: its interface's and lo's
            # one that caught nothing (lo with no client on the host) is its 24-byte header alone:
            # it adds no packet, and editcap would turn it into an empty pcapng mergecap refuses
            if (d / pcap).exists() and (d / pcap).stat().st_size > PCAP_HEADER_BYTES:
                pcaps.append(_shifted_pcap(d / pcap, shift[name]))
        if (d / "resources.parquet").exists():
            resources.append(_shifted(pq.read_table(d / "resources.parquet"), shift[name]))
        if (d / "logs").exists():
            shutil.copytree(d / "logs", pdir / "logs", dirs_exist_ok=True)
        if (d / "app-events").exists():
            shutil.copytree(d / "app-events", pdir / "app-events", dirs_exist_ok=True)
    if pcaps:
        subprocess.run(
            ["mergecap", "-F", "pcap", "-w", str(pdir / "capture.pcap"), *map(str, pcaps)],
            check=True,
            capture_output=True,
            timeout=600,
        )
    if resources:
        t = pa.concat_tables([tables.conform(r, "resources") for r in resources])
        tables.write(t, pdir / "resources.parquet", "resources")
    summary: dict = {}
    parts, summaries = [], []
    for host, g in sorted(generators.items(), key=lambda x: x[1]["first"]):
        d = remote / host / g["name"]
        if (d / "generator.json").exists():
            info = json.loads((d / "generator.json").read_text())
            summaries.append(
                {
                    "generator": g["name"],
                    "host": host,
                    "users": g["users"],
                    "first_user": g["first"],
                    "load_start_ns": info["load_start_ns"] + shift[g["name"]],
                    **(info.get("summary") or {}),
                }
            )
            if info.get("returncode"):
                ctx.notes.append(f"the workload generator {g['name']} exited with status {info['returncode']}")
        parts.append((d / "client_requests.parquet", g["first"], shift[g["name"]]))
        if (d / "generator.stderr.log").exists():
            suffix = "" if len(generators) == 1 else f".{g['name']}"
            shutil.copy(d / "generator.stderr.log", pdir / f"generator{suffix}.stderr.log")
    if summaries:
        t0 = min(x["load_start_ns"] for x in summaries)
        ctx.phases["load_start_ns"] = t0
        w = ctx.point.config.workload
        ctx.phases.update(phase_times(t0, w.ramp_up, w.run, w.ramp_down))
        summary = {k: v for k, v in summaries[0].items() if k not in ("generator", "host", "first_user")}
        if len(summaries) > 1:
            summary = {
                "generators": summaries,
                "throughput_rps": sum(float(x.get("throughput_rps") or 0) for x in summaries),
            }
    merge_client_logs(parts, pdir / "client_requests.parquet")
    return summary


def _correction(o) -> int:
    """What to add to a host's timestamps: minus its offset, when the offset is significant (above
    half the round trip it was measured with); 0 otherwise (e.g. namespace hosts: one kernel clock)."""
    if o is None or abs(o.offset_ns) <= o.rtt_ns / 2:
        return 0
    return -o.offset_ns


def _shifted(t: pa.Table, shift_ns: int) -> pa.Table:
    """`t` with every *_ns time column moved by shift_ns (a host's clock onto the controller's)."""
    if not shift_ns:
        return t
    for i, f in enumerate(t.schema):
        if f.name.endswith("_ns") and pa.types.is_integer(f.type) and "duration" not in f.name:
            t = t.set_column(i, f.name, pc.add(t.column(i), pa.scalar(shift_ns, f.type)))
    return t


#: a pcap file's global header: a file no longer holds no packet
PCAP_HEADER_BYTES = 24


def _shifted_pcap(path: Path, shift_ns: int) -> Path:
    """The capture with its timestamps moved by shift_ns (editcap -t), when above a microsecond."""
    if abs(shift_ns) < 1000:
        return path
    out = path.with_name(f"{path.stem}.shifted.pcap")
    subprocess.run(
        ["editcap", "-t", f"{shift_ns / 1e9:.9f}", str(path), str(out)], check=True, capture_output=True, timeout=600
    )
    return out
