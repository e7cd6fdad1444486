"""The code's shape, kept as habits: a one-way module graph, small functions and modules.

The graph counts every import, deferred ones inside functions included (a
deferred import that dodges a cycle is still a cycle). docs/architecture.md
draws the layers these tests hold the code to; test_architecture_tree.py holds its module tables to the tree.
"""

from __future__ import annotations

import ast
import dataclasses
import inspect
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("gmm_ref", "gmm_kernels", "golden", "property_tests")
#: packages in dependency order: each may import only those before it
PACKAGE_ORDER = {name: i for i, name in enumerate(PACKAGES)}
#: layers inside gmm_ref, bottom first (docs/architecture.md)
GMM_REF_LAYERS = (
    ("gmm_ref.dtypes", "gmm_ref.checks", "gmm_ref.problem"),
    ("gmm_ref.layouts", "gmm_ref.numerics", "gmm_ref.exact", "gmm_ref.gradients", "gmm_ref.repro",
     "gmm_ref.routed.routing", "gmm_ref.routed.metadata"),
    ("gmm_ref.routed.gradients",),
    ("gmm_ref.conventions",),
    ("gmm_ref.compare",),
    ("gmm_ref.routed.compare",),
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
    for pkg in (*PACKAGES, "tests") if include_tests else PACKAGES:
        for path in (ROOT / pkg).rglob("*.py"):
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
from property_tests.checks.check import check_kernel
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


# ------------------------------------------------ family names: compared only inside their registry
def _name_comparisons(path: Path, names: frozenset[str], holders: frozenset[str] | None = None) -> list[str]:
    """Each comparison (``==``, ``!=``, ``in``, ...) in ``path`` with a literal of ``names`` among its operands (a
    string, or one inside a tuple, list or set literal); with ``holders``, only those comparing what holds such a
    name (an operand whose last name is one of them: ``mode.name``, ``column``)."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if not isinstance(node, ast.Compare):
            continue
        operands = (node.left, *node.comparators)
        if holders is not None and not any(_last_name(o) in holders for o in operands):
            continue
        for operand in operands:
            consts = operand.elts if isinstance(operand, (ast.Tuple, ast.List, ast.Set)) else [operand]
            hit = sorted({c.value for c in consts if isinstance(c, ast.Constant) and c.value in names})
            if hit:
                found.append(f"{path.relative_to(ROOT).as_posix()}:{node.lineno} compares {', '.join(hit)}")
                break
    return found


def _family_names() -> frozenset[str]:
    from gmm_ref import FAMILIES, families

    return frozenset(FAMILIES) | frozenset(families.routed_names())


def test_no_family_name_is_compared_outside_its_registry():
    """A family's facts live in its gmm_ref.families record; code reads them, it does not test the name."""
    names = _family_names()
    found = [hit for name, path in sorted(MODULES.items()) if name != "gmm_ref.families"
             for hit in _name_comparisons(path, names)]
    assert not found, ("family names compared outside gmm_ref/families.py (read the Family record's facts "
                       "instead):\n" + "\n".join(found))


def test_the_family_name_check_catches_what_it_is_for(tmp_path, monkeypatch):
    src = tmp_path / "m.py"
    src.write_text('a = fam == "ragged_m"\nb = fam in ("batch", "x")\nc = "ragged_k" not in fams\n'
                   'd = Problem("ragged_m", x)\ne = {"masked": 1}[fam]\nf = kind == "padded"\n')
    monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path)
    assert _name_comparisons(src, _family_names()) == [
        "m.py:1 compares ragged_m", "m.py:2 compares batch", "m.py:3 compares ragged_k"]


# ------------------------------------------- results as data: a cell's status is a field, never read from its text

#: how a cell's status reads in its text (``gmm_kernels.Status``'s values)
STATUS_TEXTS = ("pass", "FAIL", "n/a", "known bug")


