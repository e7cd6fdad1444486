"""The run policy of a kernel's checks, one for every front-end: the main job's worker, ``check_kernel`` and the
pytest plugin's kernel checks all run their checks through :func:`run_checks`.

Each check runs once in the order given (the most likely to fail first: :func:`mode_order`); with fail-fast, the
checks after the first failure are not run. Then, while the kernel's time budget lasts, rounds of new examples go
over the checks that passed, round ``r`` (the first run is round 1) under seed ``first + (r - 1) *
ROUND_SEED_STEP``. What a check's outcome is (a table cell, a mode's ``Result``) and how a round's outcome joins
the ones before it is the front-end's, given as an :class:`Outcomes`.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Hashable, Iterable, Iterator, Mapping
from typing import Generic, Protocol, TypeVar

from property_tests.checks.tiers import ROUND_SEED_STEP

__all__ = ["LINE_WIDTH", "RUN_ORDER", "Outcomes", "known_bugs_not_caught", "mode_order", "round_seed", "run_checks",
           "run_rank", "shorten", "spend_rounds"]

U = TypeVar("U", bound=Hashable)  # what is checked: a table cell, a mode's name
R = TypeVar("R")  # what a check found


#: the order a run checks a kernel's modes in: the modes that caught the most kernels of the project's
#: broken-kernel corpus first, so a broken kernel's first failure comes early (``benchmarks/mode_order.py``
#: measures it; docs/speed.md gives the figures); the table keeps the order of ``modes.MODES``. A mode not
#: named here runs after these.
RUN_ORDER: tuple[str, ...] = ("poisoned", "many_groups", "grad", "out_dtype", "normal", "wide", "exact", "graph",
                              "real_k", "strided", "scale", "all_empty", "sharded", "sharded_existing")


#: the width of a one-line report: a table cell's note, a ``gmm-harness: FAIL`` line, a known bug named in a note
LINE_WIDTH = 110


def shorten(text: str) -> str:
    """``text``, cut to :data:`LINE_WIDTH` at a word's end (ending in ``...`` where it was cut; mid-word only where
    no space lies in its second half)."""
    if len(text) <= LINE_WIDTH:
        return text
    cut = text[: LINE_WIDTH - 3]
    space = cut.rfind(" ")
    return (cut[:space].rstrip(" ,;:([") if space > LINE_WIDTH // 2 else cut) + "..."


def run_rank(mode: str) -> int:
    """Where ``mode`` runs in :data:`RUN_ORDER` (a mode not named there: after all of them)."""
    return RUN_ORDER.index(mode) if mode in RUN_ORDER else len(RUN_ORDER)


class Outcomes(Protocol, Generic[U, R]):
    """What the policy needs to know of a front-end's outcomes."""

    def failed(self, outcome: R) -> bool:
        """Whether ``outcome`` is a failure (fail-fast stops there)."""

    def extendable(self, outcome: R) -> bool:
        """Whether a round of new examples may follow ``outcome`` (a passed check that draws examples)."""

    def add_round(self, before: R, new: R, r: int, seed: int) -> R | None:
        """Round ``r``'s outcome ``new`` (under ``seed``) joined to ``before``; None: the round changes nothing
        and the check takes no more rounds."""


def round_seed(first: int, r: int) -> int:
    """The seed of round ``r`` (>= 2) of a time budget whose rounds start from ``first``."""
    return first + (r - 1) * ROUND_SEED_STEP


def mode_order(modes: Iterable[str]) -> list[str]:
    """``modes`` in the order a run checks them: the most likely to fail first (:data:`RUN_ORDER`; names outside
    it, such as the goldens, last, in the order given)."""
    return sorted(modes, key=run_rank)


def _nothing(unit: object, extra: bool) -> None:
    return None


