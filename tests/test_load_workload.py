"""Workload files: clear errors for bad input, and the sampled page mix (`--dry-run`, no HTTP)
against the stationary mix computed here from the table with numpy."""

from __future__ import annotations

import json
import math
import subprocess
import tomllib
from pathlib import Path

import numpy as np
import pytest

from conftest import ROOT
from tierscope.engine import engine_path

EXAMPLE = ROOT / "examples" / "static-site.toml"

GOOD = """\
[workload]
start = "Home"

[think]
mean_s = 2.0

[[pages]]
name = "Home"
url = "/"

[[pages]]
name = "List"
url = "/list?page={p}"
[pages.params]
p = { uniform = [0, 3] }

[[pages]]
name = "Item"
url = "/item?id={id}"
[pages.params]
id = { uniform = [1, 100] }

[transitions]
Home = { List = 0.7, Item = 0.2, END = 0.1 }
List = { Item = 0.5, Home = 0.2, List = 0.2 }
Item = { Home = 0.6, List = 0.3, END = 0.05 }
"""


def engine(*args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run([str(engine_path()), "load", *args], capture_output=True, text=True, timeout=timeout)


def dry_run(path: Path, n: int, *extra: str) -> dict:
    out = engine(str(path), "--dry-run", str(n), *extra)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)["dry_run"]


def line_of(text: str, needle: str) -> int:
    """1-based line of the first line containing needle (ground truth for the error messages)."""
    for i, line in enumerate(text.splitlines(), 1):
        if needle in line:
            return i
    raise AssertionError(needle)


@pytest.mark.parametrize(
    "old, new, needle, expect",
    [
        ("List = 0.7", "Lits = 0.7", "Home = {", ["unknown state 'Lits'", "row 'Home'"]),
        ("Item = 0.5", "Item = -0.5", "List = {", ["negative probability", "row 'List'"]),
        ("Home = 0.6, List = 0.3", "Home = 0.6, List = 0.5", "Item = {", ["sum to 1.15", "row 'Item'"]),
        ('url = "/item?id={id}"\n', "", 'name = "Item"', ["page 'Item' has no url"]),
        ("Item = { Home", "Itme = { Home", "Itme = {", ["unknown state 'Itme'"]),
        ("mean_s = 2.0", "mean_s = -1", "mean_s", ["[think] mean_s", "expected a number >= 0"]),
        ("[workload]\n", "[workload]\nmax_transitons = 5\n", "max_transitons", ["unknown key 'max_transitons'"]),
        ("p = { uniform = [0, 3] }", "q = { uniform = [0, 3] }", 'name = "List"', ["placeholder {p}"]),
    ],
)
def test_bad_workload_names_file_line_and_state(tmp_path, old, new, needle, expect):
    text = GOOD.replace(old, new, 1)
    assert text != GOOD
    path = tmp_path / "bad.toml"
    path.write_text(text)
    out = engine(str(path), "--dry-run", "10")
    assert out.returncode == 2, out.stdout
    where = f"{path}:{line_of(text, needle)}:"
    assert where in out.stderr, out.stderr
    for e in expect:
        assert e in out.stderr, out.stderr


def test_toml_syntax_error_names_the_line(tmp_path):
    path = tmp_path / "broken.toml"
    path.write_text(GOOD.replace("[think]", "[think"))
    out = engine(str(path), "--dry-run", "10")
    assert out.returncode == 2
    assert str(path) in out.stderr and "line 4" in out.stderr, out.stderr


def stationary(doc: dict, start: str) -> tuple[list[str], np.ndarray]:
    """Page mix of the chain where END restarts at `start` and slack stays (no BACK in table)."""
    names = [p["name"] for p in doc["pages"]]
    idx = {n: i for i, n in enumerate(names)}
    n = len(names)
    P = np.zeros((n, n))
    for src, row in doc["transitions"].items():
        i = idx[src]
        for dst, p in row.items():
            assert dst != "BACK"
            P[i, idx[start] if dst == "END" else idx[dst]] += p
        P[i, i] += 1.0 - sum(row.values())
    # solve pi P = pi, sum pi = 1
    A = np.vstack([P.T - np.eye(n), np.ones(n)])
    b = np.zeros(n + 1)
    b[-1] = 1.0
    pi = np.linalg.lstsq(A, b, rcond=None)[0]
    return names, pi