def _status_read_from_text(path: Path) -> list[str]:
    """Where a module reads a status back from a text: ``.startswith("FAIL")`` (or a tuple of such), a literal
    list of status texts (prefixes tested in a loop), a call of a ``_status`` helper."""
    out = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, (ast.Tuple, ast.List)):
            texts = [e.value for e in node.elts if isinstance(e, ast.Constant) and e.value in STATUS_TEXTS]
            if len(texts) >= 2:
                out.append(f"{path.name}:{node.lineno} lists the status texts {texts}")
        if not isinstance(node, ast.Call):
            continue
        name = getattr(node.func, "attr", None) or getattr(node.func, "id", "")
        args = [e for a in node.args for e in (a.elts if isinstance(a, ast.Tuple) else [a])]
        if name == "startswith" and any(isinstance(a, ast.Constant) and isinstance(a.value, str)
                                        and a.value.startswith(STATUS_TEXTS) for a in args):
            out.append(f"{path.name}:{node.lineno} tests a text's prefix for a status")
        elif name == "_status":
            out.append(f"{path.name}:{node.lineno} calls _status")
    return out


def test_no_module_reads_a_cells_status_from_its_text():
    """The worker sends result records, and the table, the JSON output, the merge and the exit status read their
    fields; the text is rendered from them, never parsed back."""
    bad = [f for name, path in MODULES.items() if name.startswith("property_tests.")
           for f in _status_read_from_text(path)]
    assert not bad, "a cell's status read from its text:\n" + "\n".join(bad)


def test_the_worker_does_not_import_the_command_line():
    reached, todo = set(), ["property_tests.cli.worker"]
    while todo:
        for dep in GRAPH[todo.pop()] - reached:
            reached.add(dep)
            todo.append(dep)
    assert "property_tests.cli.main" not in reached, "property_tests.cli.worker imports property_tests.cli.main"


def test_the_status_text_scan_catches_what_it_is_for(tmp_path):
    src = tmp_path / "m.py"
    src.write_text('a = v.startswith("FAIL")\nb = v.startswith(("n/a", "x"))\nfor p in ("pass", "known bug"):\n'
                   '    pass\nc = _status(v)\nd = v.startswith("--")\n')
    assert _status_read_from_text(src) == ["m.py:1 tests a text's prefix for a status",
                                           "m.py:2 tests a text's prefix for a status",
                                           "m.py:3 lists the status texts ['pass', 'known bug']",
                                           "m.py:5 calls _status"]


# ------------------------------------------------ public Hypothesis and pytest only
#: modules of Hypothesis' and pytest's that are theirs, not an API: importing them breaks with any release
PRIVATE_MODULES = ("_pytest", "hypothesis.internal")
#: the one allowed use, where no public API exists: Hypothesis mixes the literals of loaded modules into its draws
#: and has no setting against it, so ``pinned_constants`` pins that pool around the harness's own properties
#: (docs/speed.md, "The same examples in every process"); a release that moves it gets a warning, not an error
ALLOWED_PRIVATE = {"property_tests/checks/profiles.py": ("imports hypothesis.internal.conjecture",)}
#: names of pytest's objects (config, items, ...) whose private attributes (``config._x``) are pytest's or ours to stash
PYTEST_OBJECTS = frozenset({"config", "session", "item", "node", "metafunc", "parser", "request", "pluginmanager"})
_ATTRIBUTE_CALLS = frozenset({"getattr", "setattr", "hasattr", "delattr"})


def _last_name(node: ast.AST) -> str | None:
    return node.id if isinstance(node, ast.Name) else node.attr if isinstance(node, ast.Attribute) else None


def _private_name_uses(path: Path) -> list[str]:
    """Each use in ``path`` of a private Hypothesis or pytest name: an import of their internal modules or of a
    ``_`` name of theirs, a ``_hypothesis...`` attribute, a private attribute of a pytest object (``config._x``)."""
    where = path.relative_to(ROOT).as_posix()
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        what = None
        if isinstance(node, (ast.Import, ast.ImportFrom)) and not getattr(node, "level", 0):
            mods = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or ""]
            names = [a.name for a in node.names] if isinstance(node, ast.ImportFrom) else []
            bad = [m for m in mods if any(m == p or m.startswith(p + ".") for p in PRIVATE_MODULES)]
            if mods[0].split(".")[0] in ("hypothesis", "pytest"):
                bad += [f"{mods[0]}.{n}" for n in names if n.startswith("_")]
            what = f"imports {', '.join(bad)}" if bad else None
        elif isinstance(node, ast.Attribute):
            owner = _last_name(node.value)
            if node.attr.startswith("_hypothesis") or (owner in PYTEST_OBJECTS and node.attr.startswith("_")
                                                       and not node.attr.startswith("__")):
                what = f"uses the attribute {owner}.{node.attr}"
        elif (isinstance(node, ast.Call) and _last_name(node.func) in _ATTRIBUTE_CALLS and len(node.args) >= 2
              and isinstance(node.args[1], ast.Constant) and isinstance(node.args[1].value, str)):
            owner, attr = _last_name(node.args[0]), node.args[1].value
            if attr.startswith("_hypothesis") or (owner in PYTEST_OBJECTS and attr.startswith("_")):
                what = f"uses the attribute {owner}.{attr} through {_last_name(node.func)}"
        if what:
            found.append(f"{where}:{node.lineno} {what}")
    return found


