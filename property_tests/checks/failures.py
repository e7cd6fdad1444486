"""What a failing check reports: one failure (a count of the others), its one line, a reproducer that
calls the kernel, a pointer to a known upstream bug whose signature it matches, and the same
exception reported once per kernel in a run (:class:`CheckRun`).

``check_mode`` attaches a *recipe* to each failure as it happens (:func:`attach`: the problem, the
numerics, the gradient) and, once Hypothesis has shrunk it, :func:`finish` turns the recipe of the
failure it reports into a script.

The report's notes are the harness's own, composed from what it recorded, never read back out of
Hypothesis' text: the notes the checked code gave the exception by the time it left the property
(:func:`left_property`: gmm_ref's report, the kernel's own notes), the failing example in one line,
then the notes the harness added (:func:`note`), the reproducer and the known upstream bugs it
matches. What Hypothesis adds about its own test function (which a caller of ``check_kernel`` does
not have: how to replay it, which lines ran) is not part of it, whatever its wording.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import re
import time
from collections.abc import Callable
from typing import Any

import numpy as np
from hypothesis.errors import FlakyFailure, HypothesisException

import gmm_ref
from gmm_kernels import KernelAdapter, Result, Status
from gmm_kernels.known_issues import matching
from gmm_kernels.repro import kernel_reproducer
from gmm_kernels.runtimes import triton_interpreter
from gmm_ref.compare import REPRODUCE
from gmm_ref.repro import fenced

__all__ = [
    "LOGGER",
    "POSITION",
    "CheckRun",
    "Repeated",
    "attach",
    "attach_again",
    "check_again",
    "extend_recipe",
    "failed_result",
    "finish",
    "forget",
    "found_line",
    "intermittent",
    "is_flaky",
    "leaves",
    "left_property",
    "log_found",
    "name_guarded_reads",
    "note",
    "one_line",
    "poison_source",
    "poisoned_from",
    "primary",
    "raise_failure",
    "recipe",
    "recipe_problem",
    "replayed",
    "signature",
    "steadier",
]

_RECIPE = "_gmm_recipe"
#: the attribute naming a check's failure's cell (its place in the run's order: the search goes on from there)
POSITION = "_gmm_position"
_LEFT = "_gmm_left_property"  # (the exception's notes as it left the property, the problem it failed on)
_NOTES = "_gmm_notes"  # the notes the harness added since
_AGAIN = "_gmm_again"  # a callable that checks the failing example again
_INTERMITTENT = "_gmm_intermittent"  # (calls that failed, calls made) once the example was checked again
_POISON = "_gmm_poison_source"  # the regions whose NaN/Inf reached a poisoned failure's output

#: how many times a failing example is checked again to tell an intermittent failure from a steady one, and
#: the seconds those calls may take together (a slow kernel makes fewer)
AGAIN_CALLS = 20
AGAIN_SECONDS = 20.0


class Repeated(Exception):
    """The kernel raised the same exception as in a check already reported; ``str()`` says which."""


def attach(exc: BaseException, **recipe: Any) -> None:
    """Remember how to reproduce ``exc`` (problem, numerics, wrt, cotangent, determinism); the first
    recipe attached wins (the most specific one is attached closest to the failure)."""
    if getattr(exc, _RECIPE, None) is None:
        # an exception type with __slots__ takes no recipe: its report stays without a script
        with contextlib.suppress(AttributeError):
            setattr(exc, _RECIPE, recipe)


def extend_recipe(exc: BaseException, **more: Any) -> None:
    """Add ``more`` to the recipe :func:`attach` remembered for ``exc`` (the calls made before a failing one)."""
    recipe = getattr(exc, _RECIPE, None)
    if isinstance(recipe, dict):
        recipe.update(more)


def attach_again(exc: BaseException, again: Callable[[], None]) -> None:
    """Remember how to check ``exc``'s example again (``again()`` raises as the check did, or returns when the
    call passes); the first attached wins."""
    if getattr(exc, _AGAIN, None) is None:
        with contextlib.suppress(AttributeError):
            setattr(exc, _AGAIN, again)


def is_flaky(exc: BaseException) -> bool:
    """Whether Hypothesis found ``exc`` (or a failure grouped in it) failing on one run of its example and
    passing on another."""
    if isinstance(exc, FlakyFailure):
        return True
    group = getattr(exc, "exceptions", None)
    return isinstance(group, (list, tuple)) and any(is_flaky(e) for e in group if isinstance(e, BaseException))


def _recheck(exc: BaseException, clock: Callable[[], float]) -> tuple[int, int] | None:
    """(calls that failed, calls made) of ``exc``'s example checked again (:data:`AGAIN_CALLS` calls, or fewer
    within :data:`AGAIN_SECONDS`); None for a failure with no example to check, a failure of one call compared
    with another (two runs that differ) and a kernel that tampered with the harness."""
    again = getattr(exc, _AGAIN, None)
    if again is None or getattr(exc, "kind", None) in ("determinism", "tampered"):
        return None
    failed = made = 0
    start = clock()
    while made < AGAIN_CALLS and (made == 0 or clock() - start < AGAIN_SECONDS):
        made += 1
        try:
            again()
        except Exception as other:  # noqa: BLE001 - any failure of the kernel counts, as it did the first time
            # of the same call of the example: a later call's failure does not make the report's steady
            mine, its = _calls_before(exc), _calls_before(other)
            failed += mine is None or its is None or mine == its
    return failed, made


def _calls_before(exc: BaseException) -> int | None:
    """How many calls of one shape came before ``exc``'s failing call in its example (None: not known)."""
    made = recipe(exc)
    if made is None:
        return None
    return len(made.get("before", ()) or made.get("before_routings", ()))


