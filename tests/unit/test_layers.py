"""The package graph, read from the source files (``ast``: nothing is imported or executed).

The layers, top to bottom: ``entrypoints`` (the CLI, the HTTP API: the composition roots) -> ``workers`` (Celery)
-> ``services`` (the domain) -> ``encoders`` (the ML). A package may import only the packages below it;
``services`` never imports Celery or kombu, not even lazily; the module top level of ``services`` and
``entrypoints`` never imports the ML stack (torch, transformers, sentence-transformers): a lazy import inside a
function is fine, so the query path and the CLI start without torch. Run with ``-s`` to print the graph.
"""

from __future__ import annotations

import ast
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

REPO = Path(__file__).resolve().parents[2]
LAYERS = ("entrypoints", "workers", "services", "encoders")  # top to bottom: arrows point down only
NEVER: dict[str, tuple[str, ...]] = {"services": ("celery", "kombu")}  # not even inside a function
ML_STACK = ("torch", "transformers", "sentence_transformers")
NO_ML_AT_TOP_LEVEL = ("services", "entrypoints")
# The query path: modules `dpr query` and the API's search route load before the towers are needed.
QUERY_PATH = ("services.query", "entrypoints.cli.main", "entrypoints.api.app")


@dataclass(frozen=True)
class Import:
    module: str  # the importing module, e.g. services.query
    target: str  # the imported module, e.g. encoders.towers (a project module when the name resolves to one)
    line: int
    top_level: bool  # runs on import: outside any function and not under ``if TYPE_CHECKING:``

    def __str__(self) -> str:
        return f"{self.module}:{self.line} imports {self.target}{'' if self.top_level else ' (lazy)'}"


def _module_name(path: Path) -> str:
    parts = path.relative_to(REPO).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES: dict[str, Path] = {_module_name(p): p for layer in LAYERS for p in sorted((REPO / layer).rglob("*.py"))}


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _targets(node: ast.Import | ast.ImportFrom, module: str) -> list[str]:
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    base = node.module or ""
    if node.level:  # relative: resolve against the importing module's package
        package = module.split(".") if MODULES[module].name == "__init__.py" else module.split(".")[:-1]
        anchor = ".".join(package[: len(package) - node.level + 1])
        base = f"{anchor}.{base}" if base else anchor
    return [f"{base}.{a.name}" if f"{base}.{a.name}" in MODULES else base for a in node.names]


def _collect(nodes: list[ast.AST], module: str, top_level: bool, out: list[Import]) -> None:
    for node in nodes:
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            out.extend(Import(module, t, node.lineno, top_level) for t in dict.fromkeys(_targets(node, module)))
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            _collect(list(ast.iter_child_nodes(node)), module, False, out)
        elif isinstance(node, ast.If) and _is_type_checking(node.test):
            _collect(list(node.body), module, False, out)
            _collect(list(node.orelse), module, top_level, out)
        else:
            _collect(list(ast.iter_child_nodes(node)), module, top_level, out)


def _imports_of(module: str) -> list[Import]:
    out: list[Import] = []
    tree = ast.parse(MODULES[module].read_text(encoding="utf-8"), filename=str(MODULES[module]))
    _collect(list(tree.body), module, True, out)
    return out


IMPORTS: list[Import] = [imp for module in MODULES for imp in _imports_of(module)]


def _root(name: str) -> str:
    return name.split(".")[0]


def _package(module: str) -> str:
    """The folder a module lives in, as a dotted name (``services.store``, ``entrypoints.cli``)."""
    return module if MODULES[module].name == "__init__.py" else module.rpartition(".")[0]


def _imports_under(prefix: str, top_level_only: bool = False) -> list[Import]:
    return [i for i in IMPORTS if _root(i.module) == prefix and (i.top_level or not top_level_only)]


def test_the_rules_cover_every_package() -> None:
    on_disk = {p.name for p in REPO.iterdir() if (p / "__init__.py").is_file()}
    assert on_disk == set(LAYERS), f"a package outside the layer rules: {sorted(on_disk ^ set(LAYERS))}"
    assert set(NEVER) | set(NO_ML_AT_TOP_LEVEL) <= set(LAYERS)
    assert all(m in MODULES for m in QUERY_PATH), [m for m in QUERY_PATH if m not in MODULES]


@pytest.mark.parametrize("layer", LAYERS)
def test_a_package_imports_only_the_layers_below_it(layer: str) -> None:
    above = LAYERS[: LAYERS.index(layer)]
    upward = [str(i) for i in _imports_under(layer) if _root(i.target) in above]
    assert upward == [], f"{layer} may not import {', '.join(above)}:\n" + "\n".join(upward)


@pytest.mark.parametrize("layer", sorted(NEVER))
def test_banned_libraries_are_not_imported_even_lazily(layer: str) -> None:
    banned = [str(i) for i in _imports_under(layer) if _root(i.target) in NEVER[layer]]
    assert banned == [], f"{layer} never imports {', '.join(NEVER[layer])}:\n" + "\n".join(banned)


@pytest.mark.parametrize("layer", NO_ML_AT_TOP_LEVEL)
def test_the_ml_stack_is_imported_lazily(layer: str) -> None:
    eager = [str(i) for i in _imports_under(layer, top_level_only=True) if _root(i.target) in ML_STACK]
    assert eager == [], "import these inside the function that needs them:\n" + "\n".join(eager)


def test_the_query_path_loads_no_ml_stack() -> None:
    """Follow top-level imports through the project from the query path's modules: no torch on the way."""
    seen: set[str] = set()
    todo = list(QUERY_PATH)
    eager: list[str] = []
    while todo:
        module = todo.pop()
        if module in seen:
            continue
        seen.add(module)
        for i in (i for i in IMPORTS if i.module == module and i.top_level):
            eager += [str(i)] if _root(i.target) in ML_STACK else []
            parents = [".".join(i.target.split(".")[:n]) for n in range(1, i.target.count(".") + 2)]
            todo += [m for m in parents if m in MODULES]  # importing a.b.c runs a, a.b and a.b.c
    assert eager == [], "the query path imports the ML stack at module level:\n" + "\n".join(eager)


def test_the_package_graph_is_acyclic_and_printed() -> None:
    """Printed per folder (``services.store -> services`` is the store reading ``services.errors`` and
    ``services.settings``, inside one layer); asserted acyclic per layer."""
    edges = Counter((_package(i.module), _package(i.target)) for i in IMPORTS if i.target in MODULES)
    print("\npackage import graph (importer -> imported: imports, lazy ones included):")
    for (a, b), n in sorted((edge, n) for edge, n in edges.items() if edge[0] != edge[1]):
        print(f"  {a} -> {b}: {n}")
    graph: dict[str, set[str]] = {}
    for a, b in edges:
        if _root(a) != _root(b):
            graph.setdefault(_root(a), set()).add(_root(b))
    cycles = [f"{a} -> {b} -> ... -> {a}" for a in graph for b in graph[a] if _reaches(graph, b, a)]
    assert cycles == [], "package cycles:\n" + "\n".join(cycles)


def _reaches(graph: dict[str, set[str]], start: str, goal: str) -> bool:
    todo, seen = [start], set()
    while todo:
        node = todo.pop()
        if node == goal:
            return True
        if node not in seen:
            seen.add(node)
            todo += graph.get(node, ())
    return False
