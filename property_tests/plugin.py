"""The gmm-harness pytest plugin (registered through ``pytest11``), opt-in.

Installing it changes nothing for a pytest run that does not use it: no
profile is loaded, no header printed, no test added. It is *in use* when
``--gmm-kernel`` is given, or when a project sets ``gmm_harness = true`` in
its pytest configuration (this repository does). Then:

- the ``gmm-ci`` Hypothesis profile is loaded (derandomized, no deadline)
  unless ``--hypothesis-profile`` names another; ``gmm-dev`` and
  ``gmm-thorough`` are there to pick (``property_tests.profiles``);
- ``--gmm-kernel`` (repeatable: a built-in adapter name or ``pkg.module:fn``),
  ``--gmm-convention`` and ``--gmm-tiling`` select the kernels the kernel
  checks run on; with ``--gmm-kernel`` only the kernel checks run;
- ``--gmm-families``, ``--gmm-dtypes``, ``--gmm-out-dtypes``, ``--gmm-multiple``,
  ``--gmm-no-tail``, ``--gmm-numerics`` and ``--gmm-quantizes`` declare the kernels' scope
  (``property_tests.options``; the same as the main job's options without the prefix);
- the ``gmm_kernel`` fixture parametrizes a test over the selected kernels;
- ``pytest_report_header`` lists the kernels under test and why any is skipped;
- JAX's persistent compilation cache is on (``--gmm-compile-cache=DIR|off``,
  default under pytest's cache directory), so xdist workers and later runs
  compile each shape once (``property_tests.compile_cache``);
- ``--gmm-example-db=DIR|redis://HOST:PORT`` (default ``$GMM_HARNESS_EXAMPLE_DB``, else
  off) saves the kernel checks' failing examples and replays them first in
  every run that shares it, on any machine (``property_tests.example_db``).

``--gmm-*`` options are checked whenever they are given: a bad one is one usage error.
"""

from __future__ import annotations

import os
from typing import Any

import pytest

from property_tests.options import SCOPE_OPTIONS, add_scope_options
from property_tests.profiles import DEFAULT, register_profiles

__all__: list[str] = []


def pytest_addoption(parser: pytest.Parser) -> None:
    # registered here, the earliest hook, so that Hypothesis' own plugin can load
    # --hypothesis-profile=gmm-ci|gmm-dev|gmm-thorough in its pytest_configure; registering loads nothing
    register_profiles()
    group = parser.getgroup("gmm-harness", "grouped GEMM kernel checks")
    group.addoption(
        "--gmm-kernel", action="append", default=[], metavar="NAME|pkg.module:fn",
        help="kernel to check: a built-in adapter name or an import path (repeatable)",
    )
    group.addoption(
        "--gmm-convention", default=None, metavar="CONV",
        help="calling convention of the --gmm-kernel import paths (see gmm_ref.conventions.names())",
    )
    group.addoption(
        "--gmm-tiling", default=None, metavar="TM,TK,TN",
        help="tiling the kernel uses; strategies draw extents around its tile edges",
    )
    add_scope_options(group.addoption, prefix="--gmm-")
    group.addoption(
        "--gmm-compile-cache", default=None, metavar="DIR|off",
        help="JAX persistent compilation cache shared by the xdist workers and later runs "
             "(default: .pytest_cache/d/gmm-harness-jax; property_tests.compile_cache)",
    )
    group.addoption(
        "--gmm-example-db", default=None, metavar="DIR|redis://HOST:PORT|off",
        help="Hypothesis example database of the kernel checks: failing examples are saved there and replayed "
             "first by every run sharing it (default: $GMM_HARNESS_EXAMPLE_DB, else off)",
    )
    parser.addini("gmm_harness", type="bool", default=False,
                  help="use the gmm-harness plugin in every run (its gmm-ci profile and report header)")


def in_use(config: pytest.Config) -> bool:
    """Whether this run uses the plugin (``--gmm-kernel``, or ``gmm_harness = true``)."""
    return bool(config.getoption("--gmm-kernel")) or bool(config.getini("gmm_harness"))


def _tiling(config: pytest.Config) -> tuple[int, int, int] | None:
    from gmm_ref import as_tiling

    raw = config.getoption("--gmm-tiling")
    if raw is None:
        return None
    try:
        return as_tiling(raw, name="--gmm-tiling")
    except ValueError as exc:
        raise pytest.UsageError(f"--gmm-tiling: expected three positive ints TM,TK,TN, got {raw!r}") from exc


