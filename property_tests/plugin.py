"""The gmm-harness pytest plugin (registered through ``pytest11``), opt-in.

Installing it changes nothing for a pytest run that does not use it: no
profile is loaded, no header printed, no test added. It is *in use* when
``--gmm-kernel`` is given, or when a project sets ``gmm_harness = true`` in
its pytest configuration (this repository does). Then:

- the ``gmm-ci`` Hypothesis profile is loaded (derandomized, no deadline)
  unless ``--hypothesis-profile`` names another (or ``--gmm-tier`` a tier: its profile); ``gmm-quick``,
  ``gmm-nightly``, ``gmm-dev`` and ``gmm-thorough`` are there to pick (``property_tests.checks.profiles``);
- ``--gmm-tier NAME`` (``property_tests.checks.tiers``: ``gmm-quick`` for pull requests, ``gmm-ci``,
  ``gmm-nightly``, ...) is what the kernel checks run: examples a cell, the order of the cells, the modes
  (``gmm-nightly`` adds the ``large`` mode), a time budget of new examples after a passed mode (its share of the tier's)
  and the example database; without it they run under the profile in force. The report header names the tier;
- ``--gmm-kernel`` (repeatable: a built-in adapter name or ``pkg.module:fn``),
  ``--gmm-convention`` and ``--gmm-tiling`` select the kernels the kernel
  checks run on. The harness's kernel checks, ``property_tests.kernel_checks``, are
  collected by the plugin itself when the run asks for the harness's package
  (``--pyargs property_tests``), while your own tests run as always; a run in
  which no collected test checks the kernel (neither ``--pyargs property_tests``
  nor a test of yours using ``gmm_kernel``) is a usage error that says to add
  ``--pyargs property_tests`` (under xdist, whose workers cannot stop the run, a
  failing item with the same message);
- a kernel check's failure is printed to stderr as soon as it is reported
  (``gmm-harness: FAIL KERNEL / MODE: cause``); the checks run the modes most likely
  to fail first (``property_tests.checks.engine.RUN_ORDER``), so pytest's ``-x`` stops a
  broken kernel's run at its first failing mode;
- ``--gmm-families``, ``--gmm-dtypes``, ``--gmm-out-dtypes``, ``--gmm-multiple``,
  ``--gmm-no-tail``, ``--gmm-numerics`` and ``--gmm-quantizes`` declare the kernels' scope
  (``property_tests.cli.options``; the same as the main job's options without the prefix);
- the ``gmm_kernel`` fixture parametrizes a test over the selected kernels; the ``gmm_check_run`` fixture is the
  session's ``property_tests.checks.failures.CheckRun`` (``check_mode(..., run=gmm_check_run)``: an exception a kernel
  raises is reported in the first check that finds it, the later ones say so in one line);
- ``pytest_report_header`` lists the kernels under test; with ``--gmm-kernel``, each one's device and why it
  is skipped if it is (without it, every built-in kernel by name only: probing them all imports every kernel
  library);
- JAX's persistent compilation cache is on (``--gmm-compile-cache=DIR|off``,
  default the one the main job and ``check_kernel`` use, ``~/.cache/gmm-harness/jax``),
  so xdist workers, later runs and the other front ends compile each shape once
  (``gmm_kernels.runtimes.compile_cache``); a directory that cannot be written is a usage error;
- ``--gmm-example-db=DIR|redis://HOST:PORT`` (default ``$GMM_HARNESS_EXAMPLE_DB``, else
  off) saves the kernel checks' failing examples and replays them first in
  every run that shares it, on any machine (``property_tests.checks.example_db``).

``--gmm-*`` options are checked whenever they are given: a bad one is one usage error.
"""

from __future__ import annotations

import fnmatch
import os
import sys
from pathlib import Path
from typing import Any

import pytest

from property_tests.checks.engine import shorten
from property_tests.checks.profiles import DEFAULT, register_profiles
from property_tests.checks.tiers import TIERS
from property_tests.cli.options import SCOPE_OPTIONS, add_device_option, add_scope_options

__all__: list[str] = []

#: the libraries whose own DeprecationWarnings a run that uses the plugin does not show
THIRD_PARTY = ("torch", "jax", "jaxlib", "triton", "hypothesis", "ml_dtypes")

#: the harness's kernel checks, which the plugin collects itself with --gmm-kernel
_CHECKS = Path(__file__).resolve().parent / "kernel_checks.py"