def check_again(exc: BaseException, *, flaky: bool, clock: Callable[[], float] = time.perf_counter) -> bool:
    """Check the shrunk failure ``exc``'s example again (:func:`_recheck`); if some calls pass, or Hypothesis saw
    it pass (``flaky``), mark ``exc`` intermittent with the count and return True."""
    counted = _recheck(exc, clock)
    if counted is None:
        return False
    failed, made = counted
    # Hypothesis' own calls of the example: its last one failed (the report's); with ``flaky``, one also passed
    failed, made = failed + 1, made + (2 if flaky else 1)
    if failed == made:
        return False
    with contextlib.suppress(AttributeError):
        setattr(exc, _INTERMITTENT, (failed, made))
    # a failure of a later call is no longer blamed on the calls before it: the same calls also passed
    exc.__notes__ = [n for n in getattr(exc, "__notes__", []) if not n.startswith(_REPLAY_NOTE)]
    note(exc, f"Intermittent: the same problem failed {failed} of {made} calls (the report is of one that failed); "
              "a race, uninitialized memory or state kept between calls? The reproducer calls it until it fails.")
    return True


def steadier(shrunk: BaseException, first: BaseException | None,
             clock: Callable[[], float] = time.perf_counter) -> BaseException | None:
    """``first`` (the check's first failing example, before shrinking) if it fails every time it is checked
    again while ``shrunk`` (intermittent) did not: state a kernel keeps across examples (a result kept by
    addresses an allocator handed out again) can make Hypothesis shrink to an example that failed only once,
    while the example it started from fails on every call. Else None."""
    if first is None or first is shrunk or intermittent(shrunk) is None:
        return None
    counted = _recheck(first, clock)
    if counted is None or counted[0] != counted[1]:
        return None
    failed, made = intermittent(shrunk)  # type: ignore[misc]
    note(first, f"Hypothesis' smallest failing example failed {failed} of {made} calls when checked again (state "
                f"the kernel kept from earlier examples?); this report is of the first failing example found, "
                f"which failed all {counted[1]} calls made again.")
    return first


def poisoned_from(exc: BaseException, regions: list[str]) -> None:
    """Remember the regions (in words) whose NaN/Inf reached ``exc``'s output (``poison_source``): its line says the
    first."""
    with contextlib.suppress(AttributeError):
        setattr(exc, _POISON, list(regions))