def run_checks(units: Iterable[U], check: Callable[[U, int | None], R], outcomes: Outcomes[U, R], *,
               seed: int | None = None, left_out: Callable[[U, U], R] | None = None, deadline: float | None = None,
               rounds_from: int | None = None, clock: Callable[[], float] = time.time,
               started: Callable[[U, bool], None] = _nothing) -> Iterator[tuple[U, R, bool]]:
    """Each unit once (``check(unit, seed)``, after ``started(unit, False)``), then, until ``clock()`` reaches
    ``deadline``, the rounds of :func:`spend_rounds` (after ``started(unit, True)``), starting from
    ``rounds_from`` (default: ``seed``, or 0). Yields ``(unit, outcome, extra)``, ``extra`` for a round's revision
    of a unit already yielded. With ``left_out`` (fail-fast) the units after the first failure are yielded as
    ``left_out(unit, failure)``, not run, and no round follows."""
    done: dict[U, R] = {}
    failure: U | None = None
    for unit in units:
        if failure is not None:
            yield unit, left_out(unit, failure), False
            continue
        started(unit, False)
        done[unit] = check(unit, seed)
        yield unit, done[unit], False
        if left_out is not None and outcomes.failed(done[unit]):
            failure = unit
    if deadline is None or failure is not None:
        return
    first = rounds_from if rounds_from is not None else (seed or 0)
    for unit, outcome in spend_rounds(done, check, outcomes, deadline=deadline, first=first, clock=clock,
                                      started=lambda u: started(u, True)):
        yield unit, outcome, True


def spend_rounds(done: Mapping[U, R], check: Callable[[U, int | None], R], outcomes: Outcomes[U, R], *,
                 deadline: float, first: int, clock: Callable[[], float] = time.time,
                 started: Callable[[U], None] = lambda unit: None) -> Iterator[tuple[U, R]]:
    """Rounds of new examples over the extendable outcomes of ``done`` until ``clock()`` reaches ``deadline``:
    round after round, each such unit checked again under the round's seed (:func:`round_seed` from ``first``)
    and joined to what it had (``Outcomes.add_round``), until the time is up or it stops being extendable (a
    failure names its round). Yields each unit's joined outcome. The first round already ran: it alone reaches
    every pair of relations; the rounds only add examples."""
    live = {unit: o for unit, o in done.items() if outcomes.extendable(o)}
    r = 1
    while live and clock() < deadline:
        r += 1
        s = round_seed(first, r)
        for unit in list(live):
            if clock() >= deadline:
                break
            started(unit)
            joined = outcomes.add_round(live[unit], check(unit, s), r, s)
            if joined is not None and outcomes.extendable(joined):
                live[unit] = joined
            else:
                del live[unit]
            if joined is not None:
                yield unit, joined


def known_bugs_not_caught(kernel: str, declared: Mapping[str, str], passed: Mapping[str, Iterable[bool]],
                          ) -> dict[str, str]:
    """The modes in which ``kernel`` declares a known upstream bug (``declared``: mode -> the bug) but every outcome
    passed (``passed``: mode -> whether each of its outcomes passed, one per family or one for the mode; a mode
    with none, or with one known bug, failure or n/a among them, is not), each with the note its outcomes fail with.

    A declared bug must still be caught, or the harness passes in silence where it stopped catching it; only for
    runs whose examples are the same every run (``tiers.SAME_EVERY_RUN``, no seed, no example count given), where
    a pass means the bug is gone. The main job's table and ``check_kernel`` apply it; the pytest plugin's checks
    are strict xfails, which pytest fails the same way."""
    found = {}
    for mode, bug in declared.items():
        outcomes = list(passed.get(mode, ()))
        if outcomes and all(outcomes):
            found[mode] = (f"declared known upstream bug not caught: every family passed the {mode} mode, where "
                           f"{kernel} declares {shorten(bug)!r}; if upstream fixed it, narrow the versions it is "
                           "known on (gmm_kernels.known_issues), else the harness stopped catching it")
    return found
