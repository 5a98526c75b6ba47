"""What every verb shares about its outputs: checking a path can be written before the work
starts, the exit statuses, and the `--json` document.

Exit statuses (documented in `tierscope --help` and docs/spec.md):

| status | meaning |
|---|---|
| 0 | done; the verdict was reached with medium or high confidence |
| 1 | the work failed (a point failed, a tier died) |
| 2 | bad input: a file, an option or an output path that cannot be used |
| 3 | done, but the verdict is said with low confidence |
| 4 | done, but there was not enough data for a verdict (too short a trace, nothing imported) |
"""

from __future__ import annotations

import errno
import json
import math
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

OK, FAILED, BAD_INPUT, LOW_CONFIDENCE, NOT_ENOUGH_DATA = 0, 1, 2, 3, 4
#: free space an output directory needs before a verb starts
MIN_FREE_BYTES = 16 * 2**20


class OutputError(ValueError):
    """An output path that cannot be written, in one line."""


def _probe(directory: Path, what: str) -> None:
    try:
        fd, name = tempfile.mkstemp(prefix=".tierscope-probe-", dir=directory)
        os.close(fd)
        os.unlink(name)
    except OSError as e:
        raise OutputError(f"{what} {directory}: cannot write there ({e.strerror or e})") from None
    free = shutil.disk_usage(directory).free
    if free < MIN_FREE_BYTES:
        raise OutputError(
            f"{what} {directory}: only {free // 2**20} MiB free (need at least {MIN_FREE_BYTES // 2**20} MiB)"
        )


def check_output_dir(path: Path, what: str = "output directory") -> Path:
    """Create `path` as a directory if needed and check it can be written; OutputError otherwise."""
    path = Path(path)
    if path.exists() and not path.is_dir():
        raise OutputError(f"{what} {path}: exists and is not a directory")
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise OutputError(f"{what} {path}: cannot create it ({e.strerror or e})") from None
    _probe(path, what)
    return path


def check_output_file(path: Path, what: str = "output file") -> Path:
    """Check the file `path` can be written (its directory is created); OutputError otherwise."""
    path = Path(path)
    if path.is_dir():
        raise OutputError(f"{what} {path}: is a directory (give a file name)")
    check_output_dir(path.parent if str(path.parent) else Path("."), f"{what} {path}: directory")
    return path


def printable(message: str, limit: int = 300) -> str:
    """A message safe for a terminal: control and undecodable characters escaped, at most `limit`
    characters (an importer may quote the bytes of a binary file)."""
    out = "".join(c if c.isprintable() or c == " " else repr(c)[1:-1] for c in message)
    return out if len(out) <= limit else out[: limit - 1] + "…"


def no_space(e: OSError) -> bool:
    return e.errno in (errno.ENOSPC, errno.EDQUOT)


def band(confidence: float) -> str:
    return "high" if confidence >= 0.8 else "medium" if confidence >= 0.5 else "low"


def verdict_status(data: Any, summary: Any) -> int:
    """The exit status of a finished analysis: of the headline the user was given (the fine-grained
    verdict, or the white box's saturated resource when it decided): 0 when said with medium or
    high confidence, LOW_CONFIDENCE when low, NOT_ENOUGH_DATA when nothing was decided."""
    fine = getattr(data, "fine", None)
    undecided = fine is None or fine.verdict.kind == "insufficient"
    word = (summary.confidence or "unknown").split()[0]
    if word in ("high", "medium"):
        return OK
    if undecided:
        return NOT_ENOUGH_DATA
    return LOW_CONFIDENCE


def _num(x: Any) -> Any:
    if isinstance(x, float) and not math.isfinite(x):
        return None
    return x


def verdict_document(data: Any, summary: Any) -> dict:
    """The JSON document of `--json`: headline, verdict, shares, N*, levels, the bottleneck map's
    configurations (when there are several), heavy requests, notes."""
    doc: dict[str, Any] = {
        "headline": summary.headline,
        "confidence": summary.confidence,
        "status": verdict_status(data, summary),
        "point": getattr(data, "fine_point", None),
    }
    fine = getattr(data, "fine", None)
    if fine is not None:
        v = fine.verdict
        doc["verdict"] = {
            "kind": v.kind,
            "tiers": list(v.tiers),
            "text": v.text,
            "confidence": round(v.confidence, 3),
            "band": band(v.confidence),
            "evidence": v.evidence,
        }
        doc["saturated_share"] = {t: round(x, 4) for t, x in fine.saturated_share.items()}
        doc["n_star"] = {
            s: {"value": _num(ns.n_star), "basis": ns.basis, "confidence": ns.confidence, "method": ns.method}
            for s, ns in fine.n_star.items()
        }
        doc["window_ms"] = fine.window_ns / 1e6
        doc["switches_per_s"] = round(fine.switches_per_s, 3)
    else:
        doc["verdict"] = None
    doc["levels"] = {
        cfg: [
            {
                k: _num(r[k])
                for k in ("users", "throughput", "rt_p50", "rt_p90", "rt_p99", "errors", "requests")
                if k in r
            }
            for r in bb.curve.to_pylist()
        ]
        for cfg, bb in getattr(data, "blackbox", {}).items()
    }
    bmap = getattr(data, "bmap", None)
    if bmap is not None and bmap.num_rows:
        # the bottleneck map, as the report draws it: "db CPU quota", the metric apart ("db cpu_quota")
        labels = getattr(data, "labels", None) or {}
        doc["configurations"] = [
            {
                "config": r["config"],
                "label": labels.get(r["config"], r["config"]),
                "max_throughput": _num(r["max_throughput"]),
                "group": r["group"],
                "bottleneck": r["bottleneck"],
                "tier": r["tier"],
                "resource": r["resource"],
                "bottleneck_share": _num(r["bottleneck_share"]),
                "bottleneck_metric": r["bottleneck_metric"],
                "saturated": r["saturated"],
            }
            for r in bmap.to_pylist()
        ]
    heavy = getattr(data, "heavy_summary", None)
    doc["heavy"] = heavy.to_pylist() if heavy is not None else []
    stalls = getattr(data, "stalls", None)
    doc["stalls"] = stalls.num_rows if stalls is not None else 0
    doc["notes"] = list(getattr(data, "notes", []))
    return doc


def write_json(data: Any, summary: Any, target: str) -> str:
    """Write the `--json` document to `target` (a path, or "-" for stdout); returns where."""
    return write_document(verdict_document(data, summary), target)


def write_document(doc: dict, target: str) -> str:
    """Write a JSON document to `target` (a path, or "-" for stdout); returns where."""
    text = json.dumps(doc, indent=2, default=str)
    if target == "-":
        print(text)
        return "stdout"
    Path(target).write_text(text + "\n")
    return target