def poison_source(exc: BaseException) -> list[str]:
    """The regions :func:`poisoned_from` remembered for ``exc`` (empty: none found)."""
    return list(getattr(exc, _POISON, None) or ())


def intermittent(exc: BaseException) -> tuple[int, int] | None:
    """(calls that failed, calls made) of an intermittent failure (:func:`check_again`), else None."""
    return getattr(exc, _INTERMITTENT, None)


def replayed(before: tuple[Any, ...]) -> dict[str, Any]:
    """The recipe's part for a call made after others on the same kernel with the same shapes (``Mode.replays``):
    the group sizes of those calls, in order (nothing for a first call)."""
    return {"before": tuple(np.asarray(b).tolist() for b in before)} if before else {}


_REPLAY_NOTE = "Call "
#: what a later call of one shape failing says may be wrong
_KEPT = ("stale group sizes or contents of an earlier call (a plan kept by shape, a result kept by the buffers' "
         "addresses, a replayed graph)")


def replay_note(problem: Any, before: tuple[Any, ...]) -> str:
    """The report's line for a failing call made after ``before`` (their group sizes) with ``problem``'s shapes."""
    sizes = [np.asarray(b).tolist() for b in before]
    return (f"{_REPLAY_NOTE}{len(before) + 1} (draw {len(before)}) of one shape, in the same buffers with new "
            f"contents, on the same kernel: the calls before it passed with group sizes "
            f"{', '.join(map(str, sizes))}; this one, with {np.asarray(problem.group_sizes).tolist()}, failed: "
            f"{_KEPT}? The reproducer makes the calls before it.")


def recipe(exc: BaseException) -> dict[str, Any] | None:
    """What :func:`attach` remembered for ``exc`` (problem, numerics, ...), or None."""
    return getattr(exc, _RECIPE, None)


def recipe_problem(exc: BaseException, default: Any) -> Any:
    """The problem ``exc`` was attached to (:func:`attach`), else ``default``."""
    return (getattr(exc, _RECIPE, None) or {}).get("problem", default)


def _replay_line(recipe: dict[str, Any], pick: str) -> str:
    """``pick`` prefixed, for a failure of a later call with the shapes of the first, by what came before."""
    before = recipe.get("before")
    if not before:
        return pick
    sizes = np.asarray(recipe["problem"].group_sizes).tolist()
    return (f"call {len(before) + 1} (draw {len(before)}) of one shape in the same buffers: {pick} [group sizes "
            f"{sizes}; the first call's {before[0]} passed: {_KEPT}?]")


def left_property(exc: BaseException, problem: Any) -> None:
    """``exc`` leaves the property on ``problem``: what notes it has now are the checked code's (Hypothesis adds
    its own afterwards); the report keeps these and its own (:func:`finish`)."""
    if getattr(exc, _LEFT, None) is None:
        with contextlib.suppress(AttributeError):
            setattr(exc, _LEFT, (tuple(getattr(exc, "__notes__", ())), problem))


def note(exc: BaseException, text: str) -> None:
    """Add the harness's note ``text`` to ``exc`` (and to its record, from which :func:`finish` composes the
    report)."""
    exc.add_note(text)
    with contextlib.suppress(AttributeError):
        if getattr(exc, _NOTES, None) is None:
            setattr(exc, _NOTES, [])
        getattr(exc, _NOTES).append(text)


def forget(exc: BaseException) -> None:
    """Drop what :func:`attach` remembered (a huge problem need not outlive its report)."""
    with contextlib.suppress(AttributeError):
        delattr(exc, _RECIPE)


# --------------------------------------------------------------- one failure
def leaves(exc: BaseException) -> list[BaseException]:
    """The failures in ``exc``: itself, or those of the group Hypothesis raises when it found several."""
    group = getattr(exc, "exceptions", None)
    if isinstance(group, (list, tuple)) and group and all(isinstance(e, BaseException) for e in group):
        return [leaf for e in group for leaf in leaves(e)]
    return [exc]