def test_no_private_hypothesis_or_pytest_name_is_used():
    """One Hypothesis or pytest release must not break the harness: their public APIs only (an ExampleDatabase
    wrapper for per-cell keys, notes the harness composes, config.stash for plugin state)."""
    mine = Path(__file__).resolve()
    found = [hit for path in sorted(_sources(include_tests=True).values()) if path.resolve() != mine
             for hit in _private_name_uses(path)]
    allowed = [h for h in found if h.split(" ", 1)[1] in ALLOWED_PRIVATE.get(h.split(":")[0], ())]
    assert not set(found) - set(allowed), "private Hypothesis/pytest names used:\n" + "\n".join(
        h for h in found if h not in allowed)
    # an allowance nothing uses any more goes
    assert {(h.split(":")[0], h.split(" ", 1)[1]) for h in allowed} == {
        (f, what) for f, uses in ALLOWED_PRIVATE.items() for what in uses}, allowed


def test_the_private_name_check_catches_what_it_is_for(tmp_path, monkeypatch):
    src = tmp_path / "m.py"
    src.write_text("from hypothesis.internal.reflection import function_digest\nimport _pytest.config\n"
                   "from hypothesis.core import _x\nf._hypothesis_internal_add_digest = b''\n"
                   "config._gmm_kernels = 1\nn = getattr(config, '_gmm_left_out', 0)\n"
                   "node.config._gmm_counts = 2\nsetattr(p, '_hypothesis_internal_database_key', None)\n"
                   "config.stash[KEY] = 1\nself._state = 1\nfrom hypothesis.database import ExampleDatabase\n")
    monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path)
    assert _private_name_uses(src) == [
        "m.py:1 imports hypothesis.internal.reflection", "m.py:2 imports _pytest.config",
        "m.py:3 imports hypothesis.core._x", "m.py:4 uses the attribute f._hypothesis_internal_add_digest",
        "m.py:5 uses the attribute config._gmm_kernels",
        "m.py:6 uses the attribute config._gmm_left_out through getattr",
        "m.py:7 uses the attribute config._gmm_counts",
        "m.py:8 uses the attribute p._hypothesis_internal_database_key through setattr"]


# ------------------------------------------------ mode names: compared only inside their registry
#: what holds a mode's name: ``mode.name``, ``result.check``, a variable ``mode``/``column``/``check``
MODE_HOLDERS = frozenset({"name", "mode", "mode_name", "column", "check"})


def _mode_names() -> frozenset[str]:
    from property_tests.checks.modes import ALL_MODES

    return frozenset(ALL_MODES)


def _mode_name_comparisons(path: Path, names: frozenset[str]) -> list[str]:
    """Each comparison in ``path`` of what holds a mode's name (:data:`MODE_HOLDERS`) with a mode name literal."""
    return _name_comparisons(path, names, MODE_HOLDERS)


def test_no_mode_name_is_compared_outside_its_registry():
    """A mode carries its own options, checks and applicability (property_tests.checks.modes.Mode): code reads them."""
    names = _mode_names()
    found = [hit for name, path in sorted(MODULES.items()) if name != "property_tests.checks.modes"
             for hit in _mode_name_comparisons(path, names)]
    assert not found, ("mode names compared outside property_tests/checks/modes.py (give the Mode a field instead):\n"
                       + "\n".join(found))


