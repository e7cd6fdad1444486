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
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from gmm_kernels import KernelAdapter, Status
from golden import GoldenStore, check_goldens
from golden.cli import default_directory
from golden.judge import reasons_text, scope_reasons
from golden.staleness import contents
from property_tests.checking import check_mode
from property_tests.failures import CheckRun
from property_tests.modes import ALL_MODES, MODES, run_rank
from property_tests.shards import Cell
from property_tests.tiers import DEFAULT, ROUND_SEED_STEP

__all__ = ["GOLDENS", "ROUTED_INTERPRETED_EXAMPLES", "Cell", "CellOutcome", "FailedRound", "GoldenTally", "Table",
           "cells_of", "check_cells", "examples_in_default_run", "failure_line", "not_run", "render", "run_cell",
           "run_order", "spend_budget"]

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


class FailedRound(NamedTuple):
    """A round of the time budget that failed a passed cell: its number (the profile's run is round 1), its seed
    and the examples that passed before it."""

    round: int
    seed: int
    passed: int


@dataclass(frozen=True)
class GoldenTally:
    """What the goldens cell found: its golden cases, how many passed, failed or met a known bug, and the reasons
    of the cases out of the kernel's scope with their counts (most frequent first)."""

    cases: int
    passed: int = 0
    failed: int = 0
    known_bugs: int = 0
    out_of_scope: tuple[tuple[str, int], ...] = ()

    def text(self, status: Status, note: str, *, reasons: bool = True) -> str:
        """The cell's text: every count says how many cases were out of scope; ``reasons``: each reason with its
        count (the note and the JSON), else the count alone (the table)."""
        n = sum(count for _, count in self.out_of_scope)
        why = reasons_text(self.out_of_scope)
        scope = f"{n} out of scope" + (f": {why}" if reasons else "")
        if status is Status.PASSED:
            return (f"pass ({self.passed}/{self.cases}" + (f"; {self.known_bugs} known bug" if self.known_bugs else "")
                    + (f"; {scope})" if n else ")"))
        if status is Status.UNSUPPORTED:
            return f"n/a: all {self.cases} golden cases out of scope: {why}"
        count = self.failed if status is Status.FAILED else self.known_bugs
        return (f"{status.value}: {count}/{self.cases} cases" + (f" ({n} out of scope)" if n else "") + f"; {note}"
                + (f"; out of scope: {why}" if n else ""))

    def to_json(self) -> dict[str, Any]:
        return {**dataclasses.asdict(self), "out_of_scope": [list(r) for r in self.out_of_scope]}

    @classmethod
    def from_json(cls, doc: dict[str, Any]) -> GoldenTally:
        return cls(**{**doc, "out_of_scope": tuple((str(r), int(n)) for r, n in doc.get("out_of_scope", ()))})


