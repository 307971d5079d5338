"""The layers a newcomer can see: which package may import which, and no import circles.

``frontier`` (the calculus) imports neither ``solvers`` nor ``measure``; ``solvers`` (plans)
and ``measure`` (devices, protocols) import neither ``execution`` nor ``ecal``; ``execution``
(running plans) sits on both; ``ecal`` (the command line) on top. Every import that runs counts,
at module level or inside a function: a lazy import is a dependency all the same, so a circle
made of them is a circle. Imports under ``if TYPE_CHECKING:`` never run and name a type for the
type checker only (``solvers.index`` annotating the ``Problem`` that builds it); they do not count.
"""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("frontier", "solvers", "measure", "execution", "ecal")
#: package -> the packages it must never import
FORBIDDEN = {
    "frontier": ("solvers", "measure", "execution", "ecal"),
    "solvers": ("measure", "execution", "ecal"),
    "measure": ("solvers", "execution", "ecal"),
    "execution": ("ecal",),
}


def _modules() -> dict[str, Path]:
    out = {}
    for pkg in PACKAGES:
        for f in (ROOT / pkg).rglob("*.py"):
            parts = list(f.relative_to(ROOT).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            out[".".join(parts)] = f
    return out


def _targets(module: str, is_package: bool, node: ast.Import | ast.ImportFrom,
             known: dict[str, Path]) -> list[str]:
    """The modules an import statement loads: ``from . import x`` is module ``pkg.x`` when
    there is one, else the package itself."""
    if isinstance(node, ast.Import):
        return [a.name for a in node.names]
    if node.level:
        base = module.split(".")
        if not is_package:
            base = base[:-1]
        base = base[: len(base) - (node.level - 1)]
        head = ".".join(base + ([node.module] if node.module else []))
    else:
        head = node.module or ""
    return [f"{head}.{a.name}" if f"{head}.{a.name}" in known else head for a in node.names]


def _type_checking_only(tree: ast.Module) -> set[int]:
    """ids of the import nodes inside ``if TYPE_CHECKING:`` blocks (never run)."""
    out: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and ast.unparse(node.test) in ("TYPE_CHECKING",
                                                                    "typing.TYPE_CHECKING"):
            out |= {id(n) for b in node.body for n in ast.walk(b)}
    return out


def import_graph() -> dict[str, set[str]]:
    """Module → the project modules it imports anywhere in its body (type-only imports aside)."""
    known = _modules()
    graph: dict[str, set[str]] = defaultdict(set)
    for mod, path in known.items():
        tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
        skip = _type_checking_only(tree)
        for node in ast.walk(tree):
            if id(node) in skip:
                continue
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                for t in _targets(mod, path.name == "__init__.py", node, known):
                    # `import measure.sim` names measure.sim; an unknown dotted name counts
                    # as its nearest known parent
                    while t and t not in known:
                        t = t.rpartition(".")[0]
                    if t and t != mod:
                        graph[mod].add(t)
        graph.setdefault(mod, set())
    return graph


def strongly_connected(graph: dict[str, set[str]]) -> list[list[str]]:
    """Tarjan's strongly connected components (iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []
    counter = 0
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on.add(root)
        while work:
            v, it = work[-1]
            for w in it:
                if w not in index:
                    index[w] = low[w] = counter
                    counter += 1
                    stack.append(w)
                    on.add(w)
                    work.append((w, iter(sorted(graph.get(w, ())))))
                    break
                if w in on:
                    low[v] = min(low[v], index[w])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[v])
                if low[v] == index[v]:
                    comp = []
                    while True:
                        w = stack.pop()
                        on.discard(w)
                        comp.append(w)
                        if w == v:
                            break
                    out.append(sorted(comp))
    return out


@pytest.fixture(scope="module")
def graph() -> dict[str, set[str]]:
    return import_graph()


def test_the_scan_sees_lazy_imports():
    g = import_graph()
    # solvers.confidence imports solvers.solve inside a function: counted
    assert "solvers.solve" in g["solvers.confidence"]
    assert strongly_connected({"a": {"b"}, "b": {"a"}, "c": {"a"}}) == [["a", "b"], ["c"]]
    # ...and only type-checking imports are left out: solvers.index names Problem for types only
    assert "solvers.model" not in g["solvers.index"] and "solvers.index" in g["solvers.model"]


def test_no_import_circles(graph):
    circles = [c for c in strongly_connected(graph) if len(c) > 1]
    assert not circles, f"import circles (function-level imports count): {circles}"


@pytest.mark.parametrize("pkg", sorted(FORBIDDEN))
def test_lower_layers_do_not_import_upper_ones(graph, pkg):
    bad = sorted(f"{m} -> {t}" for m, ts in graph.items() if m.split(".")[0] == pkg
                 for t in ts if t.split(".")[0] in FORBIDDEN[pkg])
    assert not bad, f"{pkg} must not import {', '.join(FORBIDDEN[pkg])}: {bad}"


def test_execution_is_where_plans_meet_devices(graph):
    uses = {t.split(".")[0] for m, ts in graph.items() if m.startswith("execution") for t in ts}
    assert {"solvers", "measure"} <= uses


def test_building_the_cli_parser_loads_no_heavy_library():
    """``ecal --help`` builds every subcommand's parser: that must not import the solvers,
    scipy, the execution layer, pydantic or matplotlib (they load when a command runs)."""
    import subprocess
    import sys

    code = ("import sys; from ecal.cli import build_parser; build_parser(); "
            "print(','.join(m for m in ('solvers', 'scipy', 'execution', 'pydantic', "
            "'matplotlib', 'measure') if m in sys.modules))")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                       cwd=Path(__file__).resolve().parents[1])
    assert r.stdout.strip() == ""
