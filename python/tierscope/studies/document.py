"""One document for every study (issue 22): what `tierscope run NAME --json` prints and what every
run writes as OUT/<run>/study.json, whichever runner its kind names (an experiment spec, seed 003's
log service, seed 002's scaling runner). Pure: a dict from what a run produced; the verbs write it.

    {"schema": 1, "study": NAME, "kind": "spec" | "logservice" | "oltp-scaling",
     "seed": "000 §3" | null, "preset": PATH,
     "finding": {"text", "holds", "why", "claim", "figures"} | null,
     "run": {"dir", "report", "done": [POINT], "skipped": [POINT],
             "failed": [{"point", "reason"}]},
     ...what the kind adds}

A point is an experiment point (`<run>/<point>/`), a log-service mode (`<run>/<mode>/`) or a
scaling row ("galera-3-ycsb-a", whose tables are `<run>/results.parquet` and `nodes.parquet`).
What each kind adds: spec, the verdict document of `tierscope analyze --json` (headline,
confidence, status, verdict, levels, configurations ...); logservice, `results` (one object per
mode: its counts); oltp-scaling, `rows` (one object per target x nodes x workload)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from tierscope.analysis.study import Finding

#: the document's version: a key renamed or removed raises it
SCHEMA = 1

#: the name of the document in every run directory
FILE_NAME = "study.json"


def study_document(
    *,
    name: str,
    kind: str,
    preset: Path | str,
    seed: str | None,
    finding: Finding | None,
    run_dir: Path,
    done: Sequence[str],
    skipped: Sequence[str] = (),
    failed: Sequence[tuple[str, str]] = (),
    report: Path | None = None,
    body: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """The study document (module docstring); `body` is what the kind adds (its keys may not
    shadow the common ones)."""
    doc: dict[str, Any] = {
        "schema": SCHEMA,
        "study": name,
        "kind": kind,
        "seed": seed,
        "preset": str(preset),
        "finding": finding.as_dict() if finding is not None else None,
        "run": {
            "dir": str(run_dir),
            "report": str(report) if report is not None else None,
            "done": list(done),
            "skipped": list(skipped),
            "failed": [{"point": p, "reason": r} for p, r in failed],
        },
    }
    clash = sorted(set(body or {}) & set(doc))
    if clash:
        raise ValueError(f"study document: the {kind} body may not set {', '.join(clash)}")
    doc.update(body or {})
    return doc