# the run's state, in pytest's public per-config stash
_KERNELS = pytest.StashKey[list[Any]]()  # the adapters this run checks
_COMPILE_CACHE = pytest.StashKey[str]()  # the report header's line on the compilation cache
_EXAMPLE_DB = pytest.StashKey[str]()  # the report header's line on the example database


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
        "--gmm-kernel-in-process", action="store_true", default=False,
        help="import and call a pkg.module:fn kernel in the test process (for a debugger; not tamper-proof) "
             "instead of a process of its own",
    )
    group.addoption(
        "--gmm-convention", default=None, metavar="CONV",
        help="calling convention of the --gmm-kernel import paths (gmm_ref.conventions.names(), and the routed MoE "
             "ones, gmm_ref.conventions.routed_names())",
    )
    group.addoption(
        "--gmm-tiling", default=None, metavar="TM,TK,TN",
        help="tiling the kernel uses; strategies draw extents around its tile edges",
    )
    add_scope_options(group.addoption, prefix="--gmm-")
    add_device_option(group.addoption, prefix="--gmm-")
    group.addoption(
        "--gmm-tier", default=None, metavar="NAME",
        help=f"what the kernel checks run: {', '.join(TIERS)} (gmm-quick for pull requests: every cell of the "
             "covering designs once; gmm-nightly: gmm-ci, then a time budget of new examples, the large mode, an "
             "example database; default: the profile in force; docs/speed.md)",
    )
    group.addoption(
        "--gmm-compile-cache", default=None, metavar="DIR|off",
        help="JAX persistent compilation cache shared by the xdist workers and later runs "
             "(default: the main job's and check_kernel's, $XDG_CACHE_HOME/gmm-harness/jax or "
             "~/.cache/gmm-harness/jax; gmm_kernels.runtimes.compile_cache)",
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
    from property_tests.checks.check import check_known_issue_modes
    from property_tests.cli.options import apply_scope, scope_fields

    cached = config.stash.get(_KERNELS, None)
    if cached is not None:
        return cached
    try:
        kernels = resolve_kernels(config.getoption("--gmm-kernel"), convention=config.getoption("--gmm-convention"),
                                  tiling=_tiling(config), option="--gmm-kernel",
                                  convention_option="--gmm-convention",
                                  in_process=config.getoption("--gmm-kernel-in-process"))
        fields = scope_fields(_scope_values(config), prefix="--gmm-")
        kernels = [apply_scope(k, fields, prefix="--gmm-") for k in kernels]
        for k in kernels:
            check_known_issue_modes(k, option="--gmm-kernel")
    except (ValueError, TypeError, ImportError) as exc:
        raise pytest.UsageError(str(exc)) from None
    config.stash[_KERNELS] = kernels
    return kernels


def _scope_values(config: pytest.Config) -> dict[str, Any]:
    return {name: config.getoption("--gmm-" + name) for name, _ in SCOPE_OPTIONS}


def _device(config: pytest.Config) -> str:
    """The device of ``--gmm-device`` (default auto), selected for this process (``gmm_kernels.sandbox.device``); a
    usage error naming the option for a bad value or a CUDA device torch does not see."""
    from gmm_kernels.sandbox import device

    try:
        return device.select(config.getoption("--gmm-device") or "auto", option="--gmm-device")
    except ValueError as exc:
        raise pytest.UsageError(str(exc)) from None


def tier(config: pytest.Config) -> Any:
    """The ``property_tests.checks.tiers.Tier`` of ``--gmm-tier`` (None when not given); a usage error naming the option
    (with a did-you-mean) for an unknown one."""
    from property_tests.checks.tiers import tier_of

    name = config.getoption("--gmm-tier")
    try:
        return None if name is None else tier_of(name, option="--gmm-tier")
    except ValueError as exc:
        raise pytest.UsageError(str(exc)) from None


def tier_modes(config: pytest.Config) -> list[str]:
    """The modes the kernel checks run, in ``RUN_ORDER``: the default ones and the tier's opt-in ones."""
    from property_tests.checks.engine import mode_order
    from property_tests.checks.modes import MODES

    chosen = tier(config)
    return mode_order([*MODES, *(chosen.opt_in if chosen is not None else ())])


def _check_options(config: pytest.Config) -> None:
    """Every --gmm-* option is checked whenever it is given: one usage error, before collection."""
    from gmm_ref import conventions
    from gmm_ref.names import did_you_mean

    kernels = config.getoption("--gmm-kernel")
    given = [o for o in ("--gmm-convention", "--gmm-tiling") if config.getoption(o) is not None]
    given += [f"--gmm-{n}" for n, v in _scope_values(config).items() if v]
    if given and not kernels:
        raise pytest.UsageError(f"{given[0]}: given without --gmm-kernel, which it applies to")
    convention = config.getoption("--gmm-convention")
    known = (*conventions.names(), *conventions.routed_names())
    if convention is not None and convention not in known:
        raise pytest.UsageError(f"--gmm-convention: expected one of {known}, got {convention!r}"
                                f"{did_you_mean(convention, known)}")
    _tiling(config)
    tier(config)
    if config.getoption("--gmm-device") is not None:  # else auto, resolved where a kernel first needs it
        _device(config)
    if kernels:
        selected_kernels(config)  # fail fast on a bad import path


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "kernel: checks a real kernel against the reference")
    config.addinivalue_line("markers", "slow: takes more than a few seconds")
    _check_options(config)
    from property_tests.checks import example_db

    spec = config.getoption("--gmm-example-db")
    if in_use(config):  # a tier's own database (gmm-nightly's) where none is given
        from property_tests.checks.tiers import example_db_spec

        spec = example_db_spec(spec, tier(config))
    try:
        example_db.resolve(spec, option_name="--gmm-example-db")  # a bad spec is a usage error before collection
    except (ValueError, TypeError, ImportError) as exc:
        raise pytest.UsageError(str(exc)) from None
    if spec is not None:  # the checks (and the processes this run starts) read it from the environment
        os.environ[example_db.ENV] = spec
    config.stash[_EXAMPLE_DB] = example_db.describe(os.environ.get(example_db.ENV))
    if not in_use(config):
        return
    # what the libraries a kernel runs on say of their own deprecated parts (torch.jit's, at import) is not the
    # kernel's concern: a run shows what is (a deprecation your own code triggers is attributed to your module)
    for library in THIRD_PARTY:
        config.addinivalue_line("filterwarnings", f"ignore::DeprecationWarning:{library}.*")
    from gmm_kernels.runtimes.process import prepare_process

    try:  # the interpreter before collection imports a Triton kernel; the cache the main job and check_kernel use
        config.stash[_COMPILE_CACHE] = prepare_process(host=False, cache=True, option_name="--gmm-compile-cache",
                                                       cache_dir=config.getoption("--gmm-compile-cache"))
    except ValueError as exc:
        raise pytest.UsageError(str(exc)) from None
    if config.getoption("hypothesis_profile", None) is None:
        from hypothesis import settings

        chosen = tier(config)  # the tier's profile (of its name) for your own tests; else gmm-ci
        settings.load_profile(DEFAULT if chosen is None else chosen.name)  # deterministic unless asked otherwise


