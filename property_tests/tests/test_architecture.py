"""The code's shape, kept as habits: a one-way module graph, small functions and modules.

The graph counts every import, deferred ones inside functions included (a
deferred import that dodges a cycle is still a cycle). docs/architecture.md
draws the layers these tests hold the code to.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("gmm_ref", "gmm_kernels", "golden", "property_tests")
#: packages in dependency order: each may import only those before it
PACKAGE_ORDER = {name: i for i, name in enumerate(PACKAGES)}
#: layers inside gmm_ref, bottom first (docs/architecture.md)
GMM_REF_LAYERS = (
    ("gmm_ref.dtypes", "gmm_ref.checks", "gmm_ref.problem"),
    ("gmm_ref.layouts", "gmm_ref.numerics", "gmm_ref.exact", "gmm_ref.gradients", "gmm_ref.repro"),
    ("gmm_ref.conventions",),
    ("gmm_ref.compare",),
    ("gmm_ref",),
)
MAX_FUNCTION_LINES = 60
MAX_MODULE_LINES = 600


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _sources(include_tests: bool = False) -> dict[str, Path]:
    found = {}
    for pkg in PACKAGES:
        for path in (ROOT / pkg).rglob("*.py"):
            if not include_tests and "tests" in path.relative_to(ROOT).parts:
                continue
            found[_module_name(path)] = path
    return found


MODULES = _sources()


def _resolve(target: str) -> str | None:
    """The module of ours ``target`` (a dotted import) names, or None for third-party code."""
    while target and target not in MODULES:
        target = target.rpartition(".")[0]
    return target or None


def _imports(name: str, path: Path) -> set[str]:
    """Every module of ours that ``name`` imports, at any depth of its code."""
    tree = ast.parse(path.read_text(), str(path))
    out = set()
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*parent, base] if base else parent)
            targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in MODULES else base for a in node.names]
        else:
            continue
        out.update(m for m in map(_resolve, targets) if m and m != name)
    return out


GRAPH = {name: _imports(name, path) for name, path in MODULES.items()}


def _gmm_ref_layer(module: str) -> int | None:
    for i, layer in enumerate(GMM_REF_LAYERS):
        if any(module == p or (p != "gmm_ref" and module.startswith(p + ".")) for p in layer):
            return i
    return None


def test_every_module_is_seen():
    assert {"gmm_ref.problem", "gmm_ref.conventions.base", "gmm_kernels.base", "golden.cli",
            "property_tests.plugin"} <= set(MODULES)
    assert GRAPH["gmm_kernels.base"], "imports are parsed"


def test_packages_import_only_downwards():
    bad = [f"{a} -> {b}" for a, deps in GRAPH.items() for b in deps
           if PACKAGE_ORDER[b.split(".")[0]] > PACKAGE_ORDER[a.split(".")[0]]]
    assert not bad, "imports up the package order gmm_ref < gmm_kernels < golden < property_tests:\n" + "\n".join(bad)


def test_gmm_ref_layers_import_only_downwards():
    bad = []
    for a, deps in GRAPH.items():
        la = _gmm_ref_layer(a)
        bad += [f"{a} -> {b}" for b in deps if la is not None and (lb := _gmm_ref_layer(b)) is not None and lb > la]
    assert not bad, "gmm_ref imports up its layers:\n" + "\n".join(bad)


def test_the_module_graph_has_no_cycle():
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(m: str) -> list[str] | None:
        state[m] = 1
        stack.append(m)
        for d in sorted(GRAPH[m]):
            if state.get(d) == 1:
                return [*stack[stack.index(d):], d]
            if d not in state and (cycle := visit(d)):
                return cycle
        stack.pop()
        state[m] = 2
        return None

    for m in sorted(GRAPH):
        if m not in state and (cycle := visit(m)):
            pytest.fail("import cycle: " + " -> ".join(cycle))


def test_gmm_ref_needs_only_numpy_and_ml_dtypes():
    # threadpoolctl is optional; torch is imported only to read a tensor handed in
    allowed = {"gmm_ref", "numpy", "ml_dtypes", "threadpoolctl", "torch", *sys.stdlib_module_names}
    bad = []
    for name, path in MODULES.items():
        if not name.startswith("gmm_ref"):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                     else [node.module or ""] if isinstance(node, ast.ImportFrom) and not node.level else [])
            bad += [f"{name} imports {n}" for n in names if n.split(".")[0] not in allowed]
    assert not bad, bad


def test_no_module_imports_another_modules_private_names():
    bad = []
    for name, path in MODULES.items():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and _resolve(node.module):
                bad += [f"{name}: from {node.module} import {a.name}" for a in node.names
                        if a.name.startswith("_") and a.name != "__version__"]
    assert not bad, bad


def _long_functions(path: Path) -> list[str]:
    out = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(getattr(body[0], "value", None), ast.Constant):
                body = body[1:]  # the docstring does not count
            if body:
                lines = body[-1].end_lineno - body[0].lineno + 1
                if lines > MAX_FUNCTION_LINES:
                    out.append(f"{path.name}:{node.lineno} {node.name}: {lines} lines")
    return out


def test_functions_and_modules_stay_small():
    files = list(_sources(include_tests=True).values())
    long_functions = [f for path in files for f in _long_functions(path)]
    long_modules = [f"{p.relative_to(ROOT)}: {n} lines" for p in files
                    if (n := len(p.read_text().splitlines())) > MAX_MODULE_LINES]
    assert not long_functions, f"functions over {MAX_FUNCTION_LINES} lines:\n" + "\n".join(long_functions)
    assert not long_modules, f"modules over {MAX_MODULE_LINES} lines:\n" + "\n".join(long_modules)


def test_the_checks_catch_what_they_are_for(tmp_path, monkeypatch):
    """The graph and size checks fail on code that breaks them."""
    fake = {"gmm_ref.problem": tmp_path / "a.py", "gmm_ref.exact": tmp_path / "b.py"}
    (tmp_path / "a.py").write_text("def f():\n    from gmm_ref.exact import reference\n")
    (tmp_path / "b.py").write_text("from gmm_ref.problem import Problem\n")
    monkeypatch.setattr(sys.modules[__name__], "MODULES", fake)
    graph = {n: _imports(n, p) for n, p in fake.items()}
    assert graph == {"gmm_ref.problem": {"gmm_ref.exact"}, "gmm_ref.exact": {"gmm_ref.problem"}}
    assert _gmm_ref_layer("gmm_ref.exact") > _gmm_ref_layer("gmm_ref.problem")  # the deferred import runs up
    monkeypatch.setattr(sys.modules[__name__], "GRAPH", graph)
    cycle = r"import cycle: gmm_ref\.exact -> gmm_ref\.problem -> gmm_ref\.exact"
    with pytest.raises(pytest.fail.Exception, match=cycle):
        test_the_module_graph_has_no_cycle()
    (tmp_path / "long.py").write_text("def f():\n    \"\"\"doc\"\"\"\n" + "    x = 1\n" * (MAX_FUNCTION_LINES + 1))
    assert _long_functions(tmp_path / "long.py") == [f"long.py:1 f: {MAX_FUNCTION_LINES + 1} lines"]


BLOCKER = '''
import importlib.abc, sys

class Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("pytest", "_pytest", "jax", "jaxlib", "torch"):
            raise ImportError(f"{name} is blocked in this test")
        return None

sys.meta_path.insert(0, Block())
import gmm_ref, gmm_kernels, golden
from property_tests import strategies as gst
from property_tests.checking import check_kernel
from hypothesis import given, settings

@settings(max_examples=5, database=None)
@given(gst.problems(convention="megablox.gmm", tiling=(8, 8, 8)))
def draw(p):
    gmm_ref.reference(p)

draw()
print("ok")
'''


def test_strategies_and_check_kernel_import_without_pytest_or_jax():
    import subprocess

    done = subprocess.run([sys.executable, "-c", BLOCKER], cwd=ROOT, capture_output=True, text=True, timeout=120,
                          check=False)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr[-3000:]
