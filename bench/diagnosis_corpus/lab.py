"""Lab cases of the diagnosis corpus: tierscope's own lab (`tierscope run` on a variant of a shipped
preset, RUBBoS on namespaced hosts with CPU quotas), analysed from the tracer's capture (the point
directory). Kept apart from build.py so that a change here does not rebuild the app cases."""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

from build import save
from cases import Case

HERE = Path(__file__).resolve().parent


def lab_source_hash() -> str:
    return hashlib.sha256((HERE / "lab.py").read_bytes()).hexdigest()


def _variant(preset: str, users: list[int], run: str) -> str:
    from tierscope.cli.demo import preset as preset_path

    text = Path(preset_path(preset)).read_text()
    text = re.sub(r"(?m)^users = .*$", f"users = {users}", text)
    text = re.sub(r"(?m)^run = .*$", f'run = "{run}"', text)
    return text


def lab_run_key(case: Case, src: str = "") -> str:
    """The run's key: the preset's text and the overrides (not this file: measuring anew needs no new run)."""
    lab = case.lab
    text = _variant(lab["preset"], lab["users"], lab["run"])
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def build_lab_run(case: Case, cache: Path, src: str, log) -> Path:
    """Run (or reuse) the lab run a lab case is a point of; returns the run directory."""
    lab = case.lab
    key = lab_run_key(case, src)
    run_dir = cache / f"labrun-{lab['preset']}-{key}"
    if (run_dir / "done").exists():
        return run_dir
    shutil.rmtree(run_dir, ignore_errors=True)
    run_dir.mkdir(parents=True)
    spec = run_dir / "spec.toml"
    spec.write_text(_variant(lab["preset"], lab["users"], lab["run"]))
    tierscope = Path(sys.executable).parent / "tierscope"
    t0 = time.monotonic()
    log(f"  lab run {lab['preset']} users={lab['users']} run={lab['run']} (about 2 minutes)")
    with open(run_dir / "run.log", "w") as f:
        proc = subprocess.Popen(
            [str(tierscope), "run", str(spec), "-o", str(run_dir), "--name", "run", "--no-report"],
            stdout=f, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True,
        )  # fmt: skip
        try:
            rc = proc.wait()
        except BaseException:  # Ctrl-C or SIGTERM: `tierscope run` stops cleanly on SIGINT
            os.killpg(proc.pid, signal.SIGINT)
            try:
                proc.wait(120)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
            raise
    if rc != 0:
        raise RuntimeError(f"tierscope run {lab['preset']} failed ({rc}): see {run_dir / 'run.log'}")
    (run_dir / "done").write_text(f"{time.monotonic() - t0:.0f}\n")
    log(f"  lab run done in {time.monotonic() - t0:.0f} s")
    return run_dir


def point_dirs(run_dir: Path) -> list[Path]:
    base = run_dir / "run"
    return sorted((p for p in base.iterdir() if p.is_dir() and (p / "manifest.json").exists()), key=lambda p: p.name)


def lab_measure(point: Path, case: Case) -> dict:
    """Pauses from the point's events table, the db's CPU from its resources table."""
    import pyarrow.parquet as pq

    measured: dict = {}
    ev = point / "events.parquet"
    if ev.exists():
        t = pq.read_table(ev).to_pylist()
        pauses = [r for r in t if "pause" in str(r["kind"])]
        measured["pauses"] = len(pauses)
        if pauses:
            measured["pause_median_ms"] = round(
                statistics.median((r["end_ns"] - r["start_ns"]) / 1e6 for r in pauses), 1
            )
    res = point / "resources.parquet"
    if res.exists():
        measured.update(_db_util(pq.read_table(res), point))
    return measured


def _db_util(res, point: Path) -> dict:
    """The db hosts' mean cpu_util (percent of their CPU allowance) over the point, as a share."""
    df = res.to_pandas()
    out: dict = {}
    db = df[df["host"].astype(str).str.contains("db|postgres|pg|mysql|maria", regex=True, case=False)]
    util = db[db["metric"] == "cpu_util"]
    if len(util):
        out["db_util"] = round(float(util["value"].mean()) / 100.0, 3)
        out["db_hosts"] = sorted(set(util["host"].astype(str)))
    return out


def build_lab_case(case: Case, out: Path, cache: Path, src: str, log) -> None:
    run_dir = build_lab_run(case, cache, src, log)
    points = point_dirs(run_dir)
    point = points[case.lab["point"]]
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    measured = lab_measure(point, case)
    result = {
        "measured": measured,
        "forms": {"capture": [os.path.relpath(point, out)]},
        "role_map": {"web": "web", "app": "app", "db": "db", "web1": "web", "app1": "app", "db1": "db"},
    }
    save(out, case, result, out.name.rsplit("-", 1)[1], 0.0)
