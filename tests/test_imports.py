"""The import graph of fairseq_natbias/: no circle, and no floor imports one above it.

Every ``import`` and ``from ... import`` in every module of the package is
read with ``ast`` (those inside functions too: an import deferred to a call is
still a dependency), resolved to the package's own modules, and the graph is
searched for a cycle. The package's ``__init__`` imports the modules named in
its ``REGISTERED_MODULES`` with ``importlib`` at run time; those edges are
added too. A module's implicit import of its parent package (Python runs
``fairseq_natbias/__init__.py`` before any submodule) is not an edge: it would
make every registered module a circle by construction.

The floors, bottom up: the checkpoint reader (``checkpoint_loading``) and the
shared errors (``errors``); the models (``natural_bias``,
``checkpoint_settings``, ...); ``analysis/``; ``cli/``.
"""

import ast
from pathlib import Path

import pytest

PACKAGE = "fairseq_natbias"
ROOT = Path(__file__).resolve().parent.parent / PACKAGE


def module_name(path: Path, root: Path = ROOT, package: str = PACKAGE) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join([package, *parts])


def package_modules(root: Path = ROOT, package: str = PACKAGE) -> dict:
    """``{module name: path}`` of every .py file under ``root``."""
    return {module_name(path, root, package): path for path in sorted(root.rglob("*.py"))}


def _absolute(node: ast.ImportFrom, importer: str, is_package: bool) -> str:
    """The module a ``from X import ...`` names, relative imports resolved."""
    if not node.level:
        return node.module or ""
    base = importer.split(".")
    if not is_package:
        base = base[:-1]  # a module's relative imports start from its package
    base = base[:len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def imports_of(source: str, importer: str, known, is_package: bool = False) -> set:
    """The modules among ``known`` that ``source`` (the text of module
    ``importer``) imports, wherever the import statement is."""
    found = set()

    def nearest_known(name: str):
        while name and name not in known:
            name = name.rpartition(".")[0]
        return name or None

    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            targets = [nearest_known(alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = _absolute(node, importer, is_package)
            # "from P import name": the submodule P.name if there is one, else P.
            targets = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in known
                       else nearest_known(base) for alias in node.names]
        else:
            continue
        found.update(target for target in targets if target is not None)
    found.discard(importer)
    return found


def registered_modules(init_source: str, package: str = PACKAGE) -> set:
    """The modules the package's ``register()`` imports by name at run time
    (the tuple literal ``REGISTERED_MODULES`` in its ``__init__``)."""
    for node in ast.walk(ast.parse(init_source)):
        if (isinstance(node, ast.Assign)
                and any(getattr(t, "id", None) == "REGISTERED_MODULES" for t in node.targets)):
            return {f"{package}.{name}" for name in ast.literal_eval(node.value)}
    return set()


def import_graph(root: Path = ROOT, package: str = PACKAGE) -> dict:
    """``{module: set of package modules it imports}``."""
    modules = package_modules(root, package)
    graph = {name: imports_of(path.read_text(), name, modules, path.name == "__init__.py")
             for name, path in modules.items()}
    graph[package] |= registered_modules(modules[package].read_text(), package)
    return graph


def find_cycle(graph: dict):
    """One cycle of ``graph`` as a list of nodes (first == last), or None."""
    done, on_path, path = set(), set(), []

    def visit(node):
        on_path.add(node)
        path.append(node)
        for successor in sorted(graph.get(node, ())):
            if successor in on_path:
                return path[path.index(successor):] + [successor]
            if successor not in done:
                cycle = visit(successor)
                if cycle:
                    return cycle
        on_path.discard(node)
        path.pop()
        done.add(node)
        return None

    for start in sorted(graph):
        if start not in done:
            cycle = visit(start)
            if cycle:
                return cycle
    return None


def reachable(graph: dict, start: str) -> set:
    """Every module ``start`` imports, directly or not."""
    seen, todo = set(), [start]
    while todo:
        for successor in graph.get(todo.pop(), ()):
            if successor not in seen:
                seen.add(successor)
                todo.append(successor)
    return seen


# --- the finder itself can fail ----------------------------------------------------------


def test_the_cycle_finder_finds_cycles_and_only_cycles():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": set()}) is None
    assert find_cycle({"a": {"b", "c"}, "b": {"d"}, "c": {"d"}, "d": set()}) is None  # a diamond
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"x": {"y"}, "y": {"y"}}) == ["y", "y"]
    cycle = find_cycle({"a": {"b"}, "b": {"c"}, "c": {"d"}, "d": {"b"}})
    assert cycle == ["b", "c", "d", "b"]


def test_imports_inside_functions_and_relative_imports_are_edges(tmp_path):
    """A circle through an import deferred into a function (how the old
    checkpoint_loading -> natural_bias import hid) is found."""
    package = tmp_path / "pkg"
    (package / "sub").mkdir(parents=True)
    (package / "__init__.py").write_text("REGISTERED_MODULES = ('low',)\n")
    (package / "low.py").write_text("import os\n\ndef check():\n    from pkg.high import Model\n")
    (package / "high.py").write_text("from pkg import mid\nfrom pkg.sub import thing\n")
    (package / "mid.py").write_text("from . import low\n")
    (package / "sub" / "__init__.py").write_text("from .leaf import name\n")
    (package / "sub" / "leaf.py").write_text("from .. import plugin_dir\nimport pkg.sub\n")
    graph = import_graph(package, "pkg")
    assert graph == {
        "pkg": {"pkg.low"},
        "pkg.low": {"pkg.high"},
        "pkg.high": {"pkg.mid", "pkg.sub"},
        "pkg.mid": {"pkg.low"},
        "pkg.sub": {"pkg.sub.leaf"},
        "pkg.sub.leaf": {"pkg", "pkg.sub"},
    }
    assert find_cycle(graph) is not None


# --- the package ------------------------------------------------------------------------


@pytest.fixture(scope="module")
def graph():
    return import_graph()


def test_the_walk_sees_the_package(graph):
    """A sanity check that the walk reads real edges (a graph with no edges
    has no cycle either)."""
    assert len(graph) > 30
    assert f"{PACKAGE}.natural_bias" in graph[f"{PACKAGE}.transformer_natbias"]
    assert f"{PACKAGE}.checkpoint_loading" in graph[PACKAGE]


def test_the_package_has_no_import_cycle(graph):
    cycle = find_cycle(graph)
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


@pytest.mark.parametrize("ground", ["checkpoint_loading", "errors"])
def test_the_ground_floor_imports_nothing_above_it(graph, ground):
    """The checkpoint reader and the shared errors know nothing of the models,
    the analysis tools or the CLIs."""
    above = {name for name in reachable(graph, f"{PACKAGE}.{ground}")}
    assert above <= {f"{PACKAGE}.errors"}, sorted(above)


def test_the_models_import_no_analysis_and_no_cli(graph):
    for model in ("natural_bias", "checkpoint_settings", "transformer_natbias",
                  "transformer_lm_natbias"):
        upward = {name for name in reachable(graph, f"{PACKAGE}.{model}")
                  if name.startswith((f"{PACKAGE}.analysis", f"{PACKAGE}.cli"))}
        assert not upward, f"{model} imports {sorted(upward)}"
