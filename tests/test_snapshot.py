"""A restored copy leaves no page cache behind (the database host's memory limit must see the
database's reads). Ground truth: util-linux `fincore`, the kernel's own count of cached pages."""

from __future__ import annotations

import os
import shutil
import subprocess

import pytest

from tierscope.apps.snapshot import copy_tree, evict

needs_fincore = pytest.mark.skipif(not shutil.which("fincore"), reason="util-linux fincore not installed")


def cached_pages(path) -> int:
    out = subprocess.run(
        ["fincore", "--bytes", "--noheadings", "--output", "PAGES", str(path)],
        capture_output=True,
        text=True,
        check=True,
    )
    return int(out.stdout.split()[0])


@needs_fincore
def test_a_copied_tree_is_on_disk_and_out_of_the_page_cache(tmp_path):
    src = tmp_path / "src"
    (src / "base").mkdir(parents=True)
    for i in range(3):
        (src / "base" / f"f{i}").write_bytes(os.urandom(1 << 20))
    dst = tmp_path / "dst"
    copy_tree(src, dst)
    for i in range(3):
        f = dst / "base" / f"f{i}"
        assert f.read_bytes() == (src / "base" / f"f{i}").read_bytes()
    # reading them cached them again; evict drops them
    assert sum(cached_pages(dst / "base" / f"f{i}") for i in range(3)) > 0
    assert evict(dst) == 3 << 20
    assert sum(cached_pages(dst / "base" / f"f{i}") for i in range(3)) == 0
