"""The engine's layout as docs/architecture.md and engine/Cargo.toml describe it: every Rust file
under engine/src is named in "The engine's modules", and every subsystem (a directory under
engine/src) is a cargo feature of the same name, built by default and gating its module in main.rs.
Ground truth: the file tree and the manifest, not the text that describes them."""

from __future__ import annotations

import posixpath
import re
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SRC = ROOT / "engine" / "src"


def named_modules() -> set[str]:
    """The paths (relative to engine/src) the module list names: a top-level bullet's names are
    relative to engine/src, a nested bullet's may also be relative to its parent's directory."""
    doc = (ROOT / "docs" / "architecture.md").read_text()
    section = doc.split("## The engine's modules", 1)[1].split("\n## ", 1)[0]
    named: set[str] = set()
    prefixes: list[str] = []
    for line in section.splitlines():
        m = re.match(r"^(\s*)- (.*)$", line)
        if not m:
            continue
        names = re.findall(r"`([^`]+)`", m.group(2).split(" — ", 1)[0])
        if not m.group(1):  # a top-level bullet
            prefixes = []
            for t in names:
                prefixes += [t] if t.endswith("/") else [posixpath.dirname(t) + "/", t.removesuffix(".rs") + "/"]
            named.update(names)
        else:
            for t in names:
                named.add(t)
                named.update(posixpath.normpath(p + t) for p in prefixes)
    return named


def test_every_engine_module_is_named_in_architecture_md():
    files = {p.relative_to(SRC).as_posix() for p in SRC.rglob("*.rs")}
    assert len(files) > 50, "the engine's sources were not found"
    missing = sorted(files - named_modules())
    assert not missing, f"docs/architecture.md (The engine's modules) does not name: {missing}"


def test_every_subsystem_is_a_default_cargo_feature_gating_its_module():
    features = tomllib.loads((ROOT / "engine" / "Cargo.toml").read_text())["features"]
    subsystems = sorted(p.name for p in SRC.iterdir() if p.is_dir())
    assert subsystems == ["load", "middleware", "oltp", "trace"]
    main = (SRC / "main.rs").read_text()
    for s in subsystems:
        assert s in features, f"no cargo feature {s!r}"
        assert s in features["default"], f"the default build leaves {s!r} out"
        assert f'#[cfg(feature = "{s}")]\nmod {s};' in main, f"main.rs does not gate `mod {s}` on its feature"
