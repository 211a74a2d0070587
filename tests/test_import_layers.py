"""scripts/sandboxlib imports one way (docs/design.md, "Imports one way"): no import cycle
among its modules, and no module imports one of a higher layer than its own.

The checker reads the package's source (ast, nothing imported): every ``import`` and
``from ... import``, at module level or inside a function (an import moved into a function
to dodge a cycle is still the cycle), relative or absolute (``sandboxlib.x``). The links to
plugins/plugin_utils (k0s_inputs.py, sandbox_*.py) are modules of the package like the
others. A subpackage (chaos/) is a unit of one layer; its modules' imports are checked for
cycles like the rest. The checker is tested on throw-away packages, with and without a
cycle, so that a test which cannot fail is not taken for a passing one."""

from __future__ import annotations

import ast
import re
import shutil
from pathlib import Path

import pytest
from conftest import REPO_ROOT

PACKAGE = REPO_ROOT / "scripts" / "sandboxlib"
DESIGN = REPO_ROOT / "docs" / "design.md"
ROOT = "__init__"   # the package's own __init__.py


def module_name(package_dir: Path, path: Path) -> str:
    """``chaos/api.py`` -> ``chaos.api``; ``chaos/__init__.py`` -> ``chaos``."""
    parts = list(path.relative_to(package_dir).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts) or ROOT


def _targets(node: ast.Import | ast.ImportFrom, here: list[str], package: str,
             modules: set[str]) -> set[str]:
    """The package's modules that ``node`` imports; ``here`` is the package the importing
    module is in (its dotted parts inside the package)."""
    def known(parts: list[str]) -> str | None:
        name = ".".join(parts) or ROOT
        return name if name in modules else None

    if isinstance(node, ast.Import):   # import pkg.a.b
        return {known(parts[1:]) or ROOT for parts in (a.name.split(".") for a in node.names)
                if parts[0] == package}
    if node.level:                     # from ..a import b
        if node.level - 1 > len(here):
            return set()
        base = here[:len(here) - (node.level - 1)] + (node.module or "").split(".")
    elif node.module and node.module.split(".")[0] == package:   # from pkg.a import b
        base = node.module.split(".")[1:]
    else:
        return set()
    base = [part for part in base if part]
    # each imported name that is a module of the package, else the module it comes from
    found = {known([*base, a.name]) or known(base) for a in node.names}
    return {name for name in found if name}


def import_graph(package_dir: Path) -> dict[str, set[str]]:
    """Each module of the package (dotted, inside the package) -> the package's modules it
    imports, wherever in the module the import is."""
    package = package_dir.name
    files = sorted(p for p in package_dir.rglob("*.py") if "__pycache__" not in p.parts)
    names = {module_name(package_dir, p): p for p in files}
    modules = set(names)
    graph: dict[str, set[str]] = {}
    for name, path in names.items():
        is_package = path.name == "__init__.py"
        parts = [] if name == ROOT else name.split(".")
        here = parts if is_package else parts[:-1]
        edges: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                edges |= _targets(node, here, package, modules)
        edges.discard(name)
        graph[name] = edges
    return graph


def import_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """One cycle per strongly connected group of modules, as a path that ends where it
    starts (``[a, b, c, a]``); [] when the imports go one way."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    groups: list[set[str]] = []

    def visit(v: str) -> None:   # Tarjan's algorithm
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group: set[str] = set()
            while True:
                w = stack.pop()
                on_stack.discard(w)
                group.add(w)
                if w == v:
                    break
            if len(group) > 1:
                groups.append(group)

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return [_cycle_in(group, graph) for group in sorted(groups, key=min)]


def _cycle_in(group: set[str], graph: dict[str, set[str]]) -> list[str]:
    """A shortest cycle through the group's first module, inside the group (breadth first)."""
    start = min(group)
    paths = [[start]]
    seen = {start}
    while paths:
        nxt = []
        for path in paths:
            for w in sorted(graph[path[-1]] & group):
                if w == start:
                    return [*path, start]
                if w not in seen:
                    seen.add(w)
                    nxt.append([*path, w])
        paths = nxt
    raise AssertionError(f"no cycle through {start} in {sorted(group)}")


def layer_breaks(graph: dict[str, set[str]], layers: list[list[str]]) -> list[str]:
    """Each import of a module of a higher layer (layers top first; a subpackage's modules
    are in its layer); modules of one layer may import each other (cycles aside)."""
    rank = {name: i for i, layer in enumerate(layers) for name in layer}

    def layer_of(module: str) -> int | None:
        return rank.get(module.split(".")[0])

    breaks = []
    for module, imported in sorted(graph.items()):
        for target in sorted(imported):
            mine, theirs = layer_of(module), layer_of(target)
            if mine is not None and theirs is not None and theirs < mine:
                breaks.append(f"{module} (layer {mine + 1}) imports {target} "
                              f"(layer {theirs + 1}, above it)")
    return breaks


def design_layers(text: str) -> list[list[str]]:
    """The numbered layers under docs/design.md's "Imports one way": the names in backticks
    before each item's first colon, top layer first."""
    start = text.index("**Imports one way.**")
    layers = []
    for line in text[start:].splitlines()[1:]:
        m = re.match(r"\s+\d+\.\s+(.*)", line)
        if m:
            layers.append(re.findall(r"`([\w.]+)`", m.group(1).split(": ", 1)[0]))
        elif layers and not line.startswith("     "):
            break
    return layers


