"""The main job's table: one row per (kernel, family), a cell per mode and one for the goldens.

A cell is computed by :func:`run_cell` (in the main job's worker process) and
added to a :class:`Table`, which also records cells a crashed or hung kernel
never finished. :func:`render` prints the table with footnotes.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from gmm_kernels import KernelAdapter, Result, Status
from golden import GoldenStore, check_goldens
from golden.cli import default_directory
from golden.judge import out_of_scope
from golden.staleness import contents
from property_tests.checking import check_mode
from property_tests.modes import MODES
from property_tests.shards import Cell

__all__ = ["GOLDENS", "Cell", "CellOutcome", "Table", "cells_of", "check_cells", "render", "run_cell", "spend_budget"]

GOLDENS = "goldens"
_WIDTH = 110


def _short(text: str) -> str:
    return text if len(text) <= _WIDTH else text[: _WIDTH - 3] + "..."


def cells_of(kernel: KernelAdapter, *, goldens: bool, modes: Sequence[str] | None = None
             ) -> list[tuple[str, str | None, str]]:
    """Every ``(kernel, family, column)`` cell of a kernel, in table order (goldens: one per kernel)."""
    cells: list[tuple[str, str | None, str]] = [(kernel.name, f, m) for f in kernel.families
                                                 for m in (modes or MODES)]
    return cells + ([(kernel.name, None, GOLDENS)] if goldens else [])


def _golden_cell(kernel: KernelAdapter, directory: str | None, require_own: bool) -> tuple[str, list[str]]:
    """The goldens cell: every count says how many cases were out of the kernel's scope, and the text (the
    note, the JSON) lists each reason with its count."""
    where = directory or default_directory()
    results = check_goldens(kernel, where, require_own=require_own)
    if not results:
        held = contents(GoldenStore(where).manifest()["cases"])
        return f"n/a: no golden case of the {kernel.convention} convention in {where} (it holds {held})", []
    fails = [r for r in results if r.status is Status.FAILED]
    passes = [r for r in results if r.status is Status.PASSED]
    bugs = [r for r in results if r.status is Status.KNOWN_BUG]
    scope = out_of_scope(results)  # "7 out of scope: 4 x WHY; 3 x WHY"
    count, _, reasons = scope.partition(": ")
    if fails:
        details = [f"== {kernel.name} / goldens / {r.check}\n{r.full_report()}" for r in fails]
        return (f"FAIL: {len(fails)}/{len(results)} cases" + (f" ({count})" if scope else "")
                + f"; {_short(fails[0].detail)}" + (f"; out of scope: {reasons}" if scope else "")), details
    if not passes and not bugs:
        return f"n/a: all {len(results)} golden cases out of scope: {reasons}", []
    if not passes:
        return (f"known bug: {len(bugs)}/{len(results)} cases" + (f" ({count})" if scope else "")
                + f"; {_short(bugs[0].detail)}" + (f"; out of scope: {reasons}" if scope else "")), []
    return f"pass ({len(passes)}/{len(results)}" + (f"; {len(bugs)} known bug" if bugs else "") \
        + (f"; {scope})" if scope else ")"), []


def _shown(text: str) -> tuple[str, bool]:
    """How a cell shows in the table, and whether it gets a note: a FAIL, n/a or known-bug cell as its prefix
    and a note; a pass cell whose cases were partly out of scope with the count only (its reasons: the note)."""
    for prefix in ("FAIL", "n/a", "known bug"):
        if text.startswith(prefix):
            return prefix, True
    head, sep, _ = text.partition(" out of scope: ")
    if text.startswith("pass") and sep:
        return f"{head} out of scope)", True
    return text, False


def _mode_cell(result: Result) -> str:
    if result.status is Status.FAILED:
        return f"FAIL: {_short(result.detail)}"
    return result.cell()


class CellOutcome(NamedTuple):
    """One computed cell: its text, full failure reports, seconds, coverage report and examples checked."""

    text: str
    details: list[str]
    seconds: float
    coverage: str
    examples: int = 0

    @property
    def extendable(self) -> bool:
        """Whether more examples can be spent on it: a passed cell of a mode that draws examples."""
        return self.text.startswith("pass") and self.examples > 0


def run_cell(kernel: KernelAdapter, family: str | None, column: str, *, max_examples: int | None,
             seed: int | None = None, golden_dir: str | None = None, require_own: bool = False,
             example_db: str | None = None) -> CellOutcome:
    """One cell: ``golden_dir`` (default: this project's goldens) and ``require_own`` (a missing golden of the
    kernel's own version fails) for the goldens; ``example_db`` (a spec of ``property_tests.example_db``) saves
    failing examples and replays them first."""
    t0 = time.perf_counter()
    why = kernel.available()
    if why:
        return CellOutcome(f"n/a: {why}", [], 0.0, "")
    if column == GOLDENS:
        text, details = _golden_cell(kernel, golden_dir, require_own)
        return CellOutcome(text, details, time.perf_counter() - t0, "")
    result = check_mode(kernel, column, family=family, max_examples=max_examples,
                        profile="gmm-ci" if seed is None else None, seed=seed, example_db=example_db)
    details = [f"== {kernel.name} / {family} / {column}\n{result.full_report()}"] \
        if result.status is Status.FAILED else []
    covered = result.coverage_report()
    covered = f"== {kernel.name} / {family} / {column}: {covered}" if covered else ""
    examples = result.examples if column != "large" else 0  # the large mode's one fixed problem: nothing to add
    return CellOutcome(_mode_cell(result), details, time.perf_counter() - t0, covered, examples)


#: a round's seeds: round r of a run under seed S checks its cells under seed S + r * ROUND_SEED_STEP
ROUND_SEED_STEP = 1_000_003


def spend_budget(done: dict[Cell, CellOutcome], deadline: float, run: Callable[[Cell, int], CellOutcome],
                 started: Callable[[Cell], None], seed: int | None = None
                 ) -> Iterator[tuple[Cell, CellOutcome]]:
    """Spend what is left until ``deadline`` (``time.time()``) on more examples: round after round, each passed
    cell of ``done`` runs again under the next round's seed (``run(cell, seed)``, after ``started(cell)``), until
    the time is up or it fails. Yields each cell's new outcome: ``pass (N; R rounds)`` with every round's
    examples, or the round's failure naming its seed. The first round (the profile's) already ran: it alone
    reaches every pair of relations; the rounds only add examples."""
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
                yield cell, o._replace(text=f"pass ({totals[cell]}; {r + 1} rounds)", seconds=seconds[cell],
                                       coverage="", details=[])
                continue
            passed = totals.pop(cell)
            if o.text.startswith("FAIL"):
                yield cell, o._replace(text=f"{o.text} (round {r + 1}, seed {round_seed}, after {passed} examples "
                                            "passed)", seconds=seconds[cell], coverage="")
        r += 1


def check_cells(cells: Iterable[Cell], run: Callable[[Cell, int | None], CellOutcome],
                started: Callable[[Cell, bool], None], *, deadline: float | None = None, seed: int | None = None
                ) -> Iterator[tuple[Cell, CellOutcome, bool]]:
    """Each cell once (``run(cell, seed)``, after ``started(cell, False)``), then, until ``deadline``, the time
    budget's rounds (:func:`spend_budget`, after ``started(cell, True)``); yields ``(cell, outcome, extra)``, extra
    for a round's revision of a cell already yielded. One kernel's cells: the budget is the kernel's."""
    done = {}
    for cell in cells:
        started(cell, False)
        done[cell] = run(cell, seed)
        yield cell, done[cell], False
    if deadline is not None:
        for cell, o in spend_budget(done, deadline, run, lambda c: started(c, True), seed=seed):
            yield cell, o, True


