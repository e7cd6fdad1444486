"""Check a kernel against the reference: one mode (:func:`check_mode`) or every mode (:func:`check_kernel`).

Each mode is a Hypothesis property (``property_tests.modes``); a failure is
shrunk and reported as a ``gmm_ref.Mismatch`` carrying the report and a
reproducer. Both functions return the result model of ``gmm_kernels.results``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import time
import zlib
from collections import Counter
from collections.abc import Callable, Iterable
from typing import Any

import numpy as np
from hypothesis import HealthCheck, Phase, event, given, settings
from hypothesis import seed as hypothesis_seed
from hypothesis.database import ExampleDatabase
from hypothesis.errors import InvalidArgument

import gmm_ref
from gmm_kernels import KernelAdapter, Report, Result, Scope, Status, cuda_graph, resolve_kernel
from gmm_kernels import device as devices
from gmm_ref.compare_routed import routed_element
from property_tests import compile_cache, failures, scale
from property_tests import example_db as example_dbs
from property_tests.modes import ALL_MODES, MODES, Mode, Unsupported, mode_covering, mode_of, mode_routings
from property_tests.profiles import PROFILES, pinned_constants
from property_tests.profiles import profile as profile_settings
from property_tests.strategies.design import observe, pairs_of
from property_tests.strategies.problems import Covering, replay_refusal, replays

__all__ = ["check_kernel", "check_mode", "cotangent_for", "coverage"]


def _budgets(max_examples: int | None, profile: str | None, cap: int | None, cells: int) -> list[int]:
    """Examples per cell of the covering design. Under a profile's budget (``max_examples`` None) every
    cell runs, at least twice (Hypothesis' first example of a run is its simplest), so that every pair
    of relations is reached: the budget is spread over the cells and raised where it is too small. A
    limit given explicitly (``max_examples``, or the kernel's own cap ``adapter.max_examples``) is
    kept: when it is below two per cell only the first cells run (the design's first cells cover the
    most pairs) and the result says which pairs were missed."""
    limits = [x for x in (max_examples, cap) if x is not None]
    if not limits or min(limits) >= 2 * cells:
        n = min(limits) if limits else profile_settings(profile).max_examples
        per, extra = divmod(n, cells)
        return [max(2, per + (i < extra)) for i in range(cells)]
    n = min(limits)
    run = max(1, n // 2)
    return [n // run + (i < n % run) for i in range(run)]


def _settings(profile: str | None, n: int, seeded: bool, database: ExampleDatabase | None,
              cell: str) -> settings:
    """The settings of one cell's run; its example database (if any) keyed for the ``cell``."""
    base = profile_settings(profile)
    if database is None:  # none asked for: a seeded run (derandomized, or --seed) keeps none, others the profile's
        database = None if seeded else base.database
    return settings(
        base,
        max_examples=n,
        deadline=None,
        # each cell runs under a seed of its own (derived from the cell, or from the given seed), so that
        # a derandomized profile stays deterministic while the cells draw different values
        derandomize=False if seeded else base.derandomize,
        # the cell's own key: a saved example replays in the check that drew it (Hypothesis keys by the property's
        # source, the same for every cell)
        database=example_dbs.for_cell(database, cell),
        phases=[p for p in base.phases if p is not Phase.explain],  # it explains our property, not the kernel
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much, HealthCheck.data_too_large],
    )


def _run_setting(profile: str | None, seed: int | None, max_examples: int | None = None) -> str:
    """How the examples were chosen, for the verdict: a seed, or a profile (and whether derandomized)."""
    base = profile_settings(profile)
    n = max_examples if max_examples is not None else base.max_examples
    if seed is not None:
        return f"seed={seed} ({n} examples)"
    name = profile or "settings in force"
    return f"{name} profile ({'derandomized' if base.derandomize else 'random'}, {n} examples)"


def cotangent_for(problem: gmm_ref.Problem) -> np.ndarray:
    """A cotangent for ``problem``'s output: normal values in the output dtype, seeded by the inputs."""
    seed = zlib.crc32(problem.lhs.tobytes()[:4096] + problem.rhs.tobytes()[:4096])
    rng = np.random.default_rng(seed)
    return gmm_ref.round_to(rng.standard_normal(problem.out_shape), problem.out_dtype)


def _check_gradients(adapter: KernelAdapter, problem: gmm_ref.Problem) -> None:
    """Compare ``adapter.vjp`` with gmm_ref's exact gradients (each its own problem and bound)."""
    __tracebackhide__ = True
    cot = cotangent_for(problem)
    try:
        got = adapter.vjp(problem, cot)  # NotImplementedError: this kernel has no gradient
    except NotImplementedError:
        raise
    except Exception as exc:
        failures.attach(exc, problem=problem, numerics=adapter.numerics_for(problem), wrt="lhs", cotangent=cot)
        raise
    want = gmm_ref.gradients(problem, cot)
    for wrt, value in got.items():
        if adapter.known_gradient_issue(wrt):  # a declared upstream bug, pinned by its own strict-xfail test
            continue
        gp = want[wrt]
        numerics = adapter.numerics_for(gp)
        try:
            gmm_ref.assert_matches_reference(value, gp, numerics=numerics, kernel=f"{adapter.name} d/d{wrt}")
        except gmm_ref.Mismatch as exc:
            failures.attach(exc, problem=problem, numerics=numerics, wrt=wrt, cotangent=cot)
            raise


def _check_calls(adapter: KernelAdapter, problems: tuple[gmm_ref.Problem, ...], mode: Mode) -> None:
    """The forward result of each problem, called in turn on the same adapter (``Mode.replays``: one shape,
    several group-size vectors); a failure of a later call names the calls before it (its reproducer makes them)."""
    __tracebackhide__ = True
    for i, problem in enumerate(problems):
        _check_forward(adapter, problem, mode, before=tuple(p.group_sizes for p in problems[:i]))
    if len(problems) > 1 and adapter.convention_facts.framework == "torch" and devices.on_cuda():
        _check_graph_replays(adapter, problems)


def _check_graph_replays(adapter: KernelAdapter, problems: tuple[gmm_ref.Problem, ...]) -> None:
    """On a CUDA device, the calls again as replays of one captured CUDA graph (``gmm_kernels.cuda_graph``);
    ``cuda_graph.NotCapturable`` where the call cannot be captured (the property declines the problem)."""
    __tracebackhide__ = True

    def attach(exc: BaseException, problem: gmm_ref.Problem, replay: int) -> None:
        before = tuple(p.group_sizes for p in problems[:replay - 1])
        failures.attach(exc, problem=problem, numerics=adapter.numerics_for(problem), **failures.replayed(before))

    cuda_graph.check_replays(adapter, problems, capture=cuda_graph.cuda_capture, on_failure=attach)


def _check_forward(adapter: KernelAdapter, problem: gmm_ref.Problem, mode: Mode, before: tuple = ()) -> None:
    __tracebackhide__ = True
    # from the harness's own read-only problem, before the kernel runs (quantized as the kernel declares)
    ref = adapter.reference_for(problem)
    numerics = adapter.numerics_for(problem)
    try:
        out = adapter.run(problem)
        try:
            gmm_ref.assert_matches_reference(out, ref, numerics=numerics, kernel=adapter.name)
        except gmm_ref.Mismatch as exc:
            exc._guarded_output = out  # type: ignore[attr-defined]  # for _name_guarded_reads, once shrunk
            raise
        if mode.deterministic_repeat and adapter.deterministic:
            gmm_ref.assert_deterministic(out, adapter.run(problem), ref, kernel=adapter.name)
    except Exception as exc:
        failures.attach(exc, problem=problem, numerics=numerics,
                        determinism=getattr(exc, "kind", None) == "determinism", **failures.replayed(before))
        if before:
            exc.add_note(failures.replay_note(problem, before))
        raise


def _name_guarded_reads(adapter: KernelAdapter, exc: BaseException) -> None:
    """Make the shrunk failure ``exc`` a ``read_out_of_bounds`` one, its first line naming the operand, where the
    guard regions tell that the kernel read outside one (``KernelAdapter.guarded_reads``: reruns of the failing
    example, once, after shrinking); else leave it."""
    out = vars(exc).pop("_guarded_output", None) if hasattr(exc, "__dict__") else None  # not kept alive after this
    problem = failures.recipe_problem(exc, None)
    if not isinstance(exc, gmm_ref.Mismatch) or out is None or problem is None:
        return
    lines = adapter.guarded_reads(problem, out, exc.comparison.bad)
    if lines:
        message = f"kernel {adapter.name} read out of bounds: " + "; ".join(lines) + "\n" + str(exc)
        exc.args = (message,)
        exc.comparison = dataclasses.replace(exc.comparison, kind="read_out_of_bounds", message=message)


class _Tally:
    """What a mode's cells found so far: examples checked, declined and repeated, relations reached."""

    def __init__(self) -> None:
        self.checked = 0
        self.declined: list[str] = []
        self.repeated: list[tuple[str, BaseException]] = []
        self.coverage: Counter[str] = Counter()
        self.cells = (0, 0)  # cells run, cells in the design
        self.reached: set[tuple[str, frozenset]] = set()  # (family, pair) of relations checked together
        self.summary: tuple[tuple[int, int], tuple[str, ...]] = ((0, 0), ())

    def count(self, problem: gmm_ref.Problem, seen: dict[str, frozenset[str]], relations: list[str]) -> None:
        """One example checked (or, for coverage, drawn), with the relations it showed."""
        self.checked += 1
        self.coverage.update(relations)
        self.reached.update((problem.family, p) for p in pairs_of(seen))

    def conclude(self, adapter: KernelAdapter, what: str) -> None:
        """After a mode's examples (``what``: problem, routing): :class:`failures.Repeated` if examples raised an
        exception another check reported, :class:`Unsupported` if the kernel declined every one."""
        if self.repeated:
            where, exc = self.repeated[0]
            raise failures.Repeated(
                f"raised again in {len(self.repeated)} of {len(self.repeated) + self.checked} examples, as in "
                f"{where} (reported there; not shrunk again): {failures.one_line(exc)}")
        if self.checked == 0:
            # the most frequent reason, the first given among equals (a set's order would follow the hash seed)
            reason = Counter(self.declined).most_common(1)[0][0] if self.declined else f"no {what} drawn"
            raise Unsupported(f"{adapter.name} declined every {what}: {reason}")

    def reached_fields(self) -> dict[str, Any]:
        """The :class:`Result` fields of what the examples reached."""
        return dict(examples=self.checked, coverage=tuple(sorted(self.coverage.items())), cells=self.cells,
                    pairs=self.summary[0], missing=self.summary[1])

    def pairs(self, cov: Covering) -> tuple[tuple[int, int], tuple[str, ...]]:
        """(pairs reached, pairs in the designs) and the missing ones, described."""
        wanted = {(fam, p) for fam, d in cov.designs.items() for p in d.pairs}
        missing = sorted(f"{fam}: " + " & ".join(f"{f}={v}" for f, v in sorted(p)) for fam, p in wanted - self.reached)
        return (len(wanted & self.reached), len(wanted)), tuple(missing)


def _cell_property(adapter: KernelAdapter, mode: Mode, cov: Covering, tally: _Tally, run: failures.CheckRun,
                   dry: bool = False) -> Callable[..., None]:
    check = _cell_check(adapter, mode, cov, tally, run, dry)

    # what Hypothesis runs: short, for Hypothesis digests its source for the example database's key
    def cell(problem: tuple[gmm_ref.Problem, ...]) -> None:
        check(problem)

    return cell


def _cell_check(adapter: KernelAdapter, mode: Mode, cov: Covering, tally: _Tally, run: failures.CheckRun,
                dry: bool) -> Callable[[tuple[gmm_ref.Problem, ...]], None]:
    def prop(problems: tuple[gmm_ref.Problem, ...]) -> None:
        __tracebackhide__ = True
        try:
            one(problems)
        except Exception as exc:
            # its notes so far are the checked code's, not Hypothesis'
            failures.left_property(exc, failures.recipe_problem(exc, problems[0]))
            raise

    def one(problems: tuple[gmm_ref.Problem, ...]) -> None:
        problem = problems[0]  # the others (Mode.replays) differ from it only in their group sizes
        reason = next((r for r in map(adapter.supports, problems) if r is not None), None)
        if reason is None and len(problems) < mode.replays:  # no other group sizes for it: not this mode's problem
            reason = replay_refusal(problem)
        if reason is not None:
            tally.declined.append(reason)
            return
        seen = observe(problem, cov.config)
        relations = [f"{f}={v}" for f, levels in seen.items() for v in sorted(levels)]
        for r in relations:
            event(r)
        if dry:  # coverage only: what would be checked, without calling the kernel
            tally.count(problem, seen, relations)
            return
        try:
            if mode.gradient:
                _check_gradients(adapter, problem)
            else:
                _check_calls(adapter, problems, mode)
        except NotImplementedError as exc:
            if not mode.gradient:
                raise
            tally.declined.append(str(exc))
            return
        except cuda_graph.NotCapturable as exc:  # a refusal: its eager calls passed (docs/semantics.md)
            tally.declined.append(f"{adapter.name} {exc}")
            return
        except Exception as exc:
            where = run.seen_before(adapter, exc)
            if where is None:
                raise
            tally.repeated.append((where, exc))  # reported once already: not shrunk again
            return
        tally.count(problem, seen, relations)

    return prop


def _run_property(adapter: KernelAdapter, mode: Mode, family: str | None, max_examples: int | None,
                  profile: str | None, seed: int | None = None, dry: bool = False,
                  database: ExampleDatabase | None = None, run: failures.CheckRun | None = None) -> _Tally:
    """Run the mode's property over every cell of its covering design. Raises the (shrunk) failure of the
    first failing cell, or :class:`failures.Repeated` when examples raised only an exception ``run`` already
    reported for the kernel, or :class:`Unsupported`."""
    __tracebackhide__ = True
    try:
        cov = mode_covering(adapter, mode, family)
    except InvalidArgument as exc:  # the strategies cannot draw this mode for this convention
        raise Unsupported(f"no {mode.name} problems in {adapter.convention}: {exc}") from None
    tally = _Tally()
    run = run if run is not None else failures.CheckRun()
    derandomized = profile_settings(profile).derandomize
    budgets = _budgets(max_examples, profile, adapter.max_examples, len(cov.cells))
    tally.cells = (len(budgets), len(cov.cells))
    for i, (cc, n) in enumerate(zip(cov.cells[:len(budgets)], budgets, strict=True)):
        # a tuple of problems: one, or one shape with Mode.replays group-size vectors
        prop = given(problem=replays(cov, cc, mode.replays))(_cell_property(adapter, mode, cov, tally, run, dry))
        cell = f"gmm-harness {adapter.name} {adapter.convention} {mode.name} {cc.family} {cc.cell.describe()}"
        if seed is not None or derandomized:
            cell_seed = zlib.crc32(f"{cc.family} {cc.cell.describe()}".encode()) ^ (seed or 0) ^ i
            # the settings go on after the seed: @seed drops any database the settings under it named
            prop = _settings(profile, n, True, database, cell)(hypothesis_seed(cell_seed)(prop))
        else:
            prop = _settings(profile, n, False, database, cell)(prop)
        try:
            with pinned_constants():  # the examples of a seed, whatever modules this process loaded
                prop()
        except InvalidArgument as exc:
            raise Unsupported(f"no {mode.name} problems in {adapter.convention}: {exc}") from None
    tally.conclude(adapter, "problem")
    tally.summary = tally.pairs(cov)
    return tally


def _routing_note(r: gmm_ref.Routing) -> str:
    """What a routed failure was drawn on: the routing's static facts and its ids (the values are the drawn ones)."""
    with np.printoptions(threshold=200, linewidth=120):
        emap = "none" if r.expert_map is None else np.array2string(r.expert_map, separator=", ")
        return (f"{r.describe()}\ntopk_ids = {np.array2string(r.topk_ids, separator=', ')}\n"
                f"expert_map = {emap}")


def _check_routed(adapter: KernelAdapter, routing: gmm_ref.Routing, mode: Mode) -> None:
    """A routed kernel's output (per slot or combined, as its convention says) against the routed reference
    (``gmm_ref.assert_routed_matches``: the token, slot and expert of the first wrong element named); run twice
    for a deterministic kernel in a mode that asks, bit for bit."""
    __tracebackhide__ = True
    ref = adapter.reference_for(routing)
    numerics = adapter.numerics_for(routing)
    try:
        out = adapter.run(routing)
        output = adapter.convention_facts.output
        gmm_ref.assert_routed_matches(out, ref, numerics=numerics, kernel=adapter.name, output=output)
        if mode.deterministic_repeat and adapter.deterministic:
            again = adapter.run(routing)
            bits = f"u{out.dtype.itemsize}"
            differ = np.argwhere(np.ascontiguousarray(out).view(bits) != np.ascontiguousarray(again).view(bits))
            if differ.size:
                raise gmm_ref.Mismatch(f"{routed_element(routing, output, differ[0])}: a second call returned other "
                                       f"bits ({adapter.name} declares itself deterministic)", kind="determinism")
    except Exception as exc:
        exc.add_note(_routing_note(routing))
        raise


def _run_routed(adapter: KernelAdapter, mode: Mode, max_examples: int | None, profile: str | None,
                seed: int | None = None, database: ExampleDatabase | None = None,
                run: failures.CheckRun | None = None) -> _Tally:
    """Run ``mode``'s property on a routed kernel: routings drawn by ``gst.routings`` within its convention and
    declared limits (``modes.mode_routings``, :class:`Unsupported` where the mode has no routed form), each
    checked by :func:`_check_routed`. One cell (no covering design of routed relations yet)."""
    __tracebackhide__ = True
    strategy = mode_routings(adapter, mode)
    tally = _Tally()
    tally.cells = (1, 1)
    run = run if run is not None else failures.CheckRun()
    n = _budgets(max_examples, profile, adapter.max_examples, 1)[0]

    def check(routing: gmm_ref.Routing) -> None:
        __tracebackhide__ = True
        reason = adapter.supports(routing)
        if reason is not None:
            tally.declined.append(reason)
            return
        try:
            _check_routed(adapter, routing, mode)
        except Exception as exc:
            where = run.seen_before(adapter, exc)
            if where is None:
                raise
            tally.repeated.append((where, exc))
            return
        tally.checked += 1

    def routed(routing: gmm_ref.Routing) -> None:
        check(routing)

    prop = given(routing=strategy)(routed)
    cell = f"gmm-harness {adapter.name} {adapter.convention} {mode.name} routed"
    if seed is not None or profile_settings(profile).derandomize:
        prop = _settings(profile, n, True, database, cell)(hypothesis_seed(zlib.crc32(cell.encode()) ^ (seed or 0))(
            prop))
    else:
        prop = _settings(profile, n, False, database, cell)(prop)
    with pinned_constants():
        prop()
    tally.conclude(adapter, "routing")
    return tally


def check_mode(adapter: KernelAdapter, mode: Mode | str, *, family: str | None = None,
               max_examples: int | None = None, profile: str | None = None, seed: int | None = None,
               example_db: Any = None, run: failures.CheckRun | None = None) -> Result:
    """Run one mode's property on ``adapter`` (one family, or all its convention's) and say what it found.

    ``profile`` names a registered Hypothesis profile to run under (default: the
    settings in force); ``seed`` explores other examples than a derandomized
    profile's. A failure comes back as a ``FAILED`` result carrying the exception
    (a ``gmm_ref.Mismatch`` after shrinking, with a reproducer that calls the
    kernel, or what the kernel raised), or ``KNOWN_BUG`` when the kernel declares
    an upstream bug for this mode. The result's ``setting`` names the profile or seed.
    ``example_db`` (an ``ExampleDatabase``, a directory, ``redis://HOST:PORT``; default
    ``$GMM_HARNESS_EXAMPLE_DB``, else none) saves failing examples and replays them first
    (``property_tests.example_db``). ``run`` (a :class:`failures.CheckRun`) is the run this check is part of:
    an exception the kernel raised in a check it already reported is reported once, its examples not shrunk
    again; default: a run of this check alone.
    """
    mode = mode_of(mode)
    run = run if run is not None else failures.CheckRun()
    database = example_dbs.resolve(example_db)
    t0 = time.perf_counter()
    common = dict(kernel=adapter.name, check=mode.name, family=family,
                  setting=_run_setting(profile, seed, max_examples))
    try:
        if mode.cells:  # a routed kernel's cells are routings (property_tests.scale_routed)
            checked, left_out = (mode.cell_runner or scale.run_cells)(
                adapter, mode, family, _check_routed if adapter.routed else _check_forward)
            return Result(status=Status.PASSED, examples=checked, seconds=time.perf_counter() - t0,
                          cells=(checked, checked + sum(map(len, left_out.values()))),
                          detail=scale.cells_detail(left_out), **common)
        elif adapter.routed:  # a routed MoE kernel: routings drawn, not grouped problems
            tally = _run_routed(adapter, mode, max_examples, profile, seed, database=database, run=run)
        else:
            tally = _run_property(adapter, mode, family, max_examples, profile, seed, database=database, run=run)
    except Unsupported as exc:
        return Result(status=Status.UNSUPPORTED, detail=str(exc), seconds=time.perf_counter() - t0, **common)
    except Exception as caught:  # noqa: BLE001 - a kernel may raise anything; it is this check's failure
        exc, distinct = failures.primary(caught)
        _name_guarded_reads(adapter, exc)
        hints = failures.finish(exc, adapter, mode.name)
        where = mode.name + (f" [{family}]" if family else "")
        run.record_raised(adapter, exc, where)
        line = str(exc) if isinstance(exc, failures.Repeated) else failures.one_line(exc)
        line += f" (+{distinct - 1} other distinct failure{'s' * (distinct > 2)})" if distinct > 1 else ""
        line += "".join(f"; matches a known upstream bug of {h} (-v says which)" for h in hints)
        known = adapter.known_issue(mode.name)
        status, detail = (Status.KNOWN_BUG, f"{known} (caught: {line})") if known else (Status.FAILED, line)
        failures.note(exc, f"Checked under the {common['setting']}.")
        return Result(status=status, detail=detail, error=exc, seconds=time.perf_counter() - t0, **common)
    return Result(status=Status.PASSED, seconds=time.perf_counter() - t0, **tally.reached_fields(), **common)


def coverage(adapter: KernelAdapter, mode: Mode | str, *, family: str | None = None,
             max_examples: int | None = None, profile: str | None = None, seed: int | None = None) -> Result:
    """What :func:`check_mode` would check, without calling the kernel: the examples it would draw,
    the relations and pairs of relations they reach (``Result.coverage``, ``pairs``, ``missing``)."""
    mode = mode_of(mode)
    t0 = time.perf_counter()
    common = dict(kernel=adapter.name, check=mode.name, family=family,
                  setting=_run_setting(profile, seed, max_examples))
    if adapter.routed:
        return Result(status=Status.UNSUPPORTED, detail="routed: no covering design of routed relations yet (the "
                      "routings are drawn in one cell)", **common)
    if mode.cells:  # fixed problems, one per cell (property_tests.scale, property_tests.large): nothing drawn
        return Result(status=Status.UNSUPPORTED, detail=f"the {mode.name} mode draws no examples (one fixed problem "
                      "per cell, built for the kernel)", **common)
    try:
        tally = _run_property(adapter, mode, family, max_examples, profile, seed, dry=True)
    except Unsupported as exc:
        return Result(status=Status.UNSUPPORTED, detail=str(exc), seconds=time.perf_counter() - t0, **common)
    status = Status.PASSED if not tally.summary[1] else Status.FAILED
    detail = "" if status is Status.PASSED else f"{len(tally.summary[1])} pairs never reached"
    return Result(status=status, detail=detail, seconds=time.perf_counter() - t0, **tally.reached_fields(), **common)


def check_kernel(
    kernel: Callable[..., Any] | KernelAdapter | str,
    *,
    convention: str | None = None,
    tiling: Any = None,
    max_examples: int | None = None,
    modes: Iterable[str] | None = None,
    numerics: gmm_ref.Numerics | None = None,
    name: str | None = None,
    scope: Scope | None = None,
    profile: str | None = "gmm-ci",
    seed: int | None = None,
    raise_on_failure: bool = True,
    example_db: Any = None,
    device: str | None = None,
) -> Report:
    """Check a kernel in every mode (or ``modes``) its convention allows; one :class:`Result` per mode.

    ``kernel`` is a function taking exactly its ``convention``'s arguments (jax
    arrays for the jax conventions, torch tensors for ``torch.grouped_mm``; it
    may return a jax array, torch tensor or NumPy array), a built-in adapter
    name, ``"pkg.module:fn"`` or a ``KernelAdapter``. With ``raise_on_failure``
    (the default) the first failing mode raises its exception (a
    :class:`gmm_ref.Mismatch` after shrinking); otherwise failures are results.
    ``scope`` (a ``gmm_kernels.Scope``; a function decorated with ``gmm_kernels.declare`` brings
    its own) says what the kernel supports: exactly that is checked.
    ``profile`` names a registered Hypothesis profile (``"gmm-ci"``, the default: derandomized,
    so the same verdict every run; ``"gmm-dev"``, ``"gmm-thorough"``; None: the settings in force);
    ``seed`` explores other examples. Every result names the profile or seed it ran under.
    ``example_db`` (an ``ExampleDatabase``, a directory, ``redis://HOST:PORT``, several joined by ``,``;
    default ``$GMM_HARNESS_EXAMPLE_DB``, else none) saves every failing example and replays the saved
    ones first on every run that shares it (``property_tests.example_db``).
    ``device`` (``"auto"``, ``"cpu"``, ``"cuda"``, ``"cuda:N"``; default: the process's selection,
    ``gmm_kernels.device``, else auto) is the device a torch-convention kernel's operands are made on for
    this call; a bad value, or a CUDA device torch does not see, is a ``ValueError`` naming ``device``.

    Compilations go to the persistent compilation cache that the CLI and the pytest plugin use
    (``property_tests.compile_cache``: ``$GMM_HARNESS_COMPILE_CACHE``, else ``~/.cache/gmm-harness/jax``),
    so a shape compiled by one is loaded by the others and by later runs. It is turned on for the
    process at the first call, before the kernel runs, and only if you have not configured jax's cache
    yourself: ``JAX_COMPILATION_CACHE_DIR`` or ``jax_compilation_cache_dir`` set, or
    ``jax_enable_compilation_cache`` off, and it is left as it is. Once on, it stays on for the process
    (your own later jax compilations are cached there too); ``GMM_HARNESS_COMPILE_CACHE=off`` keeps it off.
    A ``$GMM_HARNESS_COMPILE_CACHE`` that cannot be written is a ``ValueError``.
    """
    __tracebackhide__ = True
    with contextlib.nullcontext() if device is None else devices.using(device, option="device"):
        adapter = resolve_kernel(kernel, convention=convention, tiling=tiling, numerics=numerics, name=name,
                                 scope=scope, option="kernel", convention_option="convention")
        chosen = _modes(modes)
        _check_options(max_examples, profile, seed)
        check_known_issue_modes(adapter, option="scope")
        database = example_dbs.resolve(example_db)
        compile_cache.ensure()  # the CLI's and the plugin's cache, unless jax's is yours (see above)
        why = adapter.available()
        if why:
            raise ValueError(f"kernel: {adapter.name} cannot run here, so nothing would be checked: {why}")
        results = []
        run = failures.CheckRun()  # an exception the kernel raises is reported in the first mode that finds it
        for m in chosen:
            result = check_mode(adapter, m, max_examples=max_examples, profile=profile, seed=seed, example_db=database,
                                run=run)
            if raise_on_failure and result.status is Status.FAILED:
                failures.raise_failure(result)
            results.append(result)
        if all(r.status is Status.UNSUPPORTED for r in results):
            reasons = "; ".join(f"{r.check}: {r.detail}" for r in results)
            raise ValueError(f"kernel: every mode of {adapter.name} is unsupported, so nothing was checked "
                             f"({reasons}); check its convention, tiling and declared scope")
        return Report(adapter.name, tuple(results))


def _modes(modes: Iterable[str] | None) -> list[str]:
    if modes is None:  # the default run: every mode but the opt-in ones
        return list(MODES)
    if isinstance(modes, str) or not isinstance(modes, Iterable):
        raise TypeError(f"modes: expected an iterable of mode names (some of {sorted(MODES)}), got {modes!r}")
    chosen = [mode_of(m).name for m in modes]
    if not chosen:
        raise ValueError(f"modes: expected at least one of {sorted(MODES)}, got none")
    return chosen


def check_known_issue_modes(adapter: KernelAdapter, *, option: str) -> None:
    """ValueError naming ``option`` when the kernel's declared known issues name a mode that does not exist."""
    declared = adapter.scope.known_issues if adapter.scope is not None else ()
    bad = sorted({m for issue in declared for m in issue.modes if m not in ALL_MODES})  # opt-in modes too
    if bad:
        raise ValueError(f"{option}: known_issues name the modes {bad}; expected some of {sorted(ALL_MODES)}")


def _check_options(max_examples: Any, profile: Any, seed: Any) -> None:
    if max_examples is not None and (isinstance(max_examples, bool) or not isinstance(max_examples, int)
                                     or max_examples < 1):
        raise ValueError(f"max_examples: expected a positive int or None, got {max_examples!r}")
    if profile is not None and profile not in PROFILES:
        raise ValueError(f"profile: expected one of {PROFILES} or None, got {profile!r}")
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
        raise TypeError(f"seed: expected an int or None, got {seed!r}")
