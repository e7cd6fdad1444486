"""The tree shows the architecture: every module is on docs/architecture.md's map, and the adapters are where
their conventions are (``gmm_kernels/adapters/<m>.py`` for the conventions of ``gmm_ref/conventions/<m>.py``).

(Apart from test_architecture.py only because that module is at the size limit.)
"""

from __future__ import annotations

import re
from pathlib import Path

from .test_architecture import MODULES, PACKAGES, ROOT

ARCHITECTURE = ROOT / "docs" / "architecture.md"
ADAPTERS = ROOT / "gmm_kernels" / "adapters"
CONVENTIONS = ROOT / "gmm_ref" / "conventions"
_HEADING = re.compile(r"^###\s+Modules of `([a-z_]+)`\s*$")


def _documented_modules(text: str) -> dict[str, set[str]]:
    """package -> the modules the first cells of its table name (``### Modules of `pkg```, then ``| `m` | ...``)."""
    found: dict[str, set[str]] = {}
    package = None
    for line in text.splitlines():
        if line.startswith("#"):
            m = _HEADING.match(line)
            package = m.group(1) if m else None
            if package is not None:
                found.setdefault(package, set())
        elif package is not None and line.startswith("|"):
            first = line.split("|")[1]
            found[package].update(re.findall(r"`([^`]+)`", first))
    return found


def _as_documented(name: str, path: Path) -> tuple[str, str]:
    """(package, the module as the tables name it): ``__init__``, ``conventions/``, ``conventions/base``."""
    package, _, rest = name.partition(".")
    rel = rest.replace(".", "/")
    if path.name == "__init__.py":
        rel = f"{rel}/" if rel else "__init__"
    return package, rel


def _map_errors(modules: dict[str, Path], text: str) -> list[str]:
    """Modules the map leaves out, and names on it that are no module (a renamed or deleted one)."""
    documented = _documented_modules(text)
    actual: dict[str, set[str]] = {}
    for name, path in modules.items():
        package, rel = _as_documented(name, path)
        actual.setdefault(package, set()).add(rel)
    errors = []
    for package in sorted(actual):
        on_map = documented.get(package, set())
        errors += [f"{package}: {rel} is not in the table" for rel in sorted(actual[package] - on_map)]
        errors += [f"{package}: the table names {rel}, no such module" for rel in sorted(on_map - actual[package])]
    return errors


def test_every_module_is_on_the_architecture_map():
    assert set(PACKAGES) <= set(_documented_modules(ARCHITECTURE.read_text()))
    errors = _map_errors(MODULES, ARCHITECTURE.read_text())
    assert not errors, "docs/architecture.md's module tables and the tree differ:\n" + "\n".join(errors)


def test_the_map_check_catches_what_it_is_for(tmp_path):
    (tmp_path / "__init__.py").write_text("")
    (tmp_path / "m.py").write_text("")
    modules = {"pkg": tmp_path / "__init__.py", "pkg.sub": tmp_path / "__init__.py", "pkg.sub.a": tmp_path / "m.py",
               "pkg.b": tmp_path / "m.py"}
    text = ("### Modules of `pkg`\n\n| module | holds |\n| --- | --- |\n| `__init__` | x `c` |\n"
            "| `sub/`, `sub/a` | y |\n| `gone` | z |\n\n### Other\n\n| `b` | a table of another section |\n")
    assert _documented_modules(text) == {"pkg": {"__init__", "sub/", "sub/a", "gone"}}
    assert _map_errors(modules, text) == ["pkg: b is not in the table", "pkg: the table names gone, no such module"]
    assert _map_errors(modules, text.replace("`gone`", "`b`")) == []


def _misnamed(adapter_modules: list[str], convention_modules: list[str]) -> list[str]:
    """The adapter modules named like no convention module (``__init__``, ``base`` and private ``_x`` aside)."""
    allowed = set(convention_modules) - {"__init__", "base"}
    return sorted(m for m in adapter_modules if m != "__init__" and not m.startswith("_") and m not in allowed)


def _misplaced(adapters: list[tuple[str, str, str]]) -> list[str]:
    """(name, adapter's module, its convention's module): those not in the adapters module of their convention."""
    return [f"{name} is in {mod}, its convention in {conv}: gmm_kernels.adapters.{conv.rpartition('.')[2]} holds it"
            for name, mod, conv in adapters
            if mod != f"gmm_kernels.adapters.{conv.rpartition('.')[2]}"]


def test_adapter_modules_are_named_like_convention_modules():
    misnamed = _misnamed([p.stem for p in ADAPTERS.glob("*.py")], [p.stem for p in CONVENTIONS.glob("*.py")])
    assert not misnamed, f"gmm_kernels/adapters modules named like no gmm_ref/conventions module: {misnamed}"


def test_each_builtin_adapter_is_in_the_module_of_its_convention():
    import gmm_kernels
    from gmm_ref import conventions

    found = [(a.name, type(a).__module__, type(conventions.get(a.convention)).__module__)
             for a in gmm_kernels.registry() if type(a).__module__.startswith("gmm_kernels.")]
    assert len(found) >= 29  # the built-ins
    assert not _misplaced(found), "\n".join(_misplaced(found))


def test_the_adapter_placement_checks_catch_what_they_are_for():
    assert _misnamed(["__init__", "_tokamax", "ragged_dot", "jax_lax", "base"], ["__init__", "base", "ragged_dot"]) \
        == ["base", "jax_lax"]
    assert _misplaced([("jax.ragged_dot", "gmm_kernels.adapters.ragged_dot", "gmm_ref.conventions.ragged_dot"),
                       ("t", "gmm_kernels.adapters.qwix", "gmm_ref.conventions.ragged_dot")]) == [
        "t is in gmm_kernels.adapters.qwix, its convention in gmm_ref.conventions.ragged_dot: "
        "gmm_kernels.adapters.ragged_dot holds it"]