def test_the_mode_name_check_catches_what_it_is_for(tmp_path, monkeypatch):
    src = tmp_path / "m.py"
    src.write_text('a = mode.name == "grad"\nb = mode.name != "grad"\nc = column in ("large", "x")\n'
                   'd = kind == "exact"\ne = result.check == "exact"\nf = dict(values="exact")\n'
                   'g = mode == "poisoned"\n')
    monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path)
    assert _mode_name_comparisons(src, _mode_names()) == [
        "m.py:1 compares grad", "m.py:2 compares grad", "m.py:3 compares large", "m.py:5 compares exact",
        "m.py:7 compares poisoned"]


# ------------------------------------------------ strategy keywords: known only above gmm_kernels
def _strategy_only_keywords() -> frozenset[str]:
    """The keywords of ``property_tests.strategies.problems`` that name no fact of the problem model (a field of
    ``gmm_ref.Problem`` or ``Convention``, or a feature a kernel may refuse): the strategies' own words."""
    from gmm_kernels.scope import FEATURES
    from gmm_ref import Problem
    from gmm_ref.conventions import Convention
    from property_tests.strategies import problems

    facts = {f.name for cls in (Problem, Convention) for f in dataclasses.fields(cls)} | set(FEATURES)
    return frozenset(inspect.signature(problems).parameters) - facts


def _strategy_knowledge(path: Path, strategy_only: frozenset[str]) -> list[str]:
    """Where ``path`` speaks the strategies' language: a function named for strategy options, or a mapping keyed
    by ``problems()`` keywords (a dict literal or ``dict(...)`` whose keys all are, one of them strategy-only, or
    a strategy-only key stored into one)."""
    from property_tests.strategies import problems

    keywords = frozenset(inspect.signature(problems).parameters)
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        keys: list[str] = []
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and "strategy" in node.name:
            found.append(f"{path.name}:{node.lineno} defines {node.name}")
            continue
        if isinstance(node, ast.Dict) and all(isinstance(k, ast.Constant) for k in node.keys):
            keys = [k.value for k in node.keys]
        elif isinstance(node, ast.Call) and _last_name(node.func) == "dict" and not node.args:
            keys = [k.arg for k in node.keywords]
        elif (isinstance(node, ast.Subscript) and isinstance(node.ctx, ast.Store)
              and isinstance(node.slice, ast.Constant)):
            keys = [node.slice.value]
        if keys and all(k in keywords for k in keys) and strategy_only & set(keys):
            found.append(f"{path.name}:{node.lineno} keys {', '.join(sorted(strategy_only & set(keys)))}")
    return found


def test_gmm_kernels_states_facts_not_strategy_options():
    """An adapter states what it takes as facts (``gmm_kernels.scope.Limits``); ``property_tests.checks.declared`` turns
    them into ``problems()`` keywords. Nothing in gmm_kernels builds those keywords."""
    strategy_only = _strategy_only_keywords()
    found = [hit for name, path in sorted(MODULES.items()) if name.split(".")[0] == "gmm_kernels"
             for hit in _strategy_knowledge(path, strategy_only)]
    assert not found, ("strategy keywords built in gmm_kernels (state a fact in gmm_kernels.scope.Limits and "
                       "translate it in property_tests/checks/declared.py):\n" + "\n".join(found))


def test_the_strategy_keyword_check_catches_what_it_is_for(tmp_path):
    src = tmp_path / "m.py"
    src.write_text('def _strategy_options(self):\n    return 1\nb = {"min_groups": 2, "allow_tail": False}\n'
                   'opts["max_extent"] = 64\nd = dict(dtypes=pairs)\ne = {"existing_out": False, "sharding": False}\n'
                   'f = {"families": fs, "out_dtypes": o}\ng = Limits(min_groups=2, tail=False)\nkw["tiling"] = t\n')
    assert {"allow_tail", "min_groups", "max_extent", "dtypes"} <= _strategy_only_keywords()
    assert _strategy_knowledge(src, _strategy_only_keywords()) == [
        "m.py:1 defines _strategy_options", "m.py:3 keys allow_tail, min_groups", "m.py:4 keys max_extent",
        "m.py:5 keys dtypes"]


# ------------------------------------------------ a resolved target: its run state set in one place
#: an adapter's run state (gmm_kernels.resolve.RUN_STATE): set after construction by configure alone
RUN_STATE = frozenset({"origin", "tiling", "scope", "version"})
#: the one function that sets it
CONFIGURE = ("gmm_kernels/resolve.py", "configure")


