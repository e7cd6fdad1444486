"""The main job's table: one row per (kernel, family), a cell per mode and one for the goldens.

A cell is computed by :func:`run_cell` (in the main job's worker process) as a
:class:`CellOutcome`, a record of fields sent to the main job as JSON, and
added to a :class:`Table`, which also records cells a crashed or hung kernel
never finished. :func:`render` prints the table with footnotes, each cell's
text computed from its fields.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from gmm_kernels import KernelAdapter, Status
from golden import GoldenStore, check_goldens
from golden.cli import default_directory
from golden.judge import scope_reasons
from golden.staleness import contents
from property_tests.checking import check_mode
from property_tests.failures import CheckRun
from property_tests.modes import ALL_MODES, MODES, run_rank
from property_tests.outcomes import CellOutcome, FailedRound, GoldenTally
from property_tests.request import WorkRequest
from property_tests.shards import Cell
from property_tests.tiers import DEFAULT

__all__ = ["CELL_OUTCOMES", "GOLDENS", "ROUTED_INTERPRETED_EXAMPLES", "Cell", "CellOutcome", "FailedRound",
           "GoldenTally", "Table", "cells_of", "examples_in_default_run", "failure_line", "not_run", "render",
           "run_cell", "run_order"]

GOLDENS = "goldens"
_WIDTH = 110


def _short(text: str) -> str:
    return text if len(text) <= _WIDTH else text[: _WIDTH - 3] + "..."


#: examples a mode of a routed MoE kernel that runs interpreted here gets in the default run (every kernel at once):
#: a routing costs it tens of milliseconds to seconds (one interpreted program per live block), so the profile's 50
#: would add about a minute per kernel; named (``--kernel``), it gets the profile's
ROUTED_INTERPRETED_EXAMPLES = 10


def examples_in_default_run(kernel: KernelAdapter, max_examples: int | None) -> int | None:
    """The examples per mode ``kernel`` gets in the default run: ``max_examples`` when given, else
    :data:`ROUTED_INTERPRETED_EXAMPLES` for a routed kernel that runs interpreted here (``interpreted()``), else
    None (the profile's budget, and the kernel's own ``max_examples`` cap)."""
    if max_examples is None and kernel.routed and kernel.interpreted():
        return ROUTED_INTERPRETED_EXAMPLES
    return max_examples


def cells_of(kernel: KernelAdapter, *, goldens: bool, modes: Sequence[str] | None = None) -> list[Cell]:
    """Every ``(kernel, family, column)`` cell of a kernel, in table order (goldens: one per kernel)."""
    cells = [Cell(kernel.name, f, m) for f in kernel.families for m in (modes or MODES)]
    return cells + ([Cell(kernel.name, None, GOLDENS)] if goldens else [])


def run_order(cells: Iterable[Cell]) -> list[Cell]:
    """``cells`` in the order a run checks them: kernel by kernel (in the order given), each kernel's modes in
    :data:`~property_tests.modes.RUN_ORDER` (the modes most likely to fail first), its families in the order
    given within a mode, the goldens last. Only the execution order: the table keeps the plan's."""
    cells = list(cells)
    kernels = list(dict.fromkeys(c.kernel for c in cells))

    def rank(cell: Cell) -> tuple[int, int]:
        return kernels.index(cell.kernel), run_rank(cell.column) + (cell.column == GOLDENS)

    return sorted(cells, key=rank)  # stable: the families keep their order


def failure_line(cell: Cell, outcome: CellOutcome) -> str:
    """The line a run prints to stderr as soon as a cell fails: the kernel, family, mode and the short failure."""
    where = " / ".join(str(part) for part in cell if part is not None)
    return f"gmm-harness: FAIL {where}: {_short(outcome.note)}"


