"""The package graph, read from the source files (``ast``: nothing is imported or executed).

The layers, top to bottom: ``entrypoints`` (the CLI, the HTTP API: the composition roots) -> ``workers`` (Celery)
-> ``services`` (the domain) -> ``encoders`` (the ML). A package may import only the packages below it;
``services`` never imports Celery or kombu, not even lazily; the module top level of ``services`` and
``entrypoints`` never imports the ML stack (torch, transformers, sentence-transformers): a lazy import inside a
function is fine, so the query path and the CLI start without torch. Inside ``services``, ``services.core`` is the
bottom folder, and the lab (``services.lab``: training, adaptation, mining, the reranker, evaluation) is loaded at
module level only by itself and by the entrypoints that run it, and never on the query path. ``dpr_client`` is a
leaf: it imports nothing of the project. No import cycle between two of the project's modules, nor between two of its
folders, lazy imports (inside a function) included, those under ``if TYPE_CHECKING:`` excluded: a cycle closed by a
lazy import still ties them together. Run with ``-s`` to print the graph.
"""

from __future__ import annotations

import ast
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

REPO = Path(__file__).resolve().parents[2]
LAYERS = ("entrypoints", "workers", "services", "encoders", "dpr_client")  # top to bottom: arrows point down only
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
    type_checking: bool = False  # under ``if TYPE_CHECKING:``: for the type checker only, never run

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


def _collect(nodes: list[ast.AST], module: str, top_level: bool, out: list[Import], typing_only: bool = False) -> None:
    for node in nodes:
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            out.extend(Import(module, t, node.lineno, top_level, typing_only)
                       for t in dict.fromkeys(_targets(node, module)))
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            _collect(list(ast.iter_child_nodes(node)), module, False, out, typing_only)
        elif isinstance(node, ast.If) and _is_type_checking(node.test):
            _collect(list(node.body), module, False, out, True)
            _collect(list(node.orelse), module, top_level, out, typing_only)
        else:
            _collect(list(ast.iter_child_nodes(node)), module, top_level, out, typing_only)


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


# Folders inside a layer: ``services.core`` is the bottom of ``services``; the lab (training, adaptation, mining, the
# reranker, evaluation, tuning: ``services.lab``) is loaded at module level only by itself and by the entrypoints that
# run it, so neither the query nor the ingest path carries it.
CORE = "services.core"
LEARN = ("services.lab",)


def _under(module: str, package: str) -> bool:
    return module == package or module.startswith(package + ".")


def test_services_core_imports_nothing_else_of_services() -> None:
    upward = [str(i) for i in IMPORTS if _under(i.module, CORE) and _root(i.target) == "services"
              and not _under(i.target, CORE)]
    assert upward == [], f"{CORE} is the bottom of services:\n" + "\n".join(upward)


def test_the_learning_code_is_loaded_at_module_level_only_where_it_runs() -> None:
    eager = [str(i) for i in IMPORTS if i.top_level and any(_under(i.target, p) for p in LEARN)
             and not any(_under(i.module, p) for p in LEARN) and _root(i.module) != "entrypoints"]
    assert eager == [], "import the learning code inside the function that trains or measures:\n" + "\n".join(eager)


def test_the_query_path_loads_no_ml_stack_and_no_lab() -> None:
    """Follow top-level imports through the project from the query path's modules (the API app's routes included):
    no torch and no module of the lab on the way."""
    seen: set[str] = set()
    todo = list(QUERY_PATH)
    eager: list[str] = []
    while todo:
        module = todo.pop()
        if module in seen:
            continue
        seen.add(module)
        for i in (i for i in IMPORTS if i.module == module and i.top_level):
            eager += [str(i)] if _root(i.target) in ML_STACK or any(_under(i.target, p) for p in LEARN) else []
            parents = [".".join(i.target.split(".")[:n]) for n in range(1, i.target.count(".") + 2)]
            todo += [m for m in parents if m in MODULES]  # importing a.b.c runs a, a.b and a.b.c
    assert eager == [], "the query path imports the ML stack or the lab at module level:\n" + "\n".join(eager)


def test_the_package_graph_is_acyclic_and_printed() -> None:
    """Printed per folder (``services.store -> services`` is the store reading ``services.core.errors`` and
    ``services.core.settings``, inside one layer); asserted acyclic per layer."""
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