@dataclass(frozen=True)
class CellOutcome:
    """One computed cell, as data: its verdict and what the table, the JSON output, the merge of shards and the
    exit status read. Its text (:attr:`text`) is computed from these fields, never read back.

    ``note`` is the reason (n/a), the cause (FAIL) or the upstream bug (known bug); ``examples`` the examples
    checked (over every round of the time budget), ``cells`` the covering design's cells run and in all,
    ``pairs`` the design's pairs of relations reached and in all, ``rounds`` the rounds run (1: the profile's run
    alone), ``extendable`` whether the time budget may add rounds
    of examples (a passed cell of a mode that draws them), ``failed_round`` the budget's round that failed it;
    ``goldens`` the goldens cell's tally (None for a mode's cell); ``details`` the full failure reports and
    ``coverage`` what the examples reached (``Result.coverage_report``)."""

    status: Status
    note: str = ""
    examples: int = 0
    seconds: float = 0.0
    details: tuple[str, ...] = ()
    coverage: str = ""
    cells: tuple[int, int] = (0, 0)
    rounds: int = 1
    extendable: bool = False
    failed_round: FailedRound | None = None
    goldens: GoldenTally | None = None
    pairs: tuple[int, int] = (0, 0)

    @property
    def text(self) -> str:
        """The cell's text: ``pass (n)``, ``FAIL: cause``, ``n/a: reason``, ``known bug: ...`` (the note of a
        table cell, the JSON's ``text``)."""
        if self.goldens is not None:
            text = self.goldens.text(self.status, self.note)
        elif self.status is not Status.PASSED:
            text = f"{self.status.value}: {self.note}"
        elif self.rounds > 1:
            text = f"pass ({self.examples}; {self.rounds} rounds)"
        else:
            partial = f"; {self.cells[0]}/{self.cells[1]} cells" if self.cells[0] < self.cells[1] else ""
            text = f"pass ({self.examples}{partial})"
            if partial and self.note:  # the cells left out, and why (the scale mode's)
                text += f": {self.note}"
        if self.failed_round is not None:
            r = self.failed_round
            text += f" (round {r.round}, seed {r.seed}, after {r.passed} examples passed)"
        return text

    def shown(self) -> tuple[str, bool]:
        """How the cell shows in the table, and whether it gets a note: a FAIL, n/a or known-bug cell as its
        status and a note; a goldens pass with cases out of scope with the count only (its reasons: the note)."""
        if self.status is not Status.PASSED:
            return self.status.value, True
        if self.goldens is not None and self.goldens.out_of_scope:
            return self.goldens.text(self.status, self.note, reasons=False), True
        if self.note and self.cells[0] < self.cells[1] and self.rounds == 1:  # cells left out: the note says which
            return self.text.split(": ", 1)[0], True
        return self.text, False

    def to_json(self) -> dict[str, Any]:
        """A JSON-able dict of the fields (:meth:`from_json` reads it back); ``status`` is the status's value."""
        return {"status": self.status.value, "note": self.note, "examples": self.examples, "seconds": self.seconds,
                "details": list(self.details), "coverage": self.coverage, "cells": list(self.cells),
                "rounds": self.rounds, "extendable": self.extendable,
                "failed_round": None if self.failed_round is None else list(self.failed_round),
                "goldens": None if self.goldens is None else self.goldens.to_json(), "pairs": list(self.pairs)}

    @classmethod
    def from_json(cls, doc: dict[str, Any]) -> CellOutcome:
        """The outcome of :meth:`to_json`'s dict (other keys ignored; a missing field takes its default);
        ``ValueError``, ``KeyError`` or ``TypeError`` for anything else."""
        failed, goldens = doc.get("failed_round"), doc.get("goldens")
        return cls(Status(doc["status"]), note=str(doc.get("note", "")), examples=int(doc.get("examples", 0)),
                   seconds=float(doc.get("seconds", 0.0)), details=tuple(doc.get("details", ())),
                   coverage=str(doc.get("coverage", "")), cells=tuple(doc.get("cells", (0, 0))),
                   rounds=int(doc.get("rounds", 1)), extendable=bool(doc.get("extendable", False)),
                   failed_round=None if failed is None else FailedRound(*failed),
                   goldens=None if goldens is None else GoldenTally.from_json(goldens),
                   pairs=tuple(doc.get("pairs", (0, 0))))


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


def run_cell(kernel: KernelAdapter, family: str | None, column: str, *, max_examples: int | None,
             seed: int | None = None, golden_dir: str | None = None, require_own: bool = False,
             example_db: str | None = None, run: CheckRun | None = None, tier: str = DEFAULT) -> CellOutcome:
    """One cell: ``golden_dir`` (default: this project's goldens) and ``require_own`` (a missing golden of the
    kernel's own version fails) for the goldens; ``example_db`` (a spec of ``property_tests.example_db``) saves
    failing examples and replays them first; ``run`` (``property_tests.failures.CheckRun``) is the run the cell
    is part of, which reports an exception the kernel raises once; ``tier`` (``property_tests.tiers``) what a mode
    runs (gmm-ci's seeded runs keep the settings in force, as before tiers)."""
    t0 = time.perf_counter()
    why = kernel.available()
    if why:
        return CellOutcome(Status.UNSUPPORTED, why)
    if column == GOLDENS:
        return dataclasses.replace(_golden_cell(kernel, golden_dir, require_own), seconds=time.perf_counter() - t0)
    ci = tier == DEFAULT
    result = check_mode(kernel, column, family=family, max_examples=max_examples, seed=seed, example_db=example_db,
                        run=run, profile=DEFAULT if ci and seed is None else None, tier=None if ci else tier)
    failed = result.status is Status.FAILED
    details = (f"== {kernel.name} / {family} / {column}\n{result.full_report()}",) if failed else ()
    covered = result.coverage_report()
    covered = f"== {kernel.name} / {family} / {column}: {covered}" if covered else ""
    # a mode checking problems built for the kernel (scale, large): no more examples to draw
    extendable = result.status is Status.PASSED and result.examples > 0 and ALL_MODES[column].draws_examples
    return CellOutcome(result.status, _short(result.detail) if failed else result.detail, result.examples,
                       time.perf_counter() - t0, details, covered, result.cells, extendable=extendable,
                       pairs=result.pairs)