def not_run(cell: Cell) -> CellOutcome:
    """A cell ``--fail-fast`` left out after ``cell``, its kernel's first failure."""
    where = " / ".join(str(part) for part in cell if part is not None)
    return CellOutcome(Status.UNSUPPORTED, f"not run: --fail-fast stopped at the kernel's first failure ({where})")


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
        return CellOutcome(Status.FAILED, _short(by[Status.FAILED][0].detail), details=details, goldens=tally)
    if not tally.passed and not tally.known_bugs:
        return CellOutcome(Status.UNSUPPORTED, goldens=tally)
    if not tally.passed:
        return CellOutcome(Status.KNOWN_BUG, _short(by[Status.KNOWN_BUG][0].detail), goldens=tally)
    return CellOutcome(Status.PASSED, goldens=tally)


def run_cell(kernel: KernelAdapter, cell: Cell, request: WorkRequest, *, seed: int | None = None,
             run: CheckRun | None = None) -> CellOutcome:
    """One cell of ``kernel`` under ``request``'s options (its examples, tier, example database; for the goldens its
    directory, default this project's, and whether a missing golden of the kernel's own version fails); ``seed``
    the examples' (a round of the time budget); ``run`` (``property_tests.failures.CheckRun``) the run the cell is
    part of, which reports an exception the kernel raises once."""
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
    failed = result.status is Status.FAILED
    details = (f"== {kernel.name} / {family} / {column}\n{result.full_report()}",) if failed else ()
    covered = result.coverage_report()
    covered = f"== {kernel.name} / {family} / {column}: {covered}" if covered else ""
    # a mode checking problems built for the kernel (scale, large): no more examples to draw
    extendable = result.status is Status.PASSED and result.examples > 0 and ALL_MODES[column].draws_examples
    return CellOutcome(result.status, _short(result.detail) if failed else result.detail, result.examples,
                       time.perf_counter() - t0, details, covered, result.cells, extendable=extendable,
                       pairs=result.pairs)




class _CellOutcomes:
    """A table cell's outcomes under the run policy (``property_tests.engine``): a round adds its examples to a
    passed cell, or fails it naming the round; a round that is neither leaves the cell as it was."""

    def failed(self, outcome: CellOutcome) -> bool:
        return outcome.status is Status.FAILED

    def extendable(self, outcome: CellOutcome) -> bool:
        return outcome.extendable

    def add_round(self, before: CellOutcome, new: CellOutcome, r: int, seed: int) -> CellOutcome | None:
        seconds = before.seconds + new.seconds
        if new.extendable:
            return dataclasses.replace(new, examples=before.examples + new.examples, rounds=r, seconds=seconds,
                                       coverage="", details=())
        if new.status is Status.FAILED:
            return dataclasses.replace(new, failed_round=FailedRound(r, seed, before.examples), seconds=seconds,
                                       coverage="")
        return None

    def not_run(self, unit: Cell, failure: Cell) -> CellOutcome:
        return not_run(failure)


#: the run policy's view of table cells (``engine.run_checks(cells, run, CELL_OUTCOMES, ...)``)
CELL_OUTCOMES = _CellOutcomes()


