"""The runner knows no application: it asks the benchmark's provider (tierscope.apps)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from tierscope import apps
from tierscope.apps.rubbos.provider import RubbosProvider, scale_name

RUNNER = Path(apps.__file__).parent.parent / "runner"


@pytest.mark.parametrize("module", sorted(p.name for p in RUNNER.glob("*.py")))
def test_the_runner_imports_no_application_and_no_dbms(module):
    text = (RUNNER / module).read_text()
    tree = ast.parse(text)
    imported = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module}
    imported |= {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    assert not [
        m
        for m in imported
        if m.startswith("tierscope.apps.")
        or m in ("tierscope.services.postgres", "tierscope.services.mariadb", "tierscope.services.appserver")
    ]
    for name in ("rubbos", "tpcw", "bookstore", "postgres", "mariadb", "mysql"):
        assert name not in text.lower(), (module, name)


def test_the_runner_is_a_package_of_its_stages():
    assert {p.name for p in RUNNER.glob("*.py")} >= {"lifecycle.py", "drive.py", "collect.py", "record.py"}


def test_providers_by_benchmark():
    assert isinstance(apps.provider("rubbos"), RubbosProvider)
    with pytest.raises(ValueError, match="benchmark 'tpcc': expected one of rubbos, tpcw"):
        apps.provider("tpcc")
    with pytest.raises(FileNotFoundError, match="no workload file for mix 'shopping'"):
        apps.provider("rubbos").workload_file("shopping")
    assert apps.provider("rubbos").workload_file("browse_only").name == "browse_only.toml"


@pytest.mark.parametrize(
    "scale, name",
    [
        ("small", "small"),
        (0.002, "tiny"),
        (0.0199, "tiny"),
        (0.02, "small"),
        (0.449, "small"),
        (0.45, "paper"),
        (1, "paper"),
    ],
)
def test_a_fraction_of_the_paper_scale_rounds_to_the_nearest_preset(scale, name):
    assert scale_name(scale) == name


def test_bookstore_workloads_draw_from_the_data_set_of_the_point():
    from types import SimpleNamespace

    from tierscope.apps.bookstore.provider import TINY_DRAWS, scaled_workload

    tiny = apps.provider("tpcw").workload_file("browsing", SimpleNamespace(scale="tiny"))
    text = tiny.read_text()
    assert all(d in text for d in TINY_DRAWS.values())
    small = apps.provider("tpcw").workload_file("browsing", SimpleNamespace(scale="small"))
    scaled = small.read_text()
    # 10,000 items: A = 511 (TPC-W 2.10.5.1); 288,000 customers: A = 65535 (2.3.2)
    assert "[65535, 1, 288000]" in scaled and "[511, 0, 1000]" in scaled and "[511, 0, 2000]" in scaled
    assert not any(d in scaled for d in TINY_DRAWS.values())
    assert scaled.count("\n") == text.count("\n")
    with pytest.raises(ValueError, match="no customer draw"):
        scaled_workload("nothing here", 10_000, 288_000)


@pytest.mark.parametrize(
    "scale, name, items",
    [
        (0.01, "tiny", 1_000),
        (0.0315, "tiny", 1_000),
        (0.1, "small", 10_000),
        (1, "large", 100_000),
        (3.15, "large", 100_000),
        (10, "paper", 1_000_000),
        ("paper", "paper", 1_000_000),
    ],
)
def test_bookstore_scales_are_tpcw_item_counts(scale, name, items):
    """A fraction of the 100 k-item set rounds on a log scale; `paper` is TPC-W's 1 M items."""
    from tierscope.apps.bookstore import datagen
    from tierscope.apps.bookstore.provider import scale_name as bookstore_scale

    assert bookstore_scale(scale) == name
    got_items, ebs = datagen.scale_named(name)
    assert got_items == items
    datagen.check_scale(got_items, ebs)
    rows = datagen.population(got_items, ebs)
    assert rows["item"] == items and rows["author"] == items // 4 and rows["customer"] == 2880 * ebs


def test_the_paper_scale_draws_search_strings_from_a_million_items():
    from tierscope.apps.bookstore.datagen import scale_named
    from tierscope.apps.bookstore.provider import TINY_DRAWS, scaled_workload

    items, ebs = scale_named("paper")
    text = (Path(apps.__file__).parent / "bookstore" / "workloads" / "browsing.toml").read_text()
    scaled = scaled_workload(text, items, 2880 * ebs)
    # 1,000,000 items: A = 32767 (TPC-W 2.10.5.1); authors up to items/10, titles up to items/5
    assert "[32767, 0, 100000]" in scaled and "[32767, 0, 200000]" in scaled
    assert not any(d in scaled for d in TINY_DRAWS.values())