def selected_kernels(config: pytest.Config) -> list[Any]:
    """The adapters this run checks (cached on the config)."""
    from gmm_kernels import resolve_kernels
    from property_tests.checking import check_known_issue_modes
    from property_tests.options import apply_scope, scope_fields

    cached = getattr(config, "_gmm_kernels", None)
    if cached is not None:
        return cached
    try:
        kernels = resolve_kernels(config.getoption("--gmm-kernel"), convention=config.getoption("--gmm-convention"),
                                  tiling=_tiling(config), option="--gmm-kernel",
                                  convention_option="--gmm-convention")
        fields = scope_fields(_scope_values(config), prefix="--gmm-")
        for k in kernels:
            apply_scope(k, fields, prefix="--gmm-")
            check_known_issue_modes(k, option="--gmm-kernel")
    except (ValueError, TypeError, ImportError) as exc:
        raise pytest.UsageError(str(exc)) from None
    config._gmm_kernels = kernels  # type: ignore[attr-defined]
    return kernels


def _scope_values(config: pytest.Config) -> dict[str, Any]:
    return {name: config.getoption("--gmm-" + name) for name, _ in SCOPE_OPTIONS}


def _check_options(config: pytest.Config) -> None:
    """Every --gmm-* option is checked whenever it is given: one usage error, before collection."""
    from gmm_ref import conventions

    kernels = config.getoption("--gmm-kernel")
    given = [o for o in ("--gmm-convention", "--gmm-tiling") if config.getoption(o) is not None]
    given += [f"--gmm-{n}" for n, v in _scope_values(config).items() if v]
    if given and not kernels:
        raise pytest.UsageError(f"{given[0]}: given without --gmm-kernel, which it applies to")
    convention = config.getoption("--gmm-convention")
    if convention is not None and convention not in conventions.names():
        raise pytest.UsageError(f"--gmm-convention: expected one of {conventions.names()}, got {convention!r}")
    _tiling(config)
    if kernels:
        selected_kernels(config)  # fail fast on a bad import path


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "kernel: checks a real kernel against the reference")
    config.addinivalue_line("markers", "slow: takes more than a few seconds")
    _check_options(config)
    from property_tests import example_db

    spec = config.getoption("--gmm-example-db")
    try:
        example_db.resolve(spec, option_name="--gmm-example-db")  # a bad spec is a usage error before collection
    except (ValueError, TypeError, ImportError) as exc:
        raise pytest.UsageError(str(exc)) from None
    if spec is not None:  # the checks (and the processes this run starts) read it from the environment
        os.environ[example_db.ENV] = spec
    config._gmm_example_db = example_db.describe(os.environ.get(example_db.ENV))  # type: ignore[attr-defined]
    if not in_use(config):
        return
    if config.getoption("hypothesis_profile", None) is None:
        from hypothesis import settings

        settings.load_profile(DEFAULT)  # deterministic unless asked otherwise
    from property_tests import compile_cache

    cache = getattr(config, "cache", None)  # absent under -p no:cacheprovider
    fallback = cache.mkdir("gmm-harness-jax") if cache is not None else None
    try:
        config._gmm_compile_cache = compile_cache.enable(  # type: ignore[attr-defined]
            config.getoption("--gmm-compile-cache"), fallback, option_name="--gmm-compile-cache")
    except ValueError as exc:
        raise pytest.UsageError(str(exc)) from None


def pytest_report_header(config: pytest.Config) -> list[str]:
    if not in_use(config):
        return []
    lines = []
    for k in selected_kernels(config):
        why = k.available()
        lines.append(f"gmm kernel {k.name} ({k.convention}): " + ("available" if why is None else f"SKIPPED: {why}"))
        if k.scope is not None:
            lines.append(f"gmm kernel {k.name} declared scope: {k.scope.describe()}")
    tiling = _tiling(config)
    if tiling:
        lines.append(f"gmm tiling: {tiling}")
    lines.append(f"gmm {getattr(config, '_gmm_compile_cache', 'jax compilation cache: off')}")
    lines.append(f"gmm {getattr(config, '_gmm_example_db', 'example database: off')}")
    return lines


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "gmm_kernel" in metafunc.fixturenames:
        kernels = selected_kernels(metafunc.config)
        metafunc.parametrize("gmm_kernel", kernels, ids=[k.name for k in kernels])


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if not config.getoption("--gmm-kernel"):
        return
    keep, drop = [], []
    for item in items:
        (keep if item.get_closest_marker("kernel") else drop).append(item)
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = keep