def primary(exc: BaseException) -> tuple[BaseException, int]:
    """(the failure to report, how many distinct failures Hypothesis found). Hypothesis raises a group
    when it found several; the first mismatch of the group stands for it, with a note listing the others."""
    found = leaves(exc)
    if len(found) == 1:
        return found[0], 1
    first = next((e for e in found if isinstance(e, gmm_ref.Mismatch)), found[0])
    note(first, f"Hypothesis found {len(found)} distinct failures; this is one of them. The others:\n"
         + "\n".join(f"  - {one_line(e)}" for e in found if e is not first))
    return first, len(found)


def one_line(exc: BaseException) -> str:
    """The most telling line of a failure: the gradient, then the first wrong group or tail, else the
    criterion or shape line, else the first line; a kernel's own exception keeps its type."""
    lines = [ln.strip() for ln in str(exc).splitlines() if ln.strip()]
    pick = next((ln for ln in lines if ln.startswith(("group ", "tail "))), None)
    if pick is None:
        pick = next((ln for ln in lines if ln.startswith(("shape/dtype", "Not equal", "non-finite"))),
                    lines[0] if lines else "")
    wrt = (getattr(exc, _RECIPE, None) or {}).get("wrt")
    if isinstance(exc, gmm_ref.Mismatch) and wrt:
        pick = f"d/d{wrt}: {pick}"
    if poison_source(exc):
        pick += f" (NaN/Inf from {poison_source(exc)[0]})"
    if intermittent(exc) is None:  # (an intermittent failure is not the earlier calls' doing)
        pick = _replay_line(getattr(exc, _RECIPE, None) or {}, pick)
    if not isinstance(exc, gmm_ref.Mismatch):  # the kernel's own exception (an AssertionError of its own too)
        pick = f"{type(exc).__name__}: {pick}"
        problem = (getattr(exc, _RECIPE, None) or {}).get("problem")
        if problem is not None:  # what provoked it: the (shrunk) problem, group sizes included
            what = problem.describe()
            pick += f" [on {what if len(what) <= 400 else what[:397] + '...'}]"
    return pick


def raise_failure(result: Any) -> None:
    """Raise a failed result's error as the documented ``gmm_ref.Mismatch`` (kind ``"raised"`` when the
    kernel raised, chained to what it raised, with its notes); return if it did not fail."""
    __tracebackhide__ = True
    err = result.error
    if result.ok or err is None:
        return
    if isinstance(err, gmm_ref.Mismatch):
        raise err
    stale = triton_interpreter.explain(err)  # a Triton kernel compiled for a GPU that is not here
    if stale is not None:
        raise stale from err
    exc = gmm_ref.Mismatch(f"kernel {result.kernel} / {result.check}: {result.detail}", kind="raised")
    for note in getattr(err, "__notes__", []):
        exc.add_note(note)
    raise exc from err


# --------------------------------------------------------------- the report
def _own_notes(exc: BaseException) -> list[str]:
    """The notes of the checked code and the harness: those ``exc`` had when it left the property, its failing
    example, and the harness's since. An exception that never left the property (Hypothesis' own error) keeps
    its notes."""
    left = getattr(exc, _LEFT, None)
    if left is None:
        return list(getattr(exc, "__notes__", ()))
    notes, problem = left
    return [*notes, f"Failing example: {problem!r}", *getattr(exc, _NOTES, ())]


def finish(exc: BaseException, adapter: KernelAdapter, mode: str) -> list[str]:
    """Give ``exc`` the harness's report as its notes (:func:`_own_notes` and a reproducer); the known upstream
    bugs (one line each) whose signature the failure matches, also added as notes."""
    recipe = getattr(exc, _RECIPE, None)
    notes = _own_notes(exc)
    if recipe is not None:
        notes = [n for n in notes if not n.startswith(REPRODUCE)]
        try:
            script = kernel_reproducer(adapter, **recipe, until_it_fails=intermittent(exc))
        except OSError as err:  # no writable place for the inputs: say so, keep the report
            notes.append(f"No reproducer: {err}")
        else:
            notes.append(REPRODUCE + fenced(script))
    hints = []
    if recipe is not None and isinstance(recipe["problem"], gmm_ref.Problem):  # a routing's kernels call none
        for issue in matching(adapter, mode, exc, recipe["problem"]):
            hints.append(issue.primitive)
            what = (f"torch's {issue.primitive} operator" if issue.primitive.startswith("aten.")
                    else f"jax's {issue.primitive} primitive")
            notes.append(f"This failure matches a known upstream bug of {what}, which {adapter.name} calls: "
                         f"{issue.describe()}")
    exc.__notes__ = notes
    return hints