def _run_state_assignments(path: Path) -> list[str]:
    """Each assignment in ``path`` of an adapter's run state (``k.version = ...``, ``k.scope += ...``,
    ``setattr(k, "tiling", ...)``, the name a literal or a module's string constant) outside :data:`CONFIGURE`
    and outside an ``__init__`` setting its own (``self.scope = ...``: construction, not a resolved kernel
    changed). A ``setattr`` whose name is computed is not seen."""
    where = path.relative_to(ROOT).as_posix()
    tree = ast.parse(path.read_text())
    constants = {t.id: n.value.value for n in tree.body if isinstance(n, ast.Assign)
                 and isinstance(n.value, ast.Constant) and isinstance(n.value.value, str)
                 for t in n.targets if isinstance(t, ast.Name)}
    found = []

    def visit(node: ast.AST, function: str | None) -> None:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            function = node.name
        if (where, function) != CONFIGURE:
            targets = (node.targets if isinstance(node, ast.Assign)
                       else [node.target] if isinstance(node, (ast.AugAssign, ast.AnnAssign)) else [])
            for t in targets:
                for e in (t.elts if isinstance(t, (ast.Tuple, ast.List)) else [t]):
                    if isinstance(e, ast.Attribute) and e.attr in RUN_STATE and not (
                            function == "__init__" and _last_name(e.value) == "self"):
                        found.append(f"{where}:{node.lineno} assigns {_last_name(e.value)}.{e.attr}")
            if isinstance(node, ast.Call) and _last_name(node.func) == "setattr" and len(node.args) >= 2:
                name = node.args[1]
                attr = name.value if isinstance(name, ast.Constant) else constants.get(_last_name(name) or "")
                if attr in RUN_STATE:
                    found.append(f"{where}:{node.lineno} sets {_last_name(node.args[0])}.{attr} through setattr")
        for child in ast.iter_child_nodes(node):
            visit(child, function)

    visit(tree, None)
    return found


def test_an_adapters_run_state_is_set_only_by_configure():
    """origin, tiling, scope and version are set when the kernel is resolved, by gmm_kernels.resolve.configure
    (which validates them and returns a configured copy); nothing else changes a resolved kernel."""
    from gmm_kernels.resolve import RUN_STATE as declared

    assert set(declared) == RUN_STATE
    mine = Path(__file__).resolve()
    found = [hit for path in sorted(_sources(include_tests=True).values()) if path.resolve() != mine
             for hit in _run_state_assignments(path)]
    assert not found, "an adapter's run state set outside gmm_kernels.resolve.configure:\n" + "\n".join(found)


def test_the_run_state_check_catches_what_it_is_for(tmp_path, monkeypatch):
    pkg = tmp_path / "gmm_kernels"
    pkg.mkdir()
    src = pkg / "resolve.py"
    src.write_text("F = 'version'\nk.version = '1'\nadapter.scope = s.bind(c)\nk.origin, x = 'a', 1\n"
                   "setattr(k, 'tiling', t)\nsetattr(k, F, v)\nk.name = 'x'\nsetattr(k, 'call', f)\n"
                   "monkeypatch.setattr(k, 'scope', None)\n"
                   "class A:\n    def __init__(self):\n        self.scope = None\n        other.scope = None\n"
                   "def configure(a):\n    a.scope = 1\n    setattr(a, 'tiling', value)\n"
                   "def other(a):\n    self.tiling = 1\n")
    monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path)
    assert _run_state_assignments(src) == [
        "gmm_kernels/resolve.py:2 assigns k.version", "gmm_kernels/resolve.py:3 assigns adapter.scope",
        "gmm_kernels/resolve.py:4 assigns k.origin", "gmm_kernels/resolve.py:5 sets k.tiling through setattr",
        "gmm_kernels/resolve.py:6 sets k.version through setattr",
        "gmm_kernels/resolve.py:9 sets k.scope through setattr", "gmm_kernels/resolve.py:13 assigns other.scope",
        "gmm_kernels/resolve.py:18 assigns self.tiling"]
    elsewhere = tmp_path / "golden"
    elsewhere.mkdir()
    (elsewhere / "cli.py").write_text("def configure(a):\n    a.scope = 1\n")
    assert _run_state_assignments(elsewhere / "cli.py") == ["golden/cli.py:2 assigns a.scope"]