def pytest_report_header(config: pytest.Config) -> list[str]:
    if not in_use(config):
        return []
    from gmm_kernels.sandbox import device

    lines = []
    kernels = selected_kernels(config)
    named = bool(config.getoption("--gmm-kernel"))
    if not named:
        # every built-in kernel: probing each one's availability imports every kernel library (jax, torch, tokamax,
        # ejkernel, triton, ...: 8 to 16 s), which a run whose tests may use none of them should not pay
        lines.append(f"gmm kernels: {len(kernels)}, availability not probed (no --gmm-kernel; name one to see whether "
                     "it runs here): " + ", ".join(k.name for k in kernels))
    for k in kernels:
        if named:
            why = k.available()
            lines.append(f"gmm kernel {k.name} ({k.convention}) on {device.of(k)}: "
                         + ("available" if why is None else f"SKIPPED: {why}"))
        if k.scope is not None:
            lines.append(f"gmm kernel {k.name} declared scope: {k.scope.describe()}")
    tiling = _tiling(config)
    if tiling:
        lines.append(f"gmm tiling: {tiling}")
    chosen = tier(config)
    lines.append(f"gmm tier {chosen.describe()}" if chosen is not None else
                 "gmm tier: none (the kernel checks run under the Hypothesis profile in force; --gmm-tier names one)")
    lines.append(f"gmm {config.stash.get(_COMPILE_CACHE, 'jax compilation cache: off')}")
    lines.append(f"gmm {config.stash.get(_EXAMPLE_DB, 'example database: off')}")
    return lines


@pytest.fixture(scope="session")
def gmm_check_run(request: pytest.FixtureRequest) -> Any:
    """The session's ``property_tests.checks.failures.CheckRun``, shared by the checks of its kernels. A failing example
    is said on stderr as soon as it is found, before it is shrunk (``gmm-harness: FOUND ...``); under xdist a
    worker's stderr is not shown, so there it is a log record (in the test's report)."""
    from property_tests.checks.failures import CheckRun, found_line

    capman = request.config.pluginmanager.getplugin("capturemanager")
    if hasattr(request.config, "workerinput") or capman is None:
        return CheckRun()

    def announce(kernel: str, where: str, line: str) -> None:
        with capman.global_and_fixture_disabled():
            sys.stderr.write(found_line(kernel, where, line) + "\n")
            sys.stderr.flush()

    return CheckRun(announce)


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "gmm_kernel" in metafunc.fixturenames:
        kernels = selected_kernels(metafunc.config)
        metafunc.parametrize("gmm_kernel", kernels, ids=[k.name for k in kernels])
    if "gmm_mode" in metafunc.fixturenames:  # the kernel checks' modes: the tier's, most likely to fail first
        metafunc.parametrize("gmm_mode", tier_modes(metafunc.config))


