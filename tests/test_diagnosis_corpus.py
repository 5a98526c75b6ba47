"""The diagnosis corpus' fast subset (bench/diagnosis --subset fast): real apps under the official
OpenTelemetry SDKs, nginx and a PostgreSQL of its own, built with a cold cache, each run's forms
given to `tierscope analyze`, and the scorecard held to a floor, so a change that breaks a verdict
fails here. Needs root, nginx, node, PostgreSQL 15 and the `diagnosis` extra, all of which
`make setup` installs: a missing one fails the test with the bench's message (no skip).
About 2.5-3.5 minutes on the shared machine (six cases of 15 s, their analyses alongside)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from conftest import ROOT

# Floors: what the analysis achieved on the fast subset when this was written, minus a margin for
# run-to-run noise (a verdict or two flips between runs on this shared 2-core machine).
# Measured 2026-11-27, cold cache, the analysis of the working tree at that time:
#   4 cases (the first version of the subset): accuracy 0.462, high_precision 0.500 (3 of 6 "high" right)
#   6 cases: accuracy 0.650, high_precision 0.667 (6 of 9), 202 s; the subset is now those 6 less
#   express-dbcpu-u20 (right at medium) to stay well inside 5 minutes; the 5 cases: accuracy 0.588,
#   high_precision 1.000 (6 of 6), high_share 0.417, 201 s (load average ~15). Stable so far: the light-load
#   case right in every form, the access log never above "low" for a tier; flask-alternating-u14 is
#   "single app" at medium in one run and high in the next (so high_precision moves by 0.1-0.2).
#   With the analysis of 21c4552 (the recorders' pauses, the caps of issue 26), from the cached
#   cases: accuracy 0.588 (10 of 17), high_precision 1.000 (6 of 6: flask-apppause-u15 in its three
#   span forms, express-none-u5 in all three); the full corpus: 28 of 28 "high" verdicts right.
#   With the analysis of e973c9a (a paused caller's stamped-only callee is blind, the spans+wire form,
#   the corpus' measured after-pause checks), fresh builds: accuracy 0.591 (13 of 22), high_precision
#   1.000 (5 of 5: express-none-u5 in its four forms, flask-apppause-u15 with the db on the wire); the
#   full corpus: 23 of 23 "high" verdicts right.
#   With the Flask shop keeping its connections (it reopened one per request before: an untraced
#   wait in the app and db CPU no span shows), fresh builds, the analysis of ff850d2: accuracy 0.909
#   (20 of 22; the two wrong: express-appcpu-u20 from its spans, "single db" low), high_precision
#   1.000 (8 of 8). An app pause seen only through the paused app's stamps flips between "single
#   app" and "alternating" (low) from build to build: three forms of one case, 0.68 if it does.
#   The disk-bound database joined the subset (flask-diskdb-u15-250iops): right, "high", in its
#   four span forms when it was added (bench/diagnosis --only diskdb, two builds).
#   With the busy-caller rule and statement labels (cd7348e), the full corpus' builds of these 6 cases:
#   32 of 32 right (express-appcpu-u20's spans now "single app"). An app pause seen only through the
#   paused app's stamps may still flip (4 span forms of flask-apppause-u15: 28 of 32, 0.875).
# Raise them as the analysis improves (docs/diagnosis.md has the full corpus' scorecard).
FLOOR = {
    "kept": 5,  # cases whose ground truth materialised, of 6
    "accuracy": 0.75,
    # share of "high" verdicts that name the truth (target: 0.97). Fresh builds of flask-alternating-u14
    # said "single app" high on d64db52 (6 of 9); since the blind cap they say it at most low. About 5
    # "high" verdicts: the floor lets one of them be wrong, not two.
    "high_precision": 0.80,
}


@pytest.mark.timeout(300)
def test_fast_subset_scorecard(tmp_path):
    out = tmp_path / "scorecard.json"
    p = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "diagnosis"), "--subset", "fast", "--cache", str(tmp_path / "cache"),
         "--json", str(out)],
        capture_output=True, text=True, timeout=290, stdin=subprocess.DEVNULL,
    )  # fmt: skip
    tail = "\n".join((p.stdout + p.stderr).splitlines()[-70:])
    assert p.returncode == 0, f"bench/diagnosis failed ({p.returncode}):\n{tail}"
    doc = json.loads(out.read_text())
    summary = doc["summary"]
    kept = [c for c in doc["cases"] if c["materialised"]]
    assert len(kept) >= FLOOR["kept"], f"only {len(kept)} cases materialised:\n{tail}"
    # the apps ran as the lab's unprivileged user, not as root (issue 21), read from /proc at start
    as_root = [
        (c["case"], c["measured"].get("app_user"))
        for c in doc["cases"]
        if c["system"] in ("flask", "express") and c["measured"].get("app_user") != "tierscope"
    ]
    assert not as_root, f"corpus apps not run as the lab's user: {as_root}"
    # every form the SDKs, the receiver and nginx write must import and analyse
    broken = [(c["case"], f, v["exit"], v["headline"]) for c in kept for f, v in c["forms"].items()
              if v["kind"] == "error"]  # fmt: skip
    assert not broken, f"analyze refused or crashed on: {broken}\n{tail}"
    # the access log alone cannot tell which tier: never above "low" naming a wrong tier
    log_wrong = [(c["case"], c["forms"]["access-log"]["headline"]) for c in kept
                 if "access-log" in c["forms"] and not c["forms"]["access-log"]["right"]]  # fmt: skip
    assert not log_wrong, f"access log alone judged too sure: {log_wrong}\n{tail}"
    # nothing saturated at light load: every form says so
    none_wrong = [(c["case"], f, v["headline"]) for c in kept if c["expected"]["kind"] == "none"
                  for f, v in c["forms"].items() if not v["right"]]  # fmt: skip
    assert not none_wrong, f"a light, unsaturated system judged saturated: {none_wrong}\n{tail}"
    assert summary["accuracy"] >= FLOOR["accuracy"], f"accuracy {summary['accuracy']} < {FLOOR['accuracy']}:\n{tail}"
    if summary["high_verdicts"]:
        assert summary["high_precision"] >= FLOOR["high_precision"], (
            f"high precision {summary['high_precision']} < {FLOOR['high_precision']}:\n{tail}"
        )
    last = p.stdout.strip().splitlines()[-1]
    assert last.startswith("cases=") and "high_precision=" in last, last
