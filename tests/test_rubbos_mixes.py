"""The RUBBoS workload files: row-oriented tables that reproduce the digest's transition tables
and derived page mixes (§2.5, §2.9), and parse as the workload format."""

from __future__ import annotations

import math
import tomllib
from collections import Counter

import pytest

from tierscope.apps.rubbos import mixes

# The digest's derived stationary page mixes (percent), §2.5 and §2.9.
DIGEST_BROWSE_ONLY = {
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
DIGEST_READ_WRITE = {
    "StoriesOfTheDay": 17.1,
    "ViewStory": 17.4,
    "ViewComment": 12.9,
    "PostComment": 7.3,
    "StoreComment": 7.2,
    "Browse": 5.6,
    "BrowseStoriesInCategory": 4.2,
    "Search": 4.1,
    "OlderStories": 3.9,
    "SearchInStories": 3.3,
    "SubmitStory": 3.1,
    "StoreStory": 2.7,
    "BrowseCategories": 2.5,
    "SearchInComments": 2.1,
    "Register": 1.3,
    "RegisterUser": 1.3,
    "ReviewStories": 0.75,
    "SearchInUsers": 0.6,
    "AuthorLogin": 0.55,
    "AuthorTasks": 0.55,
    "ModerateComment": 0.55,
    "StoreModerateLog": 0.53,
    "AcceptStory": 0.37,
    "RejectStory": 0.22,
}


def batch_mix(path, requests: int, batches: int = 20, seed: int = 7) -> tuple[dict, dict]:
    """Page fractions of a workload file and their standard errors from independent batches."""
    fracs = []
    for b in range(batches):
        m = mixes.workload_mix(path, requests // batches, seed=seed + 1000 * b)
        fracs.append(m)
    pages = set().union(*fracs)
    mean = {p: sum(f.get(p, 0.0) for f in fracs) / batches for p in pages}
    se = {p: math.sqrt(sum((f.get(p, 0.0) - mean[p]) ** 2 for f in fracs) / (batches - 1) / batches) for p in pages}
    return mean, se


@pytest.mark.parametrize(
    "mix, digest, writes",
    [("browse_only", DIGEST_BROWSE_ONLY, 0.0), ("read_write", DIGEST_READ_WRITE, 12.3)],
)
def test_stationary_page_mix_matches_the_digest(mix, digest, writes):
    path = mixes.WORKLOAD_DIR / f"{mix}.toml"
    mean, se = batch_mix(path, 400_000)
    assert set(mean) == set(digest), f"pages visited differ: {set(mean) ^ set(digest)}"
    for page, pct in digest.items():
        # digest values are rounded (to 0.1 or 0.05 points) and were themselves simulated
        bound = 0.1 + 4 * 100 * se[page]
        assert abs(100 * mean[page] - pct) <= bound, (page, 100 * mean[page], pct, bound)
    got_writes = 100 * sum(v for p, v in mean.items() if p in mixes.WRITES)
    assert abs(got_writes - writes) <= 0.4, got_writes


def test_a_transposed_table_would_be_caught():
    """The check above has teeth: reading the browse-only table column-wise (the original file
    orientation) instead of row-wise gives a different mix."""
    rows = mixes.rows_by_page(mixes.browse_only())
    transposed: dict[str, dict[str, float]] = {}
    for src, row in rows.items():
        for dst, p in row.items():
            if dst in rows:
                transposed.setdefault(dst, {})[src] = p
    for src in rows:
        transposed.setdefault(src, {"END": 1.0})
        total = sum(transposed[src].values())
        if total > 1:
            transposed[src] = {k: v / total for k, v in transposed[src].items()}
    counts = mixes.simulate_mix(transposed, 100_000)
    n = sum(counts.values())
    assert abs(100 * counts["ViewComment"] / n - DIGEST_BROWSE_ONLY["ViewComment"]) > 3


def test_rows_summing_above_one_are_cut_in_the_original_order():
    user = mixes.rows_by_page(mixes.user_default())
    # SubmitStory: Σ 1.14 in the original; StoreStory keeps 1 - (.01 + .001 + .004 + .14)
    assert user["SubmitStory"]["StoreStory"] == pytest.approx(0.845)
    assert "Search" not in user["SubmitStory"]
    # browse-only ViewComment: Σ 1.01; END (last in order) keeps .09
    assert mixes.rows_by_page(mixes.browse_only())["ViewComment"]["END"] == pytest.approx(0.09)
    for table in (mixes.browse_only(), mixes.user_default(), mixes.author_default()):
        for row in mixes.rows_by_page(table).values():
            assert sum(row.values()) <= 1 + 1e-9
            assert all(p > 0 for p in row.values())


@pytest.mark.parametrize("mix", list(mixes.MIXES))
def test_workload_files_are_generated_and_well_formed(mix):
    path = mixes.WORKLOAD_DIR / f"{mix}.toml"
    text = path.read_text()
    assert text == mixes.workload_toml(mix), f"{path} is stale: run python -m tierscope.apps.rubbos.mixes"
    w = tomllib.loads(text)
    pages = {p["name"]: p for p in w["pages"]}
    assert w["workload"]["start"] == "StoriesOfTheDay"
    assert w["workload"]["back_on"] == ["Sorry"] and w["workload"]["error_markers"] == ["ERROR"]
    assert w["think"]["mean_s"] == 7.0
    assert [t["weight"] for t in w["session_types"]] == [0.9, 0.1]
    for name, table in w["transitions"].items():
        for src, row in table.items():
            assert src in pages, (name, src)
            assert sum(row.values()) <= 1 + 1e-6, (name, src)
            for dst in row:
                assert dst in pages or dst in ("BACK", "END"), (name, src, dst)
    for p in pages.values():
        assert p["url"].startswith("/rubbos/")
        assert p["method"] in ("GET", "POST")
    if "no_search" in mix:
        assert not (set(pages) & mixes.SEARCH_PAGES)
    if mix.startswith("browse_only"):
        assert not (set(pages) & mixes.WRITES)
    (mixes.WORKLOAD_DIR / "dictionary.txt").stat()


def test_no_search_mix_moves_the_search_share_elsewhere():
    path = mixes.WORKLOAD_DIR / "browse_only_no_search.toml"
    mix = mixes.workload_mix(path, 100_000)
    assert not any(p in mixes.SEARCH_PAGES for p in mix)
    full = mixes.workload_mix(mixes.WORKLOAD_DIR / "browse_only.toml", 100_000)
    # the home page's search share (.15) goes to Browse (.15 -> .30): browsing about doubles
    for page in ("Browse", "BrowseCategories", "BrowseStoriesInCategory", "OlderStories"):
        assert 1.6 < mix[page] / full[page] < 2.4, page


def test_simulated_back_returns_to_the_previous_page():
    rows = {"A": {"B": 1.0}, "B": {"BACK": 1.0}}
    counts = mixes.simulate_mix({**rows, "C": {}}, 1001, start="A")
    # A -> B -> back to A -> B ...: alternates exactly
    assert counts == Counter({"A": 501, "B": 500})


@pytest.mark.parametrize("mix, digest", [("browse_only", DIGEST_BROWSE_ONLY), ("read_write", DIGEST_READ_WRITE)])
def test_the_generators_own_walk_gives_the_digests_mix(mix, digest):
    """A peer's count: `tierscope-engine load --dry-run` walks the workload file without sending."""
    import json
    import subprocess

    from tierscope.engine import engine_path

    exe = str(engine_path())  # a missing engine binary fails (EngineNotFound), never skips
    help_text = subprocess.run([exe, "load", "--help"], capture_output=True, text=True).stdout
    assert "--dry-run" in help_text, "this tierscope-engine has no `load --dry-run` (rebuild with make setup)"
    path = mixes.WORKLOAD_DIR / f"{mix}.toml"
    out = subprocess.run(
        [exe, "load", str(path), "--dry-run", "300000", "--seed", "3"], capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout.strip().splitlines()[-1])["dry_run"]
    n = result["requests"]
    assert set(result["pages"]) == set(digest)
    for page, pct in digest.items():
        p = pct / 100
        bound = 0.1 + 4 * 100 * math.sqrt(p * (1 - p) / n * 15)  # sessions of ~15 correlated pages
        assert abs(100 * result["pages"][page] / n - pct) <= bound, (page, 100 * result["pages"][page] / n, pct)
    if mix == "browse_only":
        assert abs(result["mean_pages_per_session"] - 11.8) < 0.3  # digest §2.3