# ------------------------------------------------------- the same exception
def signature(exc: BaseException) -> str:
    """An exception's type and first line, digits masked: what makes two of a kernel's exceptions the same."""
    first = next((ln.strip() for ln in str(exc).splitlines() if ln.strip()), "")
    return f"{type(exc).__qualname__}: {re.sub(r'[0-9]+', '#', first)}"


class CheckRun:
    """What one run remembers across its checks (``check_kernel``'s modes, a worker's cells, a pytest session's
    tests): the exceptions each kernel, by name, raised in a check already reported. The run holds it; the
    kernels it checks are not changed."""

    def __init__(self, announce: Callable[[str, str, str], None] | None = None) -> None:
        #: (kernel name, the exception's signature) -> (the check that reported it, its one line)
        self._reported: dict[tuple[str, str], tuple[str, str]] = {}
        #: ``announce(kernel, where, line)``: told of a check's first failing example as soon as it is found,
        #: before Hypothesis shrinks it (default: :func:`log_found`)
        self.announce = announce if announce is not None else log_found
        self._found: set[tuple[str, str]] = set()
        #: the first failing example of the search now running, before shrinking (:func:`steadier`)
        self.first: BaseException | None = None
        #: the wrong outputs the check now running already reported, by kind: it goes on looking for another cause
        self._wrong: dict[str, str] = {}

    def found(self, adapter: KernelAdapter, mode: str, where: str, exc: BaseException) -> None:
        """A check of ``mode`` (``where``: ``MODE`` or ``FAMILY / MODE``) of the kernel has a failing example:
        announce its first one, once a check and before shrinking (the report, shrunk, follows when the check
        ends). Hypothesis' own control flow (an ``assume``) is no failure, and a mode the kernel declares a known
        upstream bug in is no failure to announce (its verdict is the known bug)."""
        if isinstance(exc, HypothesisException):
            return
        if self.first is None:
            self.first = exc
        if (adapter.name, where) in self._found:
            return
        with contextlib.suppress(Exception):
            if adapter.known_issue(mode):
                return
        self._found.add((adapter.name, where))
        with contextlib.suppress(Exception):  # an announcement never changes a verdict
            self.announce(adapter.name, where, one_line(exc))

    def record_raised(self, adapter: KernelAdapter, exc: BaseException, where: str) -> None:
        """The kernel raised ``exc`` (not a mismatch) in the check ``where``: later checks of the same kernel in
        this run skip the examples that raise it again (still checking the others) and say so in one line."""
        if not isinstance(exc, (gmm_ref.Mismatch, Repeated)):
            self._reported.setdefault((adapter.name, signature(exc)), (where, one_line(exc)))

    def look_past(self, exc: BaseException, where: str) -> None:
        """The check now running (``where``) reported the wrong output ``exc``: its other examples of that kind are
        no longer failures of it, until :meth:`check_ended`."""
        if isinstance(exc, gmm_ref.Mismatch):
            self._wrong.setdefault(exc.kind, where)

    def check_ended(self) -> None:
        """The check now running ended: a wrong output is a failure again (another check's verdict is its own)."""
        self._wrong.clear()
        self.first = None

    def seen_before(self, adapter: KernelAdapter, exc: BaseException) -> str | None:
        """If ``exc`` is an exception the kernel already raised in a check this run reported, or a wrong output of
        a kind the check now running reported, that check's name."""
        if isinstance(exc, gmm_ref.Mismatch):
            return self._wrong.get(exc.kind)
        found = self._reported.get((adapter.name, signature(exc)))
        return None if found is None else found[0]


