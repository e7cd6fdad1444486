"""The layers inside ``property_tests``: the strategies below the check engine, the engine below its front-ends,
and no chain of module-level imports longer than eight modules (docs/architecture.md, "Packages and layers").

A long chain is what makes a package hard to read and slow to import: to know what ``cli.main`` loads, a reader
follows every link. Deferred imports inside functions are not links of a chain (they load on use), so only
module-level imports count here; test_architecture.py holds every import, deferred ones included, to the
package order and to no cycle.
"""

from __future__ import annotations

import ast
import functools
from collections.abc import Mapping
from pathlib import Path

from .test_architecture import GRAPH, MODULES

MAX_CHAIN = 8
#: property_tests' layers, bottom first: a module imports only from its own layer or those below it
LAYERS = (
    ("property_tests.strategies",),
    ("property_tests.checks",),
    ("property_tests.cli", "property_tests.plugin", "property_tests.kernel_checks"),
)


def _top_level(body: list[ast.stmt]) -> list[ast.Import | ast.ImportFrom]:
    """The import statements that run when the module is imported (``if TYPE_CHECKING:`` blocks aside)."""
    found: list[ast.Import | ast.ImportFrom] = []
    for node in body:
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            found.append(node)
        elif isinstance(node, ast.If) and "TYPE_CHECKING" not in ast.unparse(node.test):
            found += _top_level(node.body) + _top_level(node.orelse)
        elif isinstance(node, ast.Try):
            found += _top_level(node.body)
    return found


def module_level_imports(name: str, path: Path, modules: Mapping[str, Path]) -> set[str]:
    """The modules of ours that importing ``name`` imports by name at its top level."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out = set()
    for node in _top_level(ast.parse(path.read_text(), str(path)).body):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        else:
            base = node.module or ""
            if node.level:
                parent = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*parent, base] if base else parent)
            targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in node.names]
        out.update(t for t in targets if t in modules and t != name)
    return out


def longest_chain(graph: Mapping[str, set[str]]) -> list[str]:
    """The longest path of imports in ``graph`` (module -> the modules it imports), as the modules along it."""
    @functools.cache
    def from_(m: str) -> tuple[str, ...]:
        return (m, *max((from_(d) for d in graph.get(m, ())), key=len, default=()))

    return list(max((from_(m) for m in graph), key=len, default=()))


def _layer(module: str) -> int | None:
    for i, layer in enumerate(LAYERS):
        if any(module == p or module.startswith(p + ".") for p in layer):
            return i
    return None


def layer_violations(graph: Mapping[str, set[str]]) -> list[str]:
    return [f"{a} -> {b}" for a, deps in sorted(graph.items()) for b in sorted(deps)
            if (la := _layer(a)) is not None and (lb := _layer(b)) is not None and lb > la]


def test_no_chain_of_module_level_imports_in_property_tests_is_longer_than_eight():
    ours = {n: p for n, p in MODULES.items() if n.startswith("property_tests")}
    graph = {n: module_level_imports(n, p, ours) for n, p in ours.items()}
    chain = longest_chain(graph)
    assert 4 <= len(chain) <= MAX_CHAIN, f"{len(chain)} modules: " + " -> ".join(chain)


def test_property_tests_layers_import_only_downwards():
    bad = layer_violations(GRAPH)
    assert not bad, ("inside property_tests, strategies < checks < the front-ends (cli, plugin, kernel_checks); "
                     "imports up:\n" + "\n".join(bad))


def test_the_chain_and_layer_checks_catch_what_they_are_for(tmp_path):
    (tmp_path / "a.py").write_text("import typing\nfrom pkg import b\nif typing.TYPE_CHECKING:\n    import pkg.c\n"
                                   "def f():\n    import pkg.c\n")
    (tmp_path / "b.py").write_text("from pkg.c import x\n")
    (tmp_path / "c.py").write_text("")
    modules = {f"pkg.{m}": tmp_path / f"{m}.py" for m in "abc"}
    graph = {n: module_level_imports(n, p, modules) for n, p in modules.items()}
    assert graph == {"pkg.a": {"pkg.b"}, "pkg.b": {"pkg.c"}, "pkg.c": set()}
    assert longest_chain(graph) == ["pkg.a", "pkg.b", "pkg.c"]
    assert layer_violations({"property_tests.checks.modes": {"property_tests.cli.table"},
                             "property_tests.cli.main": {"property_tests.checks.modes"},
                             "property_tests.strategies.problems": {"property_tests.plugin"}}) == [
        "property_tests.checks.modes -> property_tests.cli.table",
        "property_tests.strategies.problems -> property_tests.plugin"]