def test_dry_run_page_mix_matches_the_table(tmp_path):
    path = tmp_path / "good.toml"
    path.write_text(GOOD)
    doc = tomllib.loads(GOOD)
    names, pi = stationary(doc, "Home")
    n = 400_000
    result = dry_run(path, n, "--seed", "3")
    assert result["requests"] == n
    counts = np.array([result["pages"][x] for x in names], dtype=float)
    observed = counts / n
    # consecutive pages are correlated, so no plain chi-square here (the Rust test thins the
    # walk for that); the total variation distance of 400k steps of this fast-mixing chain is
    # well under 0.01, while a wrong sampler (e.g. ignoring the self-loop slack) is > 0.03
    tv = 0.5 * np.abs(observed - pi).sum()
    assert tv < 0.01, (dict(zip(names, observed)), dict(zip(names, pi)))
    # the implicit self-loop matters: List keeps 0.1 slack + 0.2 explicit
    wrong = doc["transitions"]["List"].copy()
    assert math.isclose(sum(wrong.values()), 0.9)
    # sessions end only at END: expected session length = 1 / P(END per step)
    p_end = pi[names.index("Home")] * 0.1 + pi[names.index("Item")] * 0.05
    assert abs(result["mean_pages_per_session"] - 1 / p_end) / (1 / p_end) < 0.03
    assert result["back"] == 0


BACKTABLE = """\
[workload]
start = "A"
max_transitions = 1000
[[pages]]
name = "A"
url = "/a"
[[pages]]
name = "B"
url = "/b"
[[pages]]
name = "C"
url = "/c"
[transitions]
A = { B = 1.0 }
B = { C = 1.0 }
C = { BACK = 0.5, END = 0.5 }
"""


def test_back_and_end_on_a_hand_made_table(tmp_path):
    """A -> B -> C; at C: BACK or END (RUBBoS history rule).

    Entering B clears the stack (B's own BACK probability is 0); entering C pushes B. At C, BACK
    pops B, and B -> C pushes B again: every BACK returns to B, and a session is A B C (B C)^k
    with P(k) = 2^-(k+1).
    Expected pages per session: 3 + 2 E[k] = 5; share of A = 1/5, B = 2/5, C = 2/5.
    """
    path = tmp_path / "back.toml"
    path.write_text(BACKTABLE)
    n = 200_000
    r = dry_run(path, n, "--seed", "9")
    mix = {k: v / n for k, v in r["pages"].items()}
    assert abs(mix["A"] - 0.2) < 0.01 and abs(mix["B"] - 0.4) < 0.01 and abs(mix["C"] - 0.4) < 0.01, mix
    assert abs(r["mean_pages_per_session"] - 5.0) < 0.1
    # BACK from C never finds an empty stack here
    assert r["restart_on_empty_history"] == 0
    # every session ends at END: one END per session (except the last, cut by n)
    assert r["sessions"] - 1 <= r["end"] <= r["sessions"]
    # BACKs per session = E[k] = 1
    assert abs(r["back"] / r["sessions"] - 1.0) < 0.05


def test_back_with_empty_history_restarts(tmp_path):
    """Make A have BACK: A -> BACK with an empty stack restarts at A (counted)."""
    text = BACKTABLE.replace("A = { B = 1.0 }", "A = { B = 0.5, BACK = 0.5 }")
    path = tmp_path / "back2.toml"
    path.write_text(text)
    r = dry_run(path, 50_000, "--seed", "4")
    assert r["restart_on_empty_history"] > 0
    assert r["restart_on_empty_history"] <= r["back"]


def test_think_mean_of_the_truncated_exponential():
    """The example's pages think 1 s (About: 2 s); the sample mean over 400k draws vs the
    truncated-exponential mean computed from the page mix."""
    doc = tomllib.loads(EXAMPLE.read_text())
    r = dry_run(EXAMPLE, 400_000, "--seed", "5")
    n = r["requests"]
    z = doc["think"]["mean_s"]
    means = {p["name"]: p.get("think_mean_s", z) for p in doc["pages"]}
    expected = sum(r["pages"][k] * m for k, m in means.items()) / n * (1 - math.exp(-10))
    second = sum(r["pages"][k] * 2 * m * m for k, m in means.items()) / n
    se = math.sqrt(second - expected**2) / math.sqrt(n)
    assert abs(r["think_mean_s"] - expected) < 4 * se, (r["think_mean_s"], expected, se)