def failed_result(adapter: KernelAdapter, mode: str, caught: BaseException, run: CheckRun, common: dict[str, Any],
                  t0: float, explain: Callable[[KernelAdapter, BaseException, str], None] | None = None) -> Result:
    """The result of a check that raised ``caught``: its failure shrunk, checked again, named and reported;
    ``explain(adapter, failure, mode)`` adds what reruns of the example tell (``poison_source``)."""
    exc, distinct = primary(caught)
    known = adapter.known_issue(mode)
    first, run.first = run.first, None  # the next search has a first failure of its own
    # the failing example checked again: one that also passes is intermittent, whatever Hypothesis saw
    flaky = not known and not isinstance(exc, Repeated) \
        and check_again(exc, flaky=is_flaky(caught))
    if flaky and distinct == 1 and (steady := steadier(exc, first)) is not None:
        exc, flaky = steady, False
    if explain is not None and not isinstance(exc, Repeated) and not flaky:
        with contextlib.suppress(Exception):  # an explanation never changes a verdict
            explain(adapter, exc, mode)
    name_guarded_reads(adapter, exc)
    hints = finish(exc, adapter, mode)
    family = common["family"]
    run.record_raised(adapter, exc, mode + (f" [{family}]" if family else ""))
    line = str(exc) if isinstance(exc, Repeated) else one_line(exc)
    line += f" (+{distinct - 1} other distinct failure{'s' * (distinct > 2)})" if distinct > 1 else ""
    line += "".join(f"; matches a known upstream bug of {h} (-v says which)" for h in hints)
    if known:
        status, detail = Status.KNOWN_BUG, f"{known} (caught: {line})"
    elif getattr(exc, "kind", None) == "tampered":
        status, detail = Status.TAMPERED, line
    elif flaky:
        failed, made = intermittent(exc)  # type: ignore[misc]
        status, detail = Status.INTERMITTENT, f"failed {failed} of {made} calls of the same problem: {line}"
    else:
        status, detail = Status.FAILED, line
    note(exc, f"Checked under the {common['setting']}.")
    return Result(status=status, detail=detail, error=exc, seconds=time.perf_counter() - t0, **common)


#: the logger :func:`log_found` writes to (its WARNING reaches stderr unless the application configures logging)
LOGGER = logging.getLogger("gmm_harness")


def found_line(kernel: str, where: str, line: str) -> str:
    """``gmm-harness: FOUND KERNEL / WHERE (shrinking it; the report follows): LINE``."""
    return f"gmm-harness: FOUND {kernel} / {where} (shrinking it; the report follows): {line[:300]}"


def log_found(kernel: str, where: str, line: str) -> None:
    """The default announcement of a failing example found (:meth:`CheckRun.found`): a WARNING of
    :data:`LOGGER`."""
    LOGGER.warning(found_line(kernel, where, line))


def name_guarded_reads(adapter: KernelAdapter, exc: BaseException) -> None:
    """Make the shrunk failure ``exc`` a ``read_out_of_bounds`` one, its first line naming the operand, where the
    guard regions tell that the kernel read outside one (``KernelAdapter.guarded_reads``: reruns of the failing
    example, once, after shrinking); else leave it."""
    if not isinstance(exc, gmm_ref.Mismatch):
        return
    out, exc.output = exc.output, None  # the output is not kept alive after this
    problem = recipe_problem(exc, None)
    if out is None or not isinstance(problem, gmm_ref.Problem):  # the guards' reruns take a grouped problem only
        return
    lines = adapter.guarded_reads(problem, out, exc.comparison.bad)
    if lines:
        message = f"kernel {adapter.name} read out of bounds: " + "; ".join(lines) + "\n" + str(exc)
        exc.args = (message,)
        exc.comparison = dataclasses.replace(exc.comparison, kind="read_out_of_bounds", message=message)
