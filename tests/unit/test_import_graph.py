"""The package's import graph, read with `ast`: no import circle but the named ones, and the engine imports no family.

Nodes are the modules of the package (hfl/, common/ as hfl.common, cloud_server/, edge_server/, device_client/,
proto/). An edge X -> Y is an import of Y written in X, relative or absolute, and also X -> each package above Y
(importing Y runs their __init__) unless that package contains X (it is already importing). Imports at module level
and imports inside functions are kept apart: the first graph is what importing a module runs, the union of both is
what a module may need at all. A circle is a strongly connected component of more than one module.
"""
from __future__ import annotations

import ast
import pathlib

ROOT = pathlib.Path(__file__).resolve().parents[2]
PACKAGES = {"hfl": "hfl", "common": "hfl.common", "cloud_server": "hfl.cloud_server", "edge_server": "hfl.edge_server",
            "device_client": "hfl.device_client", "proto": "hfl.proto"}

# Circles that are intended, each with its reason: (the modules, sorted) -> why.
ALLOWED = {
    ("hfl.claims", "hfl.sweep_spec"):
        "lazy, inside `claims.index`: `python -m hfl.claims index` (REPRODUCTIONS.md) reads every spec's claims through "
        "`sweep_spec.load_spec`, and a sweep spec's [[claim]] tables are parsed by `claims`; splitting the index out of "
        "hfl.claims would change that documented command",
}

ENGINE = ("hfl.common.config", "hfl.common.wire", "hfl.common.pipeline", "hfl.common.plans", "hfl.common.modes",
          "hfl.common.registry", "hfl.common.plugins", "hfl.common.config_error")
FAMILIES = ("hfl.common.privacy", "hfl.common.quantization", "hfl.common.channel", "hfl.common.control",
            "hfl.common.attacks", "hfl.common.observe")


def modules() -> dict[str, pathlib.Path]:
    found = {}
    for folder, package in PACKAGES.items():
        for path in (ROOT / folder).rglob("*.py"):
            parts = list(path.relative_to(ROOT / folder).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            found[".".join([package, *parts])] = path
    return found


def _canonical(name: str) -> str:
    head = name.split(".")[0]
    return PACKAGES[head] + name[len(head):] if head in PACKAGES and head != "hfl" else name


def _targets(node: ast.AST, module: str, is_package: bool, known: dict) -> list[str]:
    if isinstance(node, ast.Import):
        names = [_canonical(a.name) for a in node.names]
    else:
        if node.level:
            base = module.split(".")[:len(module.split(".")) + is_package - node.level]
            base = ".".join(base + ([node.module] if node.module else []))
        else:
            base = _canonical(node.module)
        names = [f"{base}.{a.name}" if f"{base}.{a.name}" in known else base for a in node.names]
    out = []
    for name in names:
        while name and name not in known:  # `import hfl.common.x.y` of an attribute, or of another package
            name = name.rpartition(".")[0]
        parts = name.split(".") if name else []
        out += [".".join(parts[:k]) for k in range(1, len(parts) + 1)
                if ".".join(parts[:k]) in known and not (module + ".").startswith(".".join(parts[:k]) + ".")]
    return [t for t in out if t != module]


def import_graphs() -> tuple[dict[str, set[str]], dict[str, set[str]]]:
    """(module-level imports, imports inside functions) of every module of the package."""
    known = modules()
    top: dict[str, set[str]] = {m: set() for m in known}
    inner: dict[str, set[str]] = {m: set() for m in known}

    def walk(node: ast.AST, module: str, is_package: bool, in_function: bool) -> None:
        for child in ast.iter_child_nodes(node):
            nested = in_function or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
            if isinstance(child, (ast.Import, ast.ImportFrom)):
                (inner if nested else top)[module].update(_targets(child, module, is_package, known))
            walk(child, module, is_package, nested)

    for module, path in known.items():
        walk(ast.parse(path.read_text(), str(path)), module, path.name == "__init__.py", False)
    return top, inner


def circles(graph: dict[str, set[str]]) -> list[tuple[str, ...]]:
    """Strongly connected components of more than one module (Tarjan, iterative), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
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
                    work.append((child, iter(sorted(graph.get(child, ())))))
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
                    found.append(tuple(sorted(component)))
    return sorted(found)


def _union(a: dict[str, set[str]], b: dict[str, set[str]]) -> dict[str, set[str]]:
    return {m: a.get(m, set()) | b.get(m, set()) for m in a.keys() | b.keys()}


def test_the_circle_finder_finds_a_circle_and_only_circles():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a", "d"}, "d": {"e"}, "e": set(), "f": {"f"}}
    assert circles(graph) == [("a", "b", "c")]
    assert circles({"x": {"y"}, "y": {"x"}, "z": {"x"}}) == [("x", "y")]


def test_the_graph_sees_relative_absolute_and_function_level_imports():
    top, inner = import_graphs()
    assert "hfl.common.registry" in top["hfl.common.config"]          # from .registry import Registry
    assert "hfl.common.config" in top["hfl.common.privacy.config"]     # from hfl.common.config import ...
    assert "hfl.common.privacy.trust" in top["hfl.common.privacy.config"]  # from .trust import ...
    assert "hfl.common.privacy" not in top["hfl.common.privacy.config"]  # its own package is already importing
    assert "hfl.common.privacy.stages" in top["hfl.common.privacy"]    # from . import stages
    assert "hfl.common.plugins" in inner["hfl.common.config"]          # inside from_dict
    assert "hfl.common.plugins" not in top["hfl.common.config"]
    assert "hfl.common.privacy" in top["hfl.families"]                 # the package above privacy.config runs too


def test_no_import_circle_at_module_level():
    top, _ = import_graphs()
    assert circles(top) == [], "an import circle at module level (see ALLOWED for the rule)"


def test_no_import_circle_but_the_named_ones():
    top, inner = import_graphs()
    unexpected = [c for c in circles(_union(top, inner)) if c not in ALLOWED]
    assert not unexpected, (f"import circles {unexpected}, counting imports inside functions: break them (a third "
                            "module for the shared piece, a registry the other side fills) or name one in ALLOWED "
                            "with its reason")


def test_every_allowed_circle_is_still_a_circle_and_says_why():
    top, inner = import_graphs()
    found = circles(_union(top, inner))
    for members, reason in ALLOWED.items():
        assert members in found, f"{members} is no circle any more: drop it from ALLOWED"
        assert len(reason) > 40


def test_the_engine_imports_no_family():
    """The engine defines the registries; the families (and plugins) fill them, and hfl.families imports the
    built-in ones for the entry points."""
    top, inner = import_graphs()
    for module in ENGINE:
        reached = {t for t in top[module] | inner[module] if t.startswith(FAMILIES)}
        assert not reached, f"{module} imports {sorted(reached)}: register from the family's package instead"


def test_the_families_module_imports_every_family():
    top, _ = import_graphs()
    for family in ("hfl.common.privacy", "hfl.common.quantization", "hfl.common.channel", "hfl.common.control"):
        assert any(t == family or t.startswith(family + ".") for t in top["hfl.families"]), family
