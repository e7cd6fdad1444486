"""Compute one cell of the main job's table, in its worker: a mode of a kernel's family through the checks
(:func:`run_cell`), or the kernel's goldens; and the run policy's view of cells (:data:`CELL_OUTCOMES`), whose
rounds add examples to a passed cell or fail it naming the round.

Apart from the table itself so that the main job's process, which only renders cells, never loads the checks.
"""

from __future__ import annotations

import dataclasses
import time

from gmm_kernels import KernelAdapter, Status
from golden import GoldenStore, check_goldens
from golden.cli import default_directory
from golden.judge import scope_reasons
from golden.staleness import contents
from property_tests.checks.causes import declarations
from property_tests.checks.check import check_mode
from property_tests.checks.engine import shorten
from property_tests.checks.failures import CheckRun
from property_tests.checks.modes import ALL_MODES
from property_tests.checks.tiers import DEFAULT
from property_tests.cli.outcomes import CellOutcome, FailedRound, GoldenTally
from property_tests.cli.request import WorkRequest
from property_tests.cli.shards import TableCell
from property_tests.cli.table import GOLDENS

__all__ = ["CELL_OUTCOMES", "run_cell"]


def _golden_cell(kernel: KernelAdapter, directory: str | None, require_own: bool) -> CellOutcome:
    """The goldens cell: every count says how many cases were out of the kernel's scope, and the text (the
    note, the JSON) lists each reason with its count."""
    where = directory or default_directory()
    results = check_goldens(kernel, where, require_own=require_own)
    if not results:
        held = contents(GoldenStore(where).manifest()["cases"])
        return CellOutcome(Status.UNSUPPORTED, f"no golden case of the {kernel.convention} convention in {where} "
                                               f"(it holds {held})")
    by = {s: [r for r in results if r.status is s] for s in Status}
    scope = scope_reasons(results)  # each reason with its count, most frequent first
    tally = GoldenTally(len(results), len(by[Status.PASSED]), len(by[Status.FAILED]), len(by[Status.KNOWN_BUG]),
                        tuple(scope))
    if tally.failed:
        details = tuple(f"== {kernel.name} / goldens / {r.check}\n{r.full_report()}" for r in by[Status.FAILED])
        return CellOutcome(Status.FAILED, shorten(by[Status.FAILED][0].detail), details=details, goldens=tally)
    if not tally.passed and not tally.known_bugs:
        return CellOutcome(Status.UNSUPPORTED, goldens=tally)
    if not tally.passed:
        return CellOutcome(Status.KNOWN_BUG, shorten(by[Status.KNOWN_BUG][0].detail), goldens=tally)
    return CellOutcome(Status.PASSED, goldens=tally)


def run_cell(kernel: KernelAdapter, cell: TableCell, request: WorkRequest, *, seed: int | None = None,
             run: CheckRun | None = None) -> CellOutcome:
    """One cell of ``kernel`` under ``request``'s options (its examples, tier, example database; for the goldens its
    directory, default this project's, and whether a missing golden of the kernel's own version fails); ``seed``
    the examples' (a round of the time budget); ``run`` (``property_tests.checks.failures.CheckRun``) the run the cell
    is part of, which reports an exception the kernel raises once."""
    family, column = cell.family, cell.column
    t0 = time.perf_counter()
    why = kernel.available()
    if why:
        return CellOutcome(Status.UNSUPPORTED, why)
    if column == GOLDENS:
        return dataclasses.replace(_golden_cell(kernel, request.golden_dir, request.require_own),
                                   seconds=time.perf_counter() - t0)
    ci = request.tier == DEFAULT  # gmm-ci's seeded runs keep the settings in force
    result = check_mode(kernel, column, family=family, max_examples=request.max_examples, seed=seed,
                        example_db=request.example_db, run=run, profile=DEFAULT if ci and seed is None else None,
                        tier=None if ci else request.tier)
    failed = result.status.failure
    details = (f"== {kernel.name} / {family} / {column}\n{result.full_report()}",) if failed else ()
    covered = result.coverage_report()
    covered = f"== {kernel.name} / {family} / {column}: {covered}" if covered else ""
    # a mode checking problems built for the kernel (scale, large): no more examples to draw
    extendable = result.status is Status.PASSED and result.examples > 0 and ALL_MODES[column].draws_examples
    return CellOutcome(result.status, shorten(result.detail) if failed else result.detail, result.examples,
                       time.perf_counter() - t0, details, covered, result.cells, extendable=extendable,
                       pairs=result.pairs, causes=tuple(dict(c) for c in result.causes),
                       evidence={k: dict(v) for k, v in result.evidence.items()},
                       declarations=declarations(kernel, result.evidence))




class _CellOutcomes:
    """A table cell's outcomes under the run policy (``property_tests.checks.engine``): a round adds its examples to a
    passed cell, or fails it naming the round; a round that is neither leaves the cell as it was."""

    def failed(self, outcome: CellOutcome) -> bool:
        return outcome.status.failure

    def extendable(self, outcome: CellOutcome) -> bool:
        return outcome.extendable

    def add_round(self, before: CellOutcome, new: CellOutcome, r: int, seed: int) -> CellOutcome | None:
        seconds = before.seconds + new.seconds
        if new.extendable:
            return dataclasses.replace(new, examples=before.examples + new.examples, rounds=r, seconds=seconds,
                                       coverage="", details=())
        if new.status.failure:
            return dataclasses.replace(new, failed_round=FailedRound(r, seed, before.examples), seconds=seconds,
                                       coverage="")
        return None


#: the run policy's view of table cells (``engine.run_checks(cells, run, CELL_OUTCOMES, ...)``)
CELL_OUTCOMES = _CellOutcomes()