def spend_budget(done: dict[Cell, CellOutcome], deadline: float, run: Callable[[Cell, int], CellOutcome],
                 started: Callable[[Cell], None], seed: int | None = None
                 ) -> Iterator[tuple[Cell, CellOutcome]]:
    """Spend what is left until ``deadline`` (``time.time()``) on more examples: round after round, each
    extendable cell of ``done`` runs again under the next round's seed (``run(cell, seed)``, after
    ``started(cell)``), until the time is up or it fails (round r under ``seed + (r - 1) * ROUND_SEED_STEP``, the
    first seed the run's, or the date's: ``tiers.first_round_seed``). Yields each cell's new outcome: passed with every
    round's examples and the rounds run, or the round's failure naming its round and seed. The first round (the
    profile's) already ran: it alone reaches every pair of relations; the rounds only add examples."""
    totals = {cell: o.examples for cell, o in done.items() if o.extendable}
    seconds = {cell: o.seconds for cell, o in done.items()}
    r = 1
    while totals and time.time() < deadline:
        for cell in list(totals):
            if time.time() >= deadline:
                break
            round_seed = (seed or 0) + r * ROUND_SEED_STEP
            started(cell)
            o = run(cell, round_seed)
            seconds[cell] += o.seconds
            if o.extendable:
                totals[cell] += o.examples
                yield cell, dataclasses.replace(o, examples=totals[cell], rounds=r + 1, seconds=seconds[cell],
                                                coverage="", details=())
                continue
            passed = totals.pop(cell)
            if o.status is Status.FAILED:
                yield cell, dataclasses.replace(o, failed_round=FailedRound(r + 1, round_seed, passed),
                                                seconds=seconds[cell], coverage="")
        r += 1


def check_cells(cells: Iterable[Cell], run: Callable[[Cell, int | None], CellOutcome],
                started: Callable[[Cell, bool], None], *, deadline: float | None = None, seed: int | None = None,
                fail_fast: bool = False, rounds_from: int | None = None) -> Iterator[tuple[Cell, CellOutcome, bool]]:
    """Each cell once (``run(cell, seed)``, after ``started(cell, False)``), then, until ``deadline``, the time
    budget's rounds (:func:`spend_budget`, after ``started(cell, True)``); yields ``(cell, outcome, extra)``, extra
    for a round's revision of a cell already yielded. One kernel's cells: the budget is the kernel's. With
    ``fail_fast``, the cells after the first failed one are not run (each yielded as :func:`not_run`) and no
    round of the budget follows. The rounds start from ``rounds_from`` (default: ``seed``)."""
    done, failed = {}, None
    for cell in cells:
        if failed is not None:
            yield cell, not_run(failed), False
            continue
        started(cell, False)
        done[cell] = run(cell, seed)
        yield cell, done[cell], False
        if fail_fast and done[cell].status is Status.FAILED:
            failed = cell
    if deadline is not None and failed is None:
        first = rounds_from if rounds_from is not None else seed
        for cell, o in spend_budget(done, deadline, run, lambda c: started(c, True), seed=first):
            yield cell, o, True


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
