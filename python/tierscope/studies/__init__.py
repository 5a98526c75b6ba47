"""The shipped studies (issue 22): the catalog python/tierscope/presets/studies.toml (each preset's
seed, finding, run time and the claim its results are checked against) and the finding of a run
of one of them (`tierscope.analysis.study`). `tierscope run` lists and runs them (cli/run.py); the
runner puts the finding in the run's report.html, `tierscope report RUN` in its own."""

from __future__ import annotations

import json
import tomllib
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import tierscope
from tierscope.analysis.study import Finding, check_claim, loss_finding, study_finding

#: how a study is run: the experiment runner, seed 003's log service, seed 002's scaling runner
KINDS = ("spec", "logservice", "oltp-scaling")


@dataclass(frozen=True)
class Study:
    """A shipped study: presets/NAME.toml and its table in presets/studies.toml."""

    name: str
    kind: str
    seed: str
    finding: str
    minutes: float
    path: Path
    #: what its results are checked against (tierscope.analysis.study; None: nothing is checked)
    claim: dict | None = None


def presets_dir() -> Path:
    return Path(tierscope.__file__).parent / "presets"


def studies() -> list[Study]:
    """Every shipped study, in the catalog's order (presets/studies.toml, the one place their seed,
    finding and run time are written); ValueError naming the table and key when it is wrong."""
    catalog = presets_dir() / "studies.toml"
    raw = tomllib.loads(catalog.read_text(encoding="utf-8"))
    out = []
    for name, table in raw.items():
        where = f"{catalog}: [{name}]"
        if not isinstance(table, dict):
            raise ValueError(f"{where}: expected a table")
        extra = set(table) - {"kind", "seed", "finding", "minutes", "claim"}
        if extra:
            raise ValueError(f"{where}: {sorted(extra)[0]}: unknown key (expected kind, seed, finding, minutes, claim)")
        claim = table.get("claim")
        if claim is not None:
            if not isinstance(claim, dict):
                raise ValueError(f"{where}: claim: expected a table")
            check_claim(claim, f"{catalog}: [{name}.claim]")
        kind, seed, finding, minutes = (table.get(k) for k in ("kind", "seed", "finding", "minutes"))
        if kind not in KINDS:
            raise ValueError(f"{where}: kind: expected one of {', '.join(KINDS)}, got {kind!r}")
        if not isinstance(seed, str) or not isinstance(finding, str) or not finding:
            raise ValueError(f"{where}: seed and finding: expected strings")
        if not isinstance(minutes, int | float) or isinstance(minutes, bool) or minutes <= 0:
            raise ValueError(f"{where}: minutes: expected a number > 0, got {minutes!r}")
        out.append(Study(name, kind, seed, finding, float(minutes), presets_dir() / f"{name}.toml", claim))
    return out


def study_of(path: Path) -> Study | None:
    """The shipped study whose preset is the file at `path`, if any."""
    try:
        return next((s for s in studies() if s.path.resolve() == path.resolve()), None)
    except (OSError, ValueError, tomllib.TOMLDecodeError):
        return None


def finding_of(data: Any, spec_path: Path) -> Finding:
    """The study's finding across its configurations (`analysis.study.study_finding`), checked
    against its claim when `spec_path` is a shipped study's preset."""
    study = study_of(spec_path)
    return study_finding(data, study.claim if study is not None else None)


def finding_of_run(data: Any, run_dir: Path) -> Finding | None:
    """The finding of an analysed run directory (`tierscope report RUN`): checked against the claim
    of the study whose preset its run.json names; None when it is not a run of the runner (no
    run.json in it nor above it) or has no load curve."""
    if not getattr(data, "blackbox", None):
        return None
    for d in (run_dir, run_dir.parent):
        try:
            spec = json.loads((d / "run.json").read_text()).get("spec")
        except (OSError, ValueError, AttributeError):
            continue
        return finding_of(data, Path(spec)) if isinstance(spec, str) else None
    return None


def loss_finding_of(text: str, results: list[Any], path: Path) -> Finding:
    """The log service's finding (`text`, across its modes' `results`: each with `mode`, `sent`,
    `lost`) checked against the shipped study's claim when `path` is its preset
    (`analysis.study.loss_finding`): what `tierscope run ingest` and `tierscope ingest` print."""
    study = study_of(path)
    claim = (study.claim if study is not None else None) or {}
    rows = [{"mode": r.mode, "sent": r.sent, "lost": r.lost} for r in results]
    found = loss_finding(text or "no mode finished", rows, claim.get("min_loss"), claim.get("max_loss"))
    if study is None and found.holds is None:
        return replace(found, why="no stated finding to check: not a shipped study")
    return found