def _module_cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan, iterative): each is one or more cycles."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for root in sorted(edges):
        if root in index:
            continue
        work = [(root, iter(sorted(edges.get(root, ()))))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(edges.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def test_no_import_cycle_between_modules() -> None:
    """Module level, not only between packages: ``a`` imports ``b`` and ``b`` imports ``a`` (directly or through
    others) is a cycle even when one side imports lazily inside a function; ``if TYPE_CHECKING:`` imports do not
    count. (``from pkg import name`` is an import of ``pkg.name`` when that is a module, else of ``pkg``.)
    Break one by moving what both need into a lower module, or by inverting the dependency."""
    edges: dict[str, set[str]] = {}
    for i in IMPORTS:
        if i.target in MODULES and i.target != i.module and not i.type_checking:
            edges.setdefault(i.module, set()).add(i.target)
    cycles = _module_cycles(edges)
    where = [
        ", ".join(cycle) + ":\n" + "\n".join(
            f"    {i}" for i in IMPORTS if i.module in cycle and i.target in cycle and not i.type_checking
            and i.target != i.module)
        for cycle in cycles
    ]
    assert cycles == [], "module import cycles:\n" + "\n".join(where)


# Folder cycles left standing, each a folder and the subfolder it composes: entrypoints.api's app mounts the routes,
# which read the app's state and auth; services.store's open_store picks an engine, which speaks the store's points
# and protocol (services/store is another piece of issue 57's work: its own helper's call).
KNOWN_FOLDER_CYCLES = (
    ["entrypoints.api", "entrypoints.api.routes"], ["services.store", "services.store.edge", "services.store.server"]
)


def _folder_cycles(imports: list[Import], folder: Callable[[str], str]) -> list[list[str]]:
    edges: dict[str, set[str]] = {}
    for i in imports:
        if not i.type_checking and folder(i.module) != folder(i.target):
            edges.setdefault(folder(i.module), set()).add(folder(i.target))
    return _module_cycles(edges)


def test_no_import_cycle_between_folders() -> None:
    """Folders too, not only modules: ``services/runtime.py`` lazily importing ``services/lifecycle/locks.py`` while
    ``lifecycle/inprocess.py`` imports ``services.runtime`` is no module cycle, yet it ties the two folders into one
    room. Break one by moving the shared piece into the lower folder, or by passing it in."""
    cycles = [c for c in _folder_cycles([i for i in IMPORTS if i.target in MODULES], _package)
              if c not in KNOWN_FOLDER_CYCLES]
    where: list[str] = []
    for cycle in cycles:  # each direction: its imports when few (the back edges), else their count
        arrows: dict[tuple[str, str], list[str]] = {}
        for i in IMPORTS:
            a, b = _package(i.module), (_package(i.target) if i.target in MODULES else "")
            if a != b and a in cycle and b in cycle and not i.type_checking:
                arrows.setdefault((a, b), []).append(str(i))
        where += [f"  {a} -> {b}: " + ("; ".join(lines) if len(lines) <= 3 else f"{len(lines)} imports")
                  for (a, b), lines in sorted(arrows.items())]
    assert cycles == [], "folder import cycles:\n" + "\n".join(where)


def test_the_cycle_check_sees_lazy_cycles_and_skips_type_checking() -> None:
    """The detector itself: a lazy back edge closes a cycle; a self-contained graph has none."""
    assert _module_cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert _module_cycles({"a": {"b"}, "b": {"c"}}) == []
    source = "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import x\ndef f():\n    import y\n"
    found: list[Import] = []
    _collect(list(ast.parse(source).body), "m", True, found)
    kinds = {i.target: (i.top_level, i.type_checking) for i in found}
    assert kinds["x"] == (False, True) and kinds["y"] == (False, False)
    # the two folder cycles issue 57 found, in miniature: no module cycle, a folder cycle through a lazy import
    lazy_back = [Import("s.runtime", "s.life.locks", 9, False), Import("s.life.inprocess", "s.runtime", 1, True)]
    assert _module_cycles({i.module: {i.target} for i in lazy_back}) == []
    assert _folder_cycles(lazy_back, lambda m: m.rpartition(".")[0]) == [["s", "s.life"]]
    hidden = [Import("s.runtime", "s.life.locks", 9, False, type_checking=True), lazy_back[1]]
    assert _folder_cycles(hidden, lambda m: m.rpartition(".")[0]) == []