@dataclass
class Table:
    """Rows being filled, cell by cell, and the full failure reports."""

    rows: dict[tuple[str, str], dict[str, str]] = field(default_factory=dict)
    details: list[str] = field(default_factory=list)
    #: per cell, what its examples reached of the covering design (``Result.coverage_report``)
    coverage: list[str] = field(default_factory=list)
    #: seconds each cell took, by ``(kernel, family, column)`` (the goldens' family: None)
    seconds: dict[tuple[str, str | None, str], float] = field(default_factory=dict)

    def plan(self, cells: list[tuple[str, str | None, str]]) -> None:
        for kernel, family, _ in cells:
            if family is not None:
                self.rows.setdefault((kernel, family), {})

    def put(self, kernel: str, family: str | None, column: str, text: str) -> None:
        for (k, f), row in self.rows.items():
            if k == kernel and (family is None or f == family):
                row[column] = text

    def merge(self, other: Table) -> None:
        """Append another table's rows, reports and coverage (a kernel checked in a lane of its own)."""
        for key, row in other.rows.items():
            self.rows.setdefault(key, {}).update(row)
        self.details += other.details
        self.coverage += other.coverage
        self.seconds.update(other.seconds)

    def values(self) -> list[str]:
        return [v for row in self.rows.values() for v in row.values()]

    def checked_nothing(self, kernel: str) -> bool:
        cells = [v for (k, _), row in self.rows.items() if k == kernel for v in row.values()]
        return all(c.startswith("n/a") for c in cells)

    def as_rows(self) -> list[dict[str, Any]]:
        return [{"kernel": k, "family": f, **row} for (k, f), row in self.rows.items()]


def render(rows: list[dict[str, Any]], columns: list[str]) -> str:
    """The table; a FAIL, n/a or known-bug cell (and a goldens pass with cases out of scope) shows a footnote
    number, the footnotes follow."""
    notes: dict[str, int] = {}

    def cell(v: Any) -> str:
        v = str(v)
        shown, noted = _shown(v)
        if noted:
            return f"{shown} [{notes.setdefault(v, len(notes) + 1)}]"
        return v

    table = [["kernel", "family", *columns]]
    table += [[r["kernel"], r["family"], *[cell(r.get(c, "")) for c in columns]] for r in rows]
    widths = [max(len(line[i]) for line in table) for i in range(len(table[0]))]
    out = [" | ".join(v.ljust(w) for v, w in zip(line, widths, strict=True)) for line in table]
    out.insert(1, "-+-".join("-" * w for w in widths))
    out.append("")
    out += [f"[{n}] {text}" for text, n in notes.items()]
    return "\n".join(out)
