"""Scoring `tierscope analyze` verdicts against the corpus' truth, and the scorecard.

A verdict is *right* when its kind is the truth's and the tiers it names map (by the case's role
map: OTel service names, db system names, host:port, the access log's `web`, the lab's tier names)
to exactly the roles at fault ("none" names no tier). An input that cannot tell which tier (an
access log alone: inclusive times of the front only) is also right when it says so: a verdict at
most "low", or not enough data; a medium/high verdict there must name the truth.

Calibration counts, per band, the verdicts that claim something (every kind but insufficient) and
how many of them name the truth (the strict match, whatever the form).
"""

from __future__ import annotations

import math
from collections import Counter, defaultdict

from cases import label

#: forms whose input cannot tell which tier is at fault
CANNOT_TELL = ("access-log",)
BANDS = ("high", "medium", "low")


def verdict_label(v: dict, role_map: dict) -> tuple[str, set[str]]:
    kind = v.get("kind") or "error"
    roles = {role_map.get(t, f"?{t}") for t in v.get("tiers") or []}
    return label(kind, roles), roles


def judge(truth_kind: str, truth_roles, form: str, v: dict, role_map: dict) -> dict:
    vl, roles = verdict_label(v, role_map)
    kind = v.get("kind")
    strict = kind == truth_kind and (kind == "none" or roles == set(truth_roles))
    right = strict
    if form in CANNOT_TELL and not strict:
        right = kind == "insufficient" or v.get("band") == "low"
    return {"verdict_label": vl, "strict": strict, "right": right}


def wilson(k: int, n: int, z: float = 1.96) -> tuple[float, float]:
    if n == 0:
        return (0.0, 1.0)
    p = k / n
    d = 1 + z * z / n
    c = (p + z * z / (2 * n)) / d
    h = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / d
    return (max(0.0, c - h), min(1.0, c + h))


def scorecard(rows: list[dict]) -> tuple[str, dict]:
    """rows: one per (case, form) with truth_label, form, verdict_label, band, right, strict.

    Returns the text and the summary figures.
    """
    lines: list[str] = []
    cases = sorted({r["case"] for r in rows})
    truths = sorted({r["truth_label"] for r in rows})
    verdicts = sorted({r["verdict_label"] for r in rows})
    # confusion matrix: expected (rows) x verdict (columns), over every form
    lines.append("Confusion matrix (rows: truth, columns: verdict; every form; tiers mapped to roles)")
    cm = Counter((r["truth_label"], r["verdict_label"]) for r in rows)
    w0 = max(len(t) for t in truths + ["truth"]) + 1
    widths = [max(5, len(v)) + 1 for v in verdicts]
    lines.append("truth".ljust(w0) + "".join(v.rjust(w) for v, w in zip(verdicts, widths)))
    for t in truths:
        lines.append(t.ljust(w0) + "".join(str(cm.get((t, v), "")).rjust(w) for v, w in zip(verdicts, widths)))
    lines.append("")
    lines.append("Accuracy per input form")
    by_form = defaultdict(list)
    for r in rows:
        by_form[r["form"]].append(r)
    for form in sorted(by_form):
        rs = by_form[form]
        k = sum(r["right"] for r in rs)
        bands = Counter(r["band"] or "-" for r in rs)
        lines.append(
            f"  {form:14s} {k:3d}/{len(rs):<3d} right = {k / len(rs):.2f}   bands: "
            + " ".join(f"{b}={bands[b]}" for b in (*BANDS, "-") if bands[b])
        )
    lines.append("")
    lines.append("Calibration (verdicts that claim something; right = names the truth)")
    claims = [r for r in rows if r["kind"] not in ("insufficient", "error", None)]
    for band in BANDS:
        rs = [r for r in claims if r["band"] == band]
        k = sum(r["strict"] for r in rs)
        lo, hi = wilson(k, len(rs))
        share = f"{k / len(rs):.2f}" if rs else "  - "
        lines.append(f"  {band:6s} n={len(rs):3d} right={k:3d} share={share} Wilson 95% [{lo:.2f}, {hi:.2f}]")
    wrong = [r for r in rows if not r["right"]]
    if wrong:
        lines.append("")
        lines.append(f"Wrong verdicts ({len(wrong)})")
        for r in sorted(wrong, key=lambda r: (r["case"], r["form"])):
            lines.append(
                f"  {r['case']:34s} {r['form']:13s} truth={r['truth_label']:20s} said={r['verdict_label']} "
                f"{r['band'] or '-'} {r['confidence'] if r['confidence'] is not None else '-'}"
            )
    n = len(rows)
    right = sum(r["right"] for r in rows)
    high = [r for r in claims if r["band"] == "high"]
    tell = [r for r in rows if r["form"] not in CANNOT_TELL]
    summary = {
        "cases": len(cases),
        "verdicts": n,
        "accuracy": round(right / n, 3) if n else 0.0,
        "high_precision": round(sum(r["strict"] for r in high) / len(high), 3) if high else 0.0,
        "high_share": round(sum(r["band"] == "high" for r in tell) / len(tell), 3) if tell else 0.0,
        "low_share": round(sum(r["band"] == "low" for r in tell) / len(tell), 3) if tell else 0.0,
        "accuracy_by_form": {f: round(sum(r["right"] for r in rs) / len(rs), 3) for f, rs in by_form.items()},
        "high_verdicts": len(high),
    }
    lines.append("")
    lines.append(
        f"cases={summary['cases']} accuracy={summary['accuracy']:.3f} high_precision={summary['high_precision']:.3f} "
        f"high_share={summary['high_share']:.3f} low_share={summary['low_share']:.3f}"
    )
    return "\n".join(lines), summary
