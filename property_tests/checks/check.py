"""Check a kernel against the reference: one mode (:func:`check_mode`) or every mode (:func:`check_kernel`).

Each mode is a Hypothesis property (``property_tests.checks.modes``); a failure is
shrunk and reported as a ``gmm_ref.Mismatch`` carrying the report and a
reproducer. Both functions return the result model of ``gmm_kernels.results``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import time
import zlib
from collections.abc import Callable, Iterable
from typing import Any

import numpy as np
from hypothesis import assume, event, given
from hypothesis import seed as hypothesis_seed
from hypothesis.database import ExampleDatabase
from hypothesis.errors import InvalidArgument

import gmm_ref
from gmm_kernels import KernelAdapter, Report, Result, Scope, Status, resolve_kernel
from gmm_kernels.repro import contents_shift
from gmm_kernels.runtimes import compile_cache
from gmm_kernels.sandbox import cuda_graph, host, recycle, tamper
from gmm_kernels.sandbox import device as devices
from property_tests.checks import causes, cell_order, engine, failures, scale, tiers
from property_tests.checks import example_db as example_dbs
from property_tests.checks.explain import explain
from property_tests.checks.modes import ALL_MODES, MODES, Mode, Unsupported, mode_covering, mode_of, routed_plan
from property_tests.checks.profiles import DEFAULT as DEFAULT_PROFILE
from property_tests.checks.profiles import PROFILES, pinned_constants
from property_tests.checks.profiles import profile as profile_settings
from property_tests.checks.routed_run import check_routed, run_routed
from property_tests.checks.tally import Tally
from property_tests.checks.tiers import Tier, budgets, cell_settings, chosen, run_setting
from property_tests.strategies.design import observe
from property_tests.strategies.problems import Covering, replay_refusal, replays

__all__ = ["MODE_RESULTS", "ModeResults", "check_example", "check_kernel", "check_mode", "cotangent_for", "coverage"]


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


def renewed(problems: tuple[gmm_ref.Problem, ...]) -> tuple[gmm_ref.Problem, ...]:
    """``problems`` (one shape, several group-size vectors) as a kernel gets them one after the other: call ``i``'s
    operands the first call's with their elements rotated by ``contents_shift(i)`` places (the same values, so
    the same value class: the second call has the first's contents, the later ones new contents), and then the
    last call's group sizes once more with new contents (a result kept by the buffers' addresses and the group
    sizes shows only there)."""
    first = problems[0]
    calls = (*problems, problems[-1]) if len(problems) > 1 else problems

    def call(i: int, p: gmm_ref.Problem) -> gmm_ref.Problem:
        if (shift := contents_shift(i)) == 0:
            return p
        return p.replace(lhs=np.roll(first.lhs, shift), rhs=np.roll(first.rhs, shift))  # (rolled flat, same shape)

    return tuple(call(i, p) for i, p in enumerate(calls))


def _check_calls(adapter: KernelAdapter, problems: tuple[gmm_ref.Problem, ...], mode: Mode) -> None:
    """The forward result of each problem, called in turn on the same adapter (``Mode.replays``: one shape,
    several group-size vectors, and new contents, :func:`renewed`) in the same buffers at the same addresses
    (``sandbox.recycle``: an output buffer holds the previous call's answer); a failure of a later call names the
    calls before it (its reproducer makes them)."""
    __tracebackhide__ = True
    if len(problems) > 1:
        problems = renewed(problems)
    with recycle.recycling() if len(problems) > 1 else contextlib.nullcontext():
        for i, problem in enumerate(problems):
            _check_forward(adapter, problem, mode, before=tuple(p.group_sizes for p in problems[:i]))
    if len(problems) > 1 and adapter.convention_facts.framework == "torch" and devices.on_cuda():
        if host.hosted(adapter):  # a capture here would record none of the kernel's work: it runs elsewhere
            raise cuda_graph.NotCapturable("runs in a process of its own, where its CUDA graph capture is not made "
                                           "yet (its eager calls in the same buffers passed; --in-process captures "
                                           "it)")
        _check_graph_replays(adapter, problems)


def check_example(adapter: KernelAdapter, mode: Mode, problems: tuple[gmm_ref.Problem, ...]) -> None:
    """Check one example of ``mode`` on ``adapter`` (``problems``: one, or ``Mode.replays`` of one shape): raises
    what the kernel got wrong; ``NotImplementedError`` for a gradient it does not have, ``NotCapturable`` for a
    call a CUDA graph cannot capture."""
    __tracebackhide__ = True
    if mode.gradient:
        _check_gradients(adapter, problems[0])
    else:
        _check_calls(adapter, problems, mode)


def _check_graph_replays(adapter: KernelAdapter, problems: tuple[gmm_ref.Problem, ...]) -> None:
    """On a CUDA device, the calls again as replays of one captured CUDA graph (``gmm_kernels.sandbox.cuda_graph``);
    ``cuda_graph.NotCapturable`` where the call cannot be captured (the property declines the problem)."""
    __tracebackhide__ = True

    def attach(exc: BaseException, problem: gmm_ref.Problem, replay: int) -> None:
        before = tuple(p.group_sizes for p in problems[:replay - 1])
        failures.attach(exc, problem=problem, numerics=adapter.numerics_for(problem), **failures.replayed(before))

    cuda_graph.check_replays(adapter, problems, capture=cuda_graph.cuda_capture, on_failure=attach)


def _check_forward(adapter: KernelAdapter, problem: gmm_ref.Problem, mode: Mode, before: tuple = ()) -> None:
    __tracebackhide__ = True
    numerics = adapter.numerics_for(problem)
    try:
        with tamper.sealed(problem, adapter.name):
            out = adapter.run(problem)
        # from the harness's own problem (quantized as the kernel declares), once the kernel has returned: no frame
        # the kernel could walk while it ran held the expected answer
        ref = adapter.reference_for(problem)
        try:
            gmm_ref.assert_matches_reference(out, ref, numerics=numerics, kernel=adapter.name)
        except gmm_ref.Mismatch as exc:
            exc.output = out  # for failures.name_guarded_reads, once shrunk
            raise
        if mode.deterministic_repeat and adapter.deterministic:
            gmm_ref.assert_deterministic(out, adapter.run(problem), ref, kernel=adapter.name)
    except Exception as exc:
        failures.attach(exc, problem=problem, numerics=numerics,
                        determinism=getattr(exc, "kind", None) == "determinism", **failures.replayed(before))
        if before:
            exc.add_note(failures.replay_note(problem, before))
        raise


def _cell_property(adapter: KernelAdapter, mode: Mode, cov: Covering, tally: Tally, run: failures.CheckRun,
                   dry: bool = False, drawn: bool = False, where: str = "") -> Callable[..., None]:
    check = _cell_check(adapter, mode, cov, tally, run, dry, where or mode.name)

    # what Hypothesis runs: short, for Hypothesis digests its source for the example database's key
    def cell(problem: tuple[gmm_ref.Problem, ...]) -> None:
        check(problem)

    if not drawn:
        return cell
    first = [True]

    # ``drawn``: Hypothesis' first example of a run is its simplest (degenerate group sizes, the first of every
    # choice); a tier of one example a cell sets it aside (assume: not counted) and checks a drawn one
    def drawn_cell(problem: tuple[gmm_ref.Problem, ...]) -> None:
        if first and first.pop():
            assume(False)
        check(problem)

    return drawn_cell


def _cell_check(adapter: KernelAdapter, mode: Mode, cov: Covering, tally: Tally, run: failures.CheckRun,
                dry: bool, where: str) -> Callable[[tuple[gmm_ref.Problem, ...]], None]:
    def prop(problems: tuple[gmm_ref.Problem, ...]) -> None:
        __tracebackhide__ = True
        try:
            one(problems)
        except Exception as exc:
            # its notes so far are the checked code's, not Hypothesis'
            failures.left_property(exc, failures.recipe_problem(exc, problems[0]))
            failures.attach_again(exc, lambda: check_example(adapter, mode, problems))
            tally.evidence.add(problems[0], exc)
            run.found(adapter, mode.name, where, exc)  # said now, before shrinking
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
            check_example(adapter, mode, problems)
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
            tally.evidence.add(problem, exc)
            return
        tally.count(problem, seen, relations)
        tally.evidence.add(problem)

    return prop


def _run_property(adapter: KernelAdapter, mode: Mode, family: str | None, max_examples: int | None,
                  profile: str | None, seed: int | None = None, dry: bool = False,
                  database: ExampleDatabase | None = None, run: failures.CheckRun | None = None,
                  tier: Tier | None = None, evidence: causes.Evidence | None = None, start: int = 0) -> Tally:
    """Run the mode's property over every cell of its covering design (``tier``'s examples a cell, in its order),
    from its ``start``-th cell in that order; ``evidence`` counts what each example did.
    Raises the (shrunk) failure of the first failing cell (its place in the order as ``failures.POSITION``), or
    :class:`failures.Repeated` when examples raised only an exception ``run`` already reported for the kernel, or
    :class:`Unsupported`."""
    __tracebackhide__ = True
    try:
        cov = mode_covering(adapter, mode, family)
    except InvalidArgument as exc:  # the strategies cannot draw this mode for this convention
        raise Unsupported(f"no {mode.name} problems in {adapter.convention}: {exc}") from None
    tally = Tally(evidence)
    run = run if run is not None else failures.CheckRun()
    derandomized = profile_settings(profile).derandomize
    per_cell = budgets(max_examples, profile, adapter.max_examples, len(cov.cells),
                       tier.per_cell if tier is not None else None)
    tally.cells = (len(per_cell), len(cov.cells))
    ordered = cell_order.order([c.cell for c in cov.cells]) if tier is not None and tier.ordered_cells \
        else range(len(cov.cells))
    drawn = tier is not None and tier.per_cell is not None and database is None  # a replay comes first otherwise
    for position, (i, n) in enumerate(zip(ordered, per_cell, strict=False)):  # i: the cell's place (its seed)
        if position < start:
            continue
        cc = cov.cells[i]
        # a tuple of problems: one, or one shape with Mode.replays group-size vectors
        prop = given(problem=replays(cov, cc, mode.replays))(_cell_property(
            adapter, mode, cov, tally, run, dry, drawn=drawn and n == 1,
            where=f"{cc.family} / {mode.name}" if cc.family else mode.name))
        cell = f"gmm-harness {adapter.name} {adapter.convention} {mode.name} {cc.family} {cc.cell.describe()}"
        if seed is not None or derandomized:
            cell_seed = zlib.crc32(f"{cc.family} {cc.cell.describe()}".encode()) ^ (seed or 0) ^ i
            # the settings go on after the seed: @seed drops any database the settings under it named
            prop = cell_settings(profile, n, True, database, cell)(hypothesis_seed(cell_seed)(prop))
        else:
            prop = cell_settings(profile, n, False, database, cell)(prop)
        try:
            with pinned_constants():  # the examples of a seed, whatever modules this process loaded
                prop()
        except InvalidArgument as exc:
            raise Unsupported(f"no {mode.name} problems in {adapter.convention}: {exc}") from None
        except Exception as exc:
            with contextlib.suppress(AttributeError):
                setattr(exc, failures.POSITION, position)
            raise
    tally.conclude(adapter, "problem")
    tally.summary = tally.pairs(cov.designs)
    return tally


def check_mode(adapter: KernelAdapter, mode: Mode | str, *, family: str | None = None,
               max_examples: int | None = None, profile: str | None = None, seed: int | None = None,
               example_db: Any = None, run: failures.CheckRun | None = None, tier: str | Tier | None = None
               ) -> Result:
    """Run one mode's property on ``adapter`` (one family, or all its convention's) and say what it found.

    ``profile`` names a registered Hypothesis profile to run under (default: the settings in force); ``tier``
    (``property_tests.checks.tiers``; a profile of a tier's name means the tier) runs under the tier's profile, its
    examples a cell and its order of the cells; ``seed`` explores other examples than a derandomized profile's.
    A failure comes back as a ``FAILED`` result carrying the exception (a ``gmm_ref.Mismatch`` after shrinking,
    with a reproducer that calls the kernel, or what the kernel raised), or ``KNOWN_BUG`` when the kernel
    declares an upstream bug for this mode. The result's ``setting`` names the tier, profile or seed.
    ``example_db`` (an ``ExampleDatabase``, a directory, ``redis://HOST:PORT``; default
    ``$GMM_HARNESS_EXAMPLE_DB``, else none) saves failing examples and replays them first
    (``property_tests.checks.example_db``). ``run`` (a :class:`failures.CheckRun`) is the run this check is part of:
    an exception the kernel raised in a check it already reported is reported once, its examples not shrunk
    again; default: a run of this check alone.
    """
    mode = mode_of(mode)
    run = run if run is not None else failures.CheckRun()
    database = example_dbs.resolve(example_db)
    t0 = time.perf_counter()
    plan = chosen(tier, profile)
    profile = plan.profile if plan is not None else profile
    common = dict(kernel=adapter.name, check=mode.name, family=family,
                  setting=run_setting(profile, seed, max_examples, plan))
    if mode.cells:  # problems built for the kernel (a routed kernel's: routings, property_tests.checks.scale_routed)
        try:
            checked, left_out = (mode.cell_runner or scale.run_cells)(
                adapter, mode, family, check_routed if adapter.routed else _check_forward)
        except Unsupported as exc:
            return Result(status=Status.UNSUPPORTED, detail=str(exc), seconds=time.perf_counter() - t0, **common)
        except Exception as caught:  # noqa: BLE001 - a kernel may raise anything; it is this check's failure
            result = failures.failed_result(adapter, mode.name, caught, run, common, t0, explain=explain)
            if not result.status.failure:  # a declared known bug, still caught: no cause of failure
                return result
            return dataclasses.replace(result, causes=(causes.cause_of(result.error, _where(mode, family)),))
        return Result(status=Status.PASSED, examples=checked, seconds=time.perf_counter() - t0,
                      cells=(checked, checked + sum(map(len, left_out.values()))), detail=scale.cells_detail(left_out),
                      **common)

    def search(evidence: causes.Evidence, start: int | None) -> Tally:
        # a search going on past a cause (``start`` given) leaves the example database alone: its examples of the
        # cause, looked past now, would pass and be dropped from it
        db = database if start is None else None
        if adapter.routed:  # a routed MoE kernel: routings drawn, not grouped problems
            return run_routed(adapter, mode, *routed_plan(adapter, mode),
                              Tally(evidence), max_examples, profile, seed, database=db, run=run, tier=plan,
                              start=start or 0)
        return _run_property(adapter, mode, family, max_examples, profile, seed, database=db, run=run,
                             tier=plan, evidence=evidence, start=start or 0)

    try:
        return _every_cause(adapter, mode, search, run, common, t0)
    finally:
        run.check_ended()  # the next check judges its wrong outputs afresh


def _where(mode: Mode, family: str | None) -> str:
    return mode.name + (f" [{family}]" if family else "")


def _every_cause(adapter: KernelAdapter, mode: Mode, search: Callable[[causes.Evidence, int | None], Tally],
                 run: failures.CheckRun, common: dict[str, Any], t0: float) -> Result:
    """Run ``search`` (the check's examples, from a cell on) until it passes; after each cause it shrinks, that
    cause is no longer a failure (``run``: the kernel's exception reported, a wrong output of its kind looked past)
    and the search goes on from the cell it was found in, for another, up to ``causes.MAX_CAUSES``."""
    evidence = causes.Evidence()
    found: list[tuple[Result, dict[str, str]]] = []  # each cause the check shrank, and its result
    extra: list[dict[str, str]] = []  # the causes shrunk beside one of those
    start: int | None = None
    while True:
        try:
            tally = search(evidence, start)
        except Unsupported as exc:
            if found:  # the cells after a cause's declined every example: the causes found stand
                break
            return Result(status=Status.UNSUPPORTED, detail=str(exc), seconds=time.perf_counter() - t0, **common)
        except Exception as caught:  # noqa: BLE001 - a kernel may raise anything; it is this check's failure
            result = failures.failed_result(adapter, mode.name, caught, run, common, t0, explain=explain)
            if isinstance(result.error, failures.Repeated) or not result.status.failure:  # reported, or a known bug
                if found:
                    break
                return dataclasses.replace(result, evidence=evidence.to_json())
            where = _where(mode, common["family"])  # type: ignore[arg-type]
            found.append((result, causes.cause_of(result.error, where)))  # type: ignore[arg-type]
            # the other distinct failures Hypothesis shrank with it are causes too, reported once
            others = [e for e in failures.leaves(caught)
                      if e is not result.error and not isinstance(e, failures.Repeated)]
            for other in others:
                failures.finish(other, adapter, mode.name)
                run.record_raised(adapter, other, where)
                extra.append(causes.cause_of(other, where))
            position = getattr(caught, failures.POSITION, None)
            if (result.status is Status.FAILED and causes.goes_on(result.error)  # type: ignore[arg-type]
                    and position is not None and len(found) < causes.MAX_CAUSES):
                for exc in (result.error, *others):
                    run.look_past(exc, where)  # type: ignore[arg-type]
                start = position
                continue
            break
        else:
            if not found:
                return Result(status=Status.PASSED, seconds=time.perf_counter() - t0, **tally.reached_fields(),
                              evidence=evidence.to_json(), **common)
            break
    return _with_causes(found, extra, evidence, t0)


def _with_causes(found: list[tuple[Result, dict[str, str]]], extra: list[dict[str, str]], evidence: causes.Evidence,
                 t0: float) -> Result:
    """The first cause's result, naming the others the check went on to find (their reports in its own)."""
    first = found[0][0]
    others = [r for r, _ in found[1:]]
    detail = first.detail
    if others:
        detail += f" (+{len(others)} other cause{'s' * (len(others) > 1)} in this check: " \
                  + "; ".join(r.detail[:200] for r in others) + ")"
        for r in others:
            failures.note(first.error, "Another cause this check found once the one above was reported:\n"  # type: ignore
                          + r.full_report())
    return dataclasses.replace(first, detail=detail, seconds=time.perf_counter() - t0,
                               causes=(*(c for _, c in found), *extra), evidence=evidence.to_json())


def coverage(adapter: KernelAdapter, mode: Mode | str, *, family: str | None = None,
             max_examples: int | None = None, profile: str | None = None, seed: int | None = None) -> Result:
    """What :func:`check_mode` would check, without calling the kernel: the examples it would draw,
    the relations and pairs of relations they reach (``Result.coverage``, ``pairs``, ``missing``)."""
    mode = mode_of(mode)
    t0 = time.perf_counter()
    common = dict(kernel=adapter.name, check=mode.name, family=family,
                  setting=run_setting(profile, seed, max_examples))
    if mode.cells:  # fixed problems, one per cell (checks.scale, checks.large): nothing drawn
        return Result(status=Status.UNSUPPORTED, detail=f"the {mode.name} mode draws no examples (one fixed problem "
                      "per cell, built for the kernel)", **common)
    try:
        if adapter.routed:
            tally = run_routed(adapter, mode, *routed_plan(adapter, mode),
                               Tally(), max_examples, profile, seed, dry=True)
        else:
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
    numerics: gmm_ref.Numerics | gmm_ref.RoutedNumerics | None = None,
    name: str | None = None,
    scope: Scope | None = None,
    profile: str | None = DEFAULT_PROFILE,
    seed: int | None = None,
    raise_on_failure: bool = True,
    example_db: Any = None,
    device: str | None = None,
    tier: str | None = None,
    budget: float | None = None,
    in_process: bool = False,
) -> Report:
    """Check a kernel in every mode (or ``modes``) its convention allows; one :class:`Result` per mode.

    ``kernel`` is a function taking exactly its ``convention``'s arguments (jax
    arrays for the jax conventions, torch tensors for ``torch.grouped_mm``; it
    may return a jax array, torch tensor or NumPy array), a built-in adapter
    name, ``"pkg.module:fn"`` or a ``KernelAdapter``. With ``raise_on_failure``
    (the default) the first failing mode raises its exception (a
    :class:`gmm_ref.Mismatch` after shrinking; the other causes that mode went on to
    find are in its notes); otherwise failures are results, and the report's
    ``causes`` lists the distinct causes over every mode, with the declaration
    that scopes out a problem the kernel may simply not take (docs/check-your-kernel.md).
    ``scope`` (a ``gmm_kernels.Scope``; a function decorated with ``gmm_kernels.declare`` brings
    its own) says what the kernel supports: exactly that is checked.
    ``tier`` names what the run checks (``property_tests.checks.tiers``, docs/speed.md): ``"gmm-quick"`` (pull
    requests: every cell of the covering designs once, what is most likely to fail first), ``"gmm-ci"``,
    ``"gmm-nightly"`` (gmm-ci, then ``budget`` seconds, default 300, of new examples seeded by the date, the
    large mode, an example database), ``"gmm-dev"``, ``"gmm-thorough"``. ``profile`` names a registered
    Hypothesis profile (``"gmm-ci"``, the default: derandomized, the same verdict every run; a tier's name means
    that tier; None: the settings in force); given with ``tier``, it must be the tier's. ``seed`` explores other
    examples. Every result names the tier, profile or seed it ran under, the report its tier. ``budget``
    (seconds, any tier) is the kernel's time: after every mode ran, rounds of new examples for its passed modes
    until it is spent (as ``gmm-harness check --budget``).
    ``example_db`` (an ``ExampleDatabase``, a directory, ``redis://HOST:PORT``, several joined by ``,``;
    default ``$GMM_HARNESS_EXAMPLE_DB``, else the tier's, else none) saves every failing example and replays
    the saved ones first on every run that shares it (``property_tests.checks.example_db``).
    ``device`` (``"auto"``, ``"cpu"``, ``"cuda"``, ``"cuda:N"``; default: the process's selection,
    ``gmm_kernels.sandbox.device``, else auto) is the device a torch-convention kernel's operands are made on for
    this call; a bad value, or a CUDA device torch does not see, is a ``ValueError`` naming ``device``.
    A ``"pkg.module:fn"`` kernel runs in a process of its own that holds no reference and no verdict
    (``gmm_kernels.sandbox.host``, docs/threat-model.md); ``in_process`` imports and calls it in this process
    instead, for a debugger (not tamper-proof).

    Compilations go to the persistent compilation cache that the CLI and the pytest plugin use
    (``gmm_kernels.runtimes.compile_cache``: ``$GMM_HARNESS_COMPILE_CACHE``, else ``~/.cache/gmm-harness/jax``), so a
    shape compiled by one is loaded by the others and by later runs. It is turned on for the process at the first
    call, before the kernel runs, unless you configured jax's cache yourself (``JAX_COMPILATION_CACHE_DIR`` or
    ``jax_compilation_cache_dir`` set, or ``jax_enable_compilation_cache`` off: left as it is); it then stays on
    for the process; ``GMM_HARNESS_COMPILE_CACHE=off`` keeps it off, and one that cannot be written is a
    ``ValueError``.
    """
    __tracebackhide__ = True
    t0 = time.perf_counter()
    with contextlib.nullcontext() if device is None else devices.using(device, option="device"):
        adapter = resolve_kernel(kernel, convention=convention, tiling=tiling, numerics=numerics, name=name,
                                 scope=scope, option="kernel", convention_option="convention", in_process=in_process)
        _check_options(max_examples, profile, seed, budget)
        plan = chosen(tier, profile, default_profile=DEFAULT_PROFILE)
        order = _modes(modes, plan)
        check_known_issue_modes(adapter, option="scope")
        database = example_dbs.resolve(tiers.example_db_spec(example_db, plan))
        compile_cache.ensure()  # the CLI's and the plugin's cache, unless jax's is yours (see above)
        why = adapter.available()
        if why:
            raise ValueError(f"kernel: {adapter.name} cannot run here, so nothing would be checked: {why}")
        seconds = budget if budget is not None else plan.budget if plan is not None else None
        run = failures.CheckRun()  # an exception the kernel raises is reported in the first mode that finds it
        kw = dict(max_examples=max_examples, profile=None if plan else profile, example_db=database, run=run,
                  tier=plan)
        results: dict[str, Result] = {}
        for m, result, _ in engine.run_checks(
                engine.mode_order(order), lambda m, s: check_mode(adapter, m, seed=s, **kw), MODE_RESULTS,
                seed=seed, deadline=t0 + seconds if seconds else None, clock=time.perf_counter,
                rounds_from=tiers.first_round_seed(plan, seed)):
            results[m] = result
            if raise_on_failure and result.status.failure:
                failures.raise_failure(result)
        if tiers.same_every_run(plan.name if plan else None, seed=seed, max_examples=max_examples):
            _fail_known_bugs_not_caught(adapter, results, raise_on_failure)
        if all(r.status is Status.UNSUPPORTED for r in results.values()):
            reasons = "; ".join(f"{r.check}: {r.detail}" for r in results.values())
            raise ValueError(f"kernel: every mode of {adapter.name} is unsupported, so nothing was checked "
                             f"({reasons}); check its convention, tiling and declared scope")
        found = causes.summarize(adapter, [(r.check, r.causes, r.evidence) for r in results.values()])
        return Report(adapter.name, tuple(results[m] for m in order), tier=plan.name if plan is not None else "",
                      causes=tuple(found))


def _fail_known_bugs_not_caught(adapter: KernelAdapter, results: dict[str, Result], raise_on_failure: bool) -> None:
    """A mode in which the kernel declares a known upstream bug, passed: a failure naming the bug."""
    __tracebackhide__ = True
    declared = {m: bug for m in results if (bug := adapter.known_issue(m))}
    passed = {m: [results[m].status is Status.PASSED] for m in declared}
    for m, note in engine.known_bugs_not_caught(adapter.name, declared, passed).items():
        results[m] = dataclasses.replace(results[m], status=Status.FAILED, detail=note,
                                         error=gmm_ref.Mismatch(f"kernel {adapter.name} / {m}: {note}",
                                                                  kind="known_bug_not_caught"))
        if raise_on_failure:
            failures.raise_failure(results[m])


class ModeResults:
    """A mode's results under the run policy (``property_tests.checks.engine``): a round adds its examples to a passed
    mode that draws examples, or fails it naming the round, its seed and the examples that passed before it."""

    def failed(self, result: Result) -> bool:
        return result.status.failure

    def extendable(self, result: Result) -> bool:
        return result.status is Status.PASSED and mode_of(result.check).draws_examples

    def add_round(self, before: Result, new: Result, r: int, seed: int) -> Result:
        if new.status.failure:  # (a failure always carries its error)
            where = f"round {r}, seed {seed}, after {before.examples} examples passed"
            failures.note(new.error, f"Found in {where} of a time budget.")  # type: ignore[arg-type]
            return dataclasses.replace(new, detail=f"{new.detail} ({where})")
        return dataclasses.replace(before, examples=before.examples + new.examples, detail=f"{r} rounds",
                                   seconds=before.seconds + new.seconds)


#: the run policy's view of a mode's results (``engine.run_checks(modes, check, MODE_RESULTS, ...)``)
MODE_RESULTS = ModeResults()


def _modes(modes: Iterable[str] | None, plan: Tier | None = None) -> list[str]:
    """The modes to check, in the order asked (the run checks them in ``engine.mode_order``): ``modes``, else the
    default ones and the tier's opt-in ones."""
    if modes is None:  # the default run: every mode but the opt-in ones (and the tier's)
        return [*MODES, *(plan.opt_in if plan is not None else ())]
    if isinstance(modes, str) or not isinstance(modes, Iterable):
        raise TypeError(f"modes: expected an iterable of mode names (some of {sorted(MODES)}), got {modes!r}")
    if not (names := [mode_of(m).name for m in modes]):
        raise ValueError(f"modes: expected at least one of {sorted(MODES)}, got none")
    return names


def check_known_issue_modes(adapter: KernelAdapter, *, option: str) -> None:
    """ValueError naming ``option`` when the kernel's declared known issues name a mode that does not exist."""
    declared = adapter.scope.known_issues if adapter.scope is not None else ()
    bad = sorted({m for issue in declared for m in issue.modes if m not in ALL_MODES})  # opt-in modes too
    if bad:
        raise ValueError(f"{option}: known_issues name the modes {bad}; expected some of {sorted(ALL_MODES)}")


def _check_options(max_examples: Any, profile: Any, seed: Any, budget: Any = None) -> None:
    if max_examples is not None and (isinstance(max_examples, bool) or not isinstance(max_examples, int)
                                     or max_examples < 1):
        raise ValueError(f"max_examples: expected a positive int or None, got {max_examples!r}")
    if profile is not None and profile not in PROFILES:
        raise ValueError(f"profile: expected one of {PROFILES} or None, got {profile!r}")
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
        raise TypeError(f"seed: expected an int or None, got {seed!r}")
    if budget is not None and (isinstance(budget, bool) or not isinstance(budget, (int, float)) or not budget > 0):
        raise ValueError(f"budget: expected a positive number of seconds or None, got {budget!r}")
