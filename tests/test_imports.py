"""vitpe_core's modules import one another without a cycle, counting imports inside functions.

A deferred import hides a cycle from Python but not from the reader: the arrows should run one
way (importers -> foreign -> checkpoint -> model). The graph is read from the source (`ast`),
so nothing is imported here. `vitpe_core/__init__.py`'s lazy `importlib` names are not import
statements and are not counted.
"""
from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "vitpe_core"


def _modules() -> dict[str, Path]:
    """Dotted name -> file, for every module of the package (a package is its `__init__.py`)."""
    out = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return out


def _targets(node: ast.Import | ast.ImportFrom, name: str, is_package: bool, modules: dict[str, Path]) -> set[str]:
    """The package's modules that import statement `node` in module `name` executes by name."""
    if isinstance(node, ast.Import):
        return {a.name for a in node.names if a.name in modules}
    if node.level:
        base = name.split(".")[: len(name.split(".")) - node.level + (1 if is_package else 0)]
        source = ".".join(base + ([node.module] if node.module else []))
    else:
        source = node.module or ""
    if source not in modules:
        return set()
    subs = {f"{source}.{a.name}" for a in node.names if f"{source}.{a.name}" in modules}
    names_a_module_only = subs and len(subs) == len(node.names)
    return subs if names_a_module_only else subs | {source}


def import_graph() -> dict[str, set[str]]:
    """Module -> the package's modules it imports anywhere in its file (module level, functions,
    `TYPE_CHECKING` blocks)."""
    modules = _modules()
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        is_package = path.name == "__init__.py"
        edges: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                edges |= _targets(node, name, is_package, modules)
        graph[name] = edges - {name}
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle of `graph` as `[a, b, ..., a]`, or None."""
    state: dict[str, int] = {}   # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return path[path.index(nxt):] + [nxt]
            if nxt not in state and (cycle := visit(nxt)):
                return cycle
        path.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (cycle := visit(node)):
            return cycle
    return None


def test_the_graph_reader_sees_relative_absolute_and_deferred_imports():
    graph = import_graph()
    assert {"vitpe_core.checkpoint", "vitpe_core.foreign"} <= graph["vitpe_core.importers"]   # module level
    assert "vitpe_core.importers" in graph["vitpe_core.__main__"]                              # inside functions
    assert "vitpe_core.model" in graph["vitpe_core.checkpoint"]
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None


def test_vitpe_core_has_no_import_cycle():
    cycle = find_cycle(import_graph())
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


def test_checkpoint_io_knows_only_its_own_format():
    """Arrows run importers -> checkpoint -> model, never back."""
    graph = import_graph()
    assert not graph["vitpe_core.checkpoint"] & {"vitpe_core.importers", "vitpe_core.foreign", "vitpe_core.metrics"}


def test_the_model_packages_never_import_the_importers():
    """Importing is the importers' job for every family, Swin included (importers/swin.py,
    timm_swin.py): no arrow runs from a model or an encoding back up to them."""
    graph = import_graph()
    below = [m for m in graph if m.startswith(("vitpe_core.swin", "vitpe_core.encodings")) or m == "vitpe_core.model"]
    assert below and not [m for m in below if any(t.startswith("vitpe_core.importers") for t in graph[m])]


def test_every_family_is_one_converter_of_one_shape_in_one_table():
    import inspect

    from vitpe_core.importers.detect import FAMILIES
    from vitpe_core.importers.families import CONVERTERS
    assert {f for f in FAMILIES if f != "swin"} <= set(CONVERTERS)
    for family, convert in CONVERTERS.items():
        assert list(inspect.signature(convert).parameters) == ["sd", "ctx"], family