def test_example_workload_parses_and_walks_every_page():
    r = dry_run(EXAMPLE, 20_000)
    assert all(v > 0 for v in r["pages"].values()), r["pages"]


def test_cli_runs_against_a_closed_port_and_prints_the_summary(tmp_path):
    """`tierscope load` end to end without a server: every request is a counted connect error,
    the per-page table and the all-phases line are printed, the run ends on time."""
    import os
    import socket
    import sys
    import time

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    log = tmp_path / "closed.parquet"
    env = dict(os.environ, TIERSCOPE_ENGINE=str(engine_path()), COLUMNS="160")
    t0 = time.monotonic()
    out = subprocess.run(
        [
            str(Path(sys.executable).parent / "tierscope"),
            "load",
            str(EXAMPLE),
            "--target",
            f"http://127.0.0.1:{port}",
            "--log",
            str(log),
            "--users",
            "3",
            "--ramp-up",
            "0",
            "--duration",
            "1",
            "--ramp-down",
            "0",
            "--think",
            "0.1",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )
    assert time.monotonic() - t0 < 10
    assert out.returncode == 0, out.stderr
    assert "total" in out.stdout and "connect" in out.stdout
    from tierscope import tables

    rows = tables.read(log, "client_requests").to_pylist()
    assert rows and all(r["error"] == "connect" for r in rows)
    assert f"errors: connect {len(rows)}" in out.stdout.replace("\n", " ")


RUBBOS_BROWSE = ROOT / "python" / "tierscope" / "apps" / "rubbos" / "workloads" / "browse_only.toml"


@pytest.mark.skipif(not RUBBOS_BROWSE.exists(), reason="the RUBBoS workloads are not in this tree")
def test_rubbos_browse_only_mix_matches_the_original_algorithm():
    """The RUBBoS research digest (shared/research/rubbos.md §2.3, §2.5) simulated the original
    emulator's algorithm (BACK, history stack, END, implicit self-loops) on the browse-only
    table: 11.8 pages per session; ViewComment 28.0 %, ViewStory 26.7 %, StoriesOfTheDay
    22.1 %, SearchInStories 3.8 %, Search 3.7 %, Browse 3.7 %, BrowseStoriesInCategory 3.6 %,
    OlderStories 3.3 %, SearchInComments 2.8 %, BrowseCategories 1.7 %, SearchInUsers 0.7 %."""
    expected = {
        "ViewComment": 28.0,
        "ViewStory": 26.7,
        "StoriesOfTheDay": 22.1,
        "SearchInStories": 3.8,
        "Search": 3.7,
        "Browse": 3.7,
        "BrowseStoriesInCategory": 3.6,
        "OlderStories": 3.3,
        "SearchInComments": 2.8,
        "BrowseCategories": 1.7,
        "SearchInUsers": 0.7,
    }
    n = 400_000
    r = dry_run(RUBBOS_BROWSE, n, "--seed", "11")
    for page, pct in expected.items():
        # the digest rounds to 0.1 pp; sampling noise at 400k correlated steps is ~0.2 pp
        assert abs(100 * r["pages"][page] / n - pct) < 0.6, (page, 100 * r["pages"][page] / n, pct)
    assert abs(r["mean_pages_per_session"] - 11.8) < 0.25
    assert r["back"] > 0.1 * n  # BACK is exercised (about a fifth of moves)


def test_session_min_shortens_the_sessions_of_a_tpcw_mix():
    """`--session-min 20s`: a session lasts at least its drawn minimum (exponential, mean 20 s,
    cut at 80 s: 18.5 s on average) and ends at the next Home; the file's own 15 minutes
    (cut at 60) give sessions of about 14 minutes and more."""
    mix = Path(__file__).resolve().parent.parent / "python/tierscope/apps/bookstore/workloads/ordering.toml"
    as_file = dry_run(mix, 20_000, "--seed", "3")
    short = dry_run(mix, 20_000, "--seed", "3", "--session-min", "20s")
    assert as_file["mean_session_s"] >= 600
    assert 18.5 * 0.9 <= short["mean_session_s"] <= 200
    assert short["sessions"] >= 5 * as_file["sessions"]
    bad = engine(str(mix), "--dry-run", "10", "--session-min", "soon")
    assert bad.returncode != 0 and "--session-min" in bad.stderr
