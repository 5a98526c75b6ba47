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
    relative to engine/src, a nested bullet's may also be relative to the directories its parent
    bullets name (`middleware/` > `session/` > `client.rs` is middleware/session/client.rs)."""
    doc = (ROOT / "docs" / "architecture.md").read_text()
    section = doc.split("## The engine's modules", 1)[1].split("\n## ", 1)[0]
    named: set[str] = set()
    # (indent, the directories its names open for deeper bullets), innermost last
    stack: list[tuple[int, list[str]]] = []
    for line in section.splitlines():
        m = re.match(r"^(\s*)- (.*)$", line)
        if not m:
            continue
        indent = len(m.group(1))
        names = re.findall(r"`([^`]+)`", m.group(2).split(" — ", 1)[0])
        while stack and stack[-1][0] >= indent:
            stack.pop()
        parents = stack[-1][1] if stack else [""]
        paths = {posixpath.normpath(d + t) for d in parents for t in names} | set(names)
        named.update(paths)
        opened = []
        for t in paths:
            opened += [t] if t.endswith("/") else [posixpath.dirname(t) + "/", t.removesuffix(".rs") + "/"]
        stack.append((indent, [d.removeprefix("/") for d in opened]))
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
