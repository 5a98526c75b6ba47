"""A whole run: every point of a spec's sweep one after the other (orphaned labs removed first,
finished points kept by `--resume`), then the analysis and report.html."""

from __future__ import annotations

import json
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

from tierscope.analysis.experiment import analyze_run
from tierscope.analysis.summary import build_summary
from tierscope.contracts import DEFAULT_WINDOW_NS
from tierscope.report import write_report
from tierscope.runner.lifecycle import prepare_data, run_point
from tierscope.runner.point import DONE, Progress
from tierscope.runner.record import point_status, versions
from tierscope.spec import Spec, expand
from tierscope.studies import finding_of_run
from tierscope.testbed.lab import find_orphans, remove_orphan


@dataclass
class RunResult:
    dir: Path
    done: list[str]
    failed: list[tuple[str, str]]
    skipped: list[str]
    interrupted: bool = False
    report: Path | None = None
    summary: object | None = None  # tierscope.report.Summary of the whole run
    data: object | None = None  # tierscope.report.Analysis the summary was built from


def remove_orphaned_labs(say) -> int:
    """Find the labs a killed run left (their owner is dead), say so one line each and remove them
    (`tierscope testbed clean --orphans`); returns how many."""
    try:
        orphans = find_orphans()
    except OSError:
        return 0
    for o in orphans:
        gone = remove_orphan(o.lab)
        say(
            f"{o}: removed {len(gone['processes'])} processes, {len(gone['netns'])} namespaces, "
            f"{len(gone['links'])} links, {len(gone['cgroups'])} cgroups"
            + (f"; could not remove {'; '.join(gone['errors'])}" if gone["errors"] else "")
        )
    return len(orphans)


def run_experiment(
    spec: Spec,
    out: Path,
    *,
    resume: bool = False,
    mode: str = "auto",
    run_name: str | None = None,
    progress: Progress | None = None,
    report: bool = True,
) -> RunResult:
    """Run every point of `spec` into `out/<run>/`; then analyse and write report.html."""
    progress = progress or Progress()
    points = expand(spec)
    remove_orphaned_labs(progress.say)
    run_dir = Path(out) / (run_name or spec.name)
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "run.json").write_text(json.dumps({"started_ns": time.time_ns(), "spec": spec.path}))
    (run_dir / "spec.json").write_text(json.dumps(spec.model_dump(mode="json"), indent=1, default=str))
    result = RunResult(run_dir, [], [], [])
    todo = []
    for p in points:
        if resume and point_status(run_dir / p.id) == DONE:
            result.skipped.append(p.id)
            progress.finished.append((p.id, "skipped", "finished in an earlier run"))
        else:
            todo.append(p)
    progress.points_total = len(points)
    vers = versions()
    try:
        data_dirs = prepare_data(todo, run_dir / ".work", progress.say) if todo else {}
        for p in todo:
            progress.point_index = points.index(p) + 1
            progress.point_id = p.id
            progress.point_started = time.monotonic()
            w = p.config.workload
            progress.point_seconds = w.ramp_up + w.run + w.ramp_down
            progress.errors = 0
            status, reason = run_point(p, spec, run_dir, data_dirs, mode, progress, vers)
            if status == DONE:
                result.done.append(p.id)
            else:
                result.failed.append((p.id, reason or "failed"))
            progress.finished.append((p.id, status, reason or ""))
    except KeyboardInterrupt:
        result.interrupted = True
        return result
    finally:
        shutil.rmtree(run_dir / ".work", ignore_errors=True)
    if report and (result.done or result.skipped):
        progress.phase = "analysing"
        result.report, result.summary, result.data = write_run_report(run_dir, spec)
    return result


def write_run_report(run_dir: Path, spec: Spec) -> tuple[Path, object, object]:
    """Analyse the run and write run_dir/report.html (with the finding of the shipped study its
    run.json names, `studies.finding_of_run`); returns its path, the summary and the data."""
    points = expand(spec)
    window_ns = int(round(points[0].config.monitor.window * 1e9)) if points else DEFAULT_WINDOW_NS
    data = analyze_run(run_dir, window_ns=window_ns)
    summary = build_summary(data)
    finding = finding_of_run(data, run_dir)
    return write_report(data, run_dir / "report.html", summary, finding=finding), summary, data