@dataclass
class Table:
    """Rows being filled, cell by cell, with each cell's :class:`CellOutcome`, and the full failure reports."""

    rows: dict[tuple[str, str], dict[str, CellOutcome]] = field(default_factory=dict)
    details: list[str] = field(default_factory=list)
    #: per cell, what its examples reached of the covering design (``Result.coverage_report``)
    coverage: list[str] = field(default_factory=list)
    #: kernel -> the device it runs on (``gmm_kernels.device.of``): the table's device column
    devices: dict[str, str] = field(default_factory=dict)

    def plan(self, cells: Iterable[Cell]) -> None:
        for kernel, family, _ in cells:
            if family is not None:
                self.rows.setdefault((kernel, family), {})

    def put(self, cell: Cell, outcome: CellOutcome) -> None:
        """Set a cell (the goldens, whose family is None: in every row of the kernel)."""
        kernel, family, column = cell
        for (k, f), row in self.rows.items():
            if k == kernel and (family is None or f == family):
                row[column] = outcome

    def add(self, cell: Cell, outcome: CellOutcome) -> None:
        """Set a cell and append its failure reports and coverage."""
        self.put(cell, outcome)
        self.details += outcome.details
        self.coverage += [outcome.coverage] if outcome.coverage else []

    def get(self, cell: Cell) -> CellOutcome | None:
        """A cell's outcome (the goldens' family: None), or None before it is set."""
        kernel, family, column = cell
        return next((row[column] for (k, f), row in self.rows.items()
                     if k == kernel and (family is None or f == family) and column in row), None)

    def merge(self, other: Table) -> None:
        """Append another table's rows, reports and coverage (a kernel checked in a lane of its own)."""
        for key, row in other.rows.items():
            self.rows.setdefault(key, {}).update(row)
        self.devices.update(other.devices)
        self.details += other.details
        self.coverage += other.coverage

    def values(self) -> list[CellOutcome]:
        return [v for row in self.rows.values() for v in row.values()]

    def count(self, status: Status) -> int:
        return sum(v.status is status for v in self.values())

    def reached(self) -> tuple[tuple[int, int], tuple[int, int]]:
        """The covering designs' cells run and in all (the scale mode's cells too), and their pairs of relations
        reached and in all, summed over the table's cells."""
        values = self.values()
        return ((sum(v.cells[0] for v in values), sum(v.cells[1] for v in values)),
                (sum(v.pairs[0] for v in values), sum(v.pairs[1] for v in values)))

    def known_bugs_not_caught(self, declared: dict[str, dict[str, str]]) -> int:
        """A mode in which a kernel declares a known upstream bug (``declared``: kernel -> mode -> the bug) must
        still catch it, as the plugin's strict xfail requires: where every family's cell of such a mode passed
        (none a known bug, failed or n/a), those cells become failures saying so. The upstream fix it may be shows
        where it happened, and a harness that stopped catching the bug does not pass in silence. Only for runs
        whose examples are the same every run (``gmm-ci``'s, ``gmm-nightly``'s first round). Returns how many
        cells it failed."""
        failed = 0
        for kernel, modes in declared.items():
            for mode, bug in modes.items():
                cells = {f: row[mode] for (k, f), row in self.rows.items() if k == kernel and mode in row}
                if not cells or any(o.status is not Status.PASSED for o in cells.values()):
                    continue
                note = (f"declared known upstream bug not caught: every family passed the {mode} mode, where "
                        f"{kernel} declares {_short(bug)!r}; if upstream fixed it, narrow the versions it is known "
                        "on (gmm_kernels.known_issues), else the harness stopped catching it")
                for family, o in cells.items():
                    self.put(Cell(kernel, family, mode), dataclasses.replace(o, status=Status.FAILED, note=note))
                    failed += 1
                self.details.append(f"== {kernel} / {mode}\n{note}:\n{bug}")
        return failed

    def checked_nothing(self, kernel: str) -> bool:
        return all(o.status is Status.UNSUPPORTED for (k, _), row in self.rows.items() if k == kernel
                   for o in row.values())

    def as_rows(self) -> list[dict[str, Any]]:
        return [{"kernel": k, "family": f, **({"device": self.devices[k]} if k in self.devices else {}), **row}
                for (k, f), row in self.rows.items()]


def render(rows: list[dict[str, Any]], columns: list[str]) -> str:
    """The table of ``rows`` (``kernel``, ``family``, where known the kernel's ``device``, and a
    :class:`CellOutcome` per column); a FAIL, n/a or known-bug cell (and a goldens pass with cases out of scope)
    shows a footnote number, the footnotes (the cells' texts) follow."""
    notes: dict[str, int] = {}

    def cell(o: CellOutcome | None) -> str:
        if o is None:
            return ""
        shown, noted = o.shown()
        return f"{shown} [{notes.setdefault(o.text, len(notes) + 1)}]" if noted else shown

    device = ["device"] if any("device" in r for r in rows) else []
    table = [["kernel", "family", *device, *columns]]
    table += [[r["kernel"], r["family"], *([r.get("device", "?")] if device else []),
               *[cell(r.get(c)) for c in columns]] for r in rows]
    widths = [max(len(line[i]) for line in table) for i in range(len(table[0]))]
    out = [" | ".join(v.ljust(w) for v, w in zip(line, widths, strict=True)) for line in table]
    out.insert(1, "-+-".join("-" * w for w in widths))
    out.append("")
    out += [f"[{n}] {text}" for text, n in notes.items()]
    return "\n".join(out)