def test_sandboxlib_has_no_import_cycle() -> None:
    graph = import_graph(PACKAGE)
    assert {"runner", "fingerprint", "report", "etcdhttp", "chaos", "chaos.api",
            "sandbox_tenants", "k0s_inputs"} <= set(graph), sorted(graph)
    assert import_cycles(graph) == []


def test_sandboxlib_keeps_the_written_layers() -> None:
    graph = import_graph(PACKAGE)
    layers = design_layers(DESIGN.read_text(encoding="utf-8"))
    listed = [name for layer in layers for name in layer]
    top_level = {m.split(".")[0] for m in graph} - {ROOT}
    # Every module in exactly one layer, and no layer naming a module that is not there: a
    # new module is placed when it is added.
    assert sorted(listed) == sorted(top_level), (
        f"docs/design.md's layers do not list each module of scripts/sandboxlib once: "
        f"missing {sorted(top_level - set(listed))}, unknown {sorted(set(listed) - top_level)}, "
        f"twice {sorted({n for n in listed if listed.count(n) > 1})}")
    assert layer_breaks(graph, layers) == []


def test_the_runner_and_the_fingerprint_are_apart() -> None:
    """Issue 37's cycle: the runner needed the fingerprint only to forget its record, the
    fingerprint needed report only for etcd's /health."""
    graph = import_graph(PACKAGE)
    assert "fingerprint" not in graph["runner"]
    assert "report" not in graph["fingerprint"]
    assert {"etcdhttp"} <= graph["fingerprint"] & graph["report"]


def write_package(root: Path, files: dict[str, str]) -> Path:
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root


ONE_WAY = {
    "__init__.py": "",
    "top.py": "from . import middle\nfrom .sub import leaf as sub_leaf\n",
    "middle.py": "import json\n\nfrom .base import VALUE\n",
    "base.py": "VALUE = 1\n",
    "sub/__init__.py": "from . import leaf\n",
    "sub/leaf.py": "from ..base import VALUE\n",
}


def test_the_checker_passes_a_package_that_imports_one_way(tmp_path: Path) -> None:
    pkg = write_package(tmp_path / "pkg", ONE_WAY)
    graph = import_graph(pkg)
    assert graph == {ROOT: set(), "top": {"middle", "sub.leaf"}, "middle": {"base"},
                     "base": set(), "sub": {"sub.leaf"}, "sub.leaf": {"base"}}
    assert import_cycles(graph) == []
    assert layer_breaks(graph, [["top"], ["middle", "sub"], ["base"]]) == []


@pytest.mark.parametrize(("where", "line", "cycle"), [
    ("base.py", "from .top import x\n", ["base", "top", "middle", "base"]),
    # inside a function, as one would hide it
    ("base.py", "def f():\n    from . import top\n", ["base", "top", "middle", "base"]),
    # from a subpackage, two levels up; and absolute
    ("base.py", "import pkg.sub.leaf\n", ["base", "sub.leaf", "base"]),
    ("sub/leaf.py", "from .. import top\n", ["sub.leaf", "top", "sub.leaf"]),
    ("middle.py", "from pkg import top\n", ["middle", "top", "middle"]),
], ids=["from-import", "in-a-function", "absolute-dotted", "parent-relative", "absolute-from"])
def test_the_checker_fails_when_a_cycle_is_added(tmp_path: Path, where: str, line: str,
                                                 cycle: list[str]) -> None:
    files = dict(ONE_WAY)
    files[where] += line
    graph = import_graph(write_package(tmp_path / "pkg", files))
    assert import_cycles(graph) == [cycle]


def test_the_checker_fails_on_an_import_from_a_higher_layer(tmp_path: Path) -> None:
    files = {**ONE_WAY, "extra.py": "NAME = 'x'\n"}
    files["sub/leaf.py"] += "def f():\n    from ...pkg import extra\n"   # beyond: not ours
    files["sub/leaf.py"] += "def g():\n    from ..extra import NAME\n"   # up a layer
    graph = import_graph(write_package(tmp_path / "pkg", files))
    assert import_cycles(graph) == []
    assert layer_breaks(graph, [["top", "extra"], ["middle", "sub"], ["base"]]) == [
        "sub.leaf (layer 2) imports extra (layer 1, above it)"]


def test_the_checker_finds_issue_37s_cycle_in_a_copy_of_sandboxlib(tmp_path: Path) -> None:
    """The real package, copied (its links to plugins/plugin_utils as files), with the
    runner importing the fingerprint again as it did: the cycle is found, named."""
    copy = tmp_path / "sandboxlib"
    shutil.copytree(PACKAGE, copy, ignore=shutil.ignore_patterns("__pycache__"))
    for module, imported in (("runner", "fingerprint"), ("fingerprint", "report")):
        path = copy / f"{module}.py"
        text = path.read_text()
        assert "\nfrom . import " in text, path
        path.write_text(text.replace("\nfrom . import ", f"\nfrom . import {imported}\n"
                                     "from . import ", 1))
    cycles = import_cycles(import_graph(copy))
    assert cycles == [["fingerprint", "report", "usage", "runner", "fingerprint"]], cycles