def pytest_collect_file(file_path: Path, parent: pytest.Collector) -> pytest.Module | None:
    # the harness's kernel checks, collected when the run walks the harness's package with --gmm-kernel; not named
    # test_*.py, so that this repository's suite (whose tests/golden/test_goldens.py imports the goldens check) and a
    # run without --gmm-kernel do not collect them twice
    if not parent.config.getoption("--gmm-kernel") or file_path.name != _CHECKS.name:
        return None
    if file_path != _CHECKS and file_path.resolve() != _CHECKS:
        return None
    if any(fnmatch.fnmatch(file_path.name, pattern) for pattern in parent.config.getini("python_files")):
        return None  # pytest's own collection takes it (a project collecting every *.py)
    return pytest.Module.from_parent(parent, path=file_path)


class _CheckedNothing(pytest.Item):
    """A run whose --gmm-kernel no collected test checks, under xdist: its workers cannot end the run
    with a usage error (pytest reports an internal error), so the message is this item's failure."""

    def __init__(self, *, message: str, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.message = message

    def runtest(self) -> None:
        raise pytest.UsageError(self.message)

    def repr_failure(self, excinfo: Any, style: Any = None) -> str:
        return self.message

    def reportinfo(self) -> tuple[Any, int | None, str]:
        return self.path, None, self.name


@pytest.hookimpl(tryfirst=True)  # before -k / -m deselect: whether any collected test checks the kernel
def pytest_collection_modifyitems(session: pytest.Session, config: pytest.Config, items: list[pytest.Item]) -> None:
    kernels = config.getoption("--gmm-kernel")
    if not kernels:
        return
    if any("gmm_kernel" in getattr(item, "fixturenames", ()) for item in items):
        return
    them = "it" if len(kernels) == 1 else "them"
    message = (f"--gmm-kernel {', '.join(kernels)}: no collected test checks {them}: the harness's kernel checks "
               "are collected with --pyargs property_tests (python -m pytest [your tests] --pyargs property_tests "
               "--gmm-kernel ...), or a test of yours takes the gmm_kernel fixture")
    if not hasattr(config, "workerinput"):  # not an xdist worker (whatever this process's environment says: a
        raise pytest.UsageError(message)    # pytest started from an xdist worker's test inherits its variables)
    items.append(_CheckedNothing.from_parent(session, name="--gmm-kernel checked by no test",
                                             nodeid="gmm-harness: --gmm-kernel checked by no test", message=message))


def pytest_collection_finish(session: pytest.Session) -> None:
    if not in_use(session.config):
        return
    from gmm_kernels.runtimes import triton_interpreter

    try:  # your own tests' Triton kernels (imported at collection) run in the fixed interpreter too
        triton_interpreter.fix()
    except triton_interpreter.InterpreterDefect as exc:
        raise pytest.UsageError(str(exc)) from None


def pytest_terminal_summary(terminalreporter: Any, exitstatus: int, config: pytest.Config) -> None:
    """The distinct causes of each kernel's failures over the run's kernel checks (under xdist too: they travel in
    the tests' reports), with the declaration that scopes out a problem a kernel may simply not take."""
    from property_tests.checks import causes

    found: dict[str, list[dict[str, Any]]] = {}
    for reports in terminalreporter.stats.values():
        for report in reports:
            properties = dict(getattr(report, "user_properties", ()) or ())
            if getattr(report, "when", None) == "call" and "gmm_causes" in properties and "gmm_check" in properties:
                found.setdefault(properties["gmm_check"][0], []).append(properties["gmm_causes"])
    for kernel, records in found.items():
        declared = {t: d for r in records for t, d in r["declarations"].items()}
        summary = causes.summarize(None, [(r["where"], r["causes"], r["evidence"]) for r in records], declared,
                                   records[0]["convention"])
        if len(summary) > 1 or any(c["declaration"] for c in summary):  # else the failure's report says it all
            terminalreporter.write_sep("=", "gmm-harness: distinct causes")
            terminalreporter.write_line("\n".join(causes.summary_lines(
                summary, kernel, report=f"the failure of test_kernel_matches_reference[{kernel}-{{}}]")))


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    # a kernel check's failure goes to stderr as soon as it is reported (under xdist, on the controller), not
    # only in the summary at the end of the run
    properties = dict(report.user_properties)
    check = properties.get("gmm_check")  # property_tests.kernel_checks.CHECK and CAUSE
    if check is None or not report.failed:
        return
    crash = getattr(report.longrepr, "reprcrash", None)
    text = properties.get("gmm_cause") or (crash.message if crash is not None else str(report.longrepr))
    text = " ".join(text.split())
    sys.stderr.write(f"gmm-harness: FAIL {check[0]} / {check[1]}: {shorten(text)}\n")
    sys.stderr.flush()
