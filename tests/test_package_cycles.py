"""No new package cycle (issue 23 item 1): the import graph between tierscope's subpackages and
top-level modules, read from every `import` in the sources, function bodies included (a late
import hides an edge from a reader, not from this test), must not gain a cycle.

Each strongly connected group of more than one node is a cycle. The groups that exist today are
listed in KNOWN with the edges that close them; a group must stay inside one of them. Breaking a
cycle needs no change here; shrink KNOWN when one is gone, so it cannot come back.
"""

from __future__ import annotations

import ast
from collections import defaultdict

from conftest import ROOT

PACKAGE = ROOT / "python" / "tierscope"

#: the cycles of today, each closed by the edges in its comment
KNOWN = [
    # (gone: analysis -> trace -> testbed -> spec -> analysis, since the spec takes the window's
    # default from tierscope.contracts)
    # (gone: assembly -> apps, since the assembly sees an app through
    # tierscope.contracts.apps.AppProvider; services.{appserver,postgres,mariadb,databases} ->
    # apps.dal, since DbConfig lives in tierscope.contracts.dbms)
    # (gone: services -> apps, since an AppServer runs the app its caller passes: a provider its
    # own WsgiApp, the tests and bench/rubbos apps.rubbos.provider.WSGI_APP; apps.default_wsgi_app
    # is gone with it)
    # (gone: services <-> middleware, with the Python middleware package itself: issue 25; POLICIES
    # and ScramVerifier are in tierscope.services)
]


def node(module: str) -> str:
    """tierscope.<node>...: a subpackage or a top-level module."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "tierscope"


def import_graph() -> dict[str, set[str]]:
    edges: dict[str, set[str]] = defaultdict(set)
    for path in PACKAGE.rglob("*.py"):
        rel = path.relative_to(PACKAGE.parent).with_suffix("")
        module = ".".join(rel.parts).removesuffix(".__init__")
        here = node(module)
        package = module if path.name == "__init__.py" else module.rsplit(".", 1)[0]
        for n in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(n, ast.Import):
                targets = [a.name for a in n.names]
            elif isinstance(n, ast.ImportFrom):
                base = package.split(".")[: len(package.split(".")) - (n.level - 1)] if n.level else []
                target = ".".join(base + [n.module]) if n.module else ".".join(base)
                # `from tierscope import spec` names a node by its alias
                targets = [target] + ([f"{target}.{a.name}" for a in n.names] if target == "tierscope" else [])
            else:
                continue
            for t in targets:
                if t.startswith("tierscope.") and node(t) != here:
                    edges[here].add(node(t))
    return edges


def cycles(edges: dict[str, set[str]]) -> list[set[str]]:
    """The strongly connected groups of more than one node (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[set[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in sorted(edges.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = set()
            while True:
                w = stack.pop()
                group.add(w)
                if w == v:
                    break
            if len(group) > 1:
                found.append(group)

    for v in sorted(set(edges) | {w for ws in edges.values() for w in ws}):
        if v not in index:
            visit(v)
    return found


def test_the_graph_is_read_from_every_import():
    edges = import_graph()
    # edges this project has for certain, one of them only inside a function body
    assert "analysis" in edges["cli"] and "tables" in edges["analysis"]
    assert "trace" in edges["analysis"]  # analysis.experiment imports trace.link inside a function
    # and the cycle finder finds a cycle of three, and none in a chain
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [{"a", "b", "c"}]
    assert cycles({"a": {"b"}, "b": {"c"}}) == []


def test_no_new_package_cycle():
    edges = import_graph()
    for group in cycles(edges):
        assert any(group <= known for known in KNOWN), (
            f"a new package cycle: {sorted(group)}; its edges: "
            + "; ".join(f"{a} -> {sorted(edges[a] & group)}" for a in sorted(group))
            + ". Move the shared part to a package both can import (issue 23: contracts on the ground floor)."
        )


def test_the_contracts_import_nothing_of_the_project():
    """The ground floor (tierscope.contracts) stands on nothing of the project."""
    assert not import_graph().get("contracts")


def test_the_analysis_loads_no_part_of_the_lab():
    """The analysis (and the report) read tables: importing every analysis module loads none of
    the lab's rooms (testbed, services, runner, assembly, apps, remote), `trace.link` included
    (issue 23 item 1: linking where the analysis can use it without importing the testbed)."""
    import subprocess
    import sys

    code = (
        "import importlib, pkgutil, sys\n"
        "import tierscope.analysis as a\n"
        "for m in pkgutil.iter_modules(a.__path__):\n"
        "    importlib.import_module('tierscope.analysis.' + m.name)\n"
        "import tierscope.report, tierscope.trace.link\n"
        "print(' '.join(sorted({'.'.join(m.split('.')[:2]) for m in sys.modules if m.startswith('tierscope.')})))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    loaded = set(out.stdout.split())
    assert "tierscope.analysis" in loaded and "tierscope.trace" in loaded, loaded
    lab = {f"tierscope.{room}" for room in ("testbed", "services", "runner", "assembly", "apps", "remote")}
    assert not loaded & lab, sorted(loaded & lab)
