"""The main job's table: one row per (kernel, family), a cell per mode and one for the goldens.

A cell is computed by ``property_tests.cli.cells.run_cell`` (in the main job's worker process) as a
:class:`CellOutcome`, a record of fields sent to the main job as JSON, and
added to a :class:`Table`, which also records cells a crashed or hung kernel
never finished. :func:`render` prints the table with footnotes, each cell's
text computed from its fields.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from gmm_kernels import KernelAdapter, Status
from property_tests.checks.engine import known_bugs_not_caught, run_rank, shorten
from property_tests.checks.modes import MODES
from property_tests.cli.outcomes import CellOutcome, FailedRound, GoldenTally
from property_tests.cli.shards import TableCell

__all__ = [
    "GOLDENS",
    "CellOutcome",
    "FailedRound",
    "GoldenTally",
    "Table",
    "TableCell",
    "cells_of",
    "failure_line",
    "not_run",
    "render",
    "run_order",
]

GOLDENS = "goldens"
def cells_of(kernel: KernelAdapter, *, goldens: bool, modes: Sequence[str] | None = None) -> list[TableCell]:
    """Every ``(kernel, family, column)`` cell of a kernel, in table order (goldens: one per kernel)."""
    cells = [TableCell(kernel.name, f, m) for f in kernel.families for m in (modes or MODES)]
    return cells + ([TableCell(kernel.name, None, GOLDENS)] if goldens else [])


def run_order(cells: Iterable[TableCell]) -> list[TableCell]:
    """``cells`` in the order a run checks them: kernel by kernel (in the order given), each kernel's modes in
    :data:`~property_tests.checks.engine.RUN_ORDER` (the modes most likely to fail first), its families in the order
    given within a mode, the goldens last. Only the execution order: the table keeps the plan's."""
    cells = list(cells)
    kernels = list(dict.fromkeys(c.kernel for c in cells))

    def rank(cell: TableCell) -> tuple[int, int]:
        return kernels.index(cell.kernel), run_rank(cell.column) + (cell.column == GOLDENS)

    return sorted(cells, key=rank)  # stable: the families keep their order


def failure_line(cell: TableCell, outcome: CellOutcome) -> str:
    """The line a run prints to stderr as soon as a cell fails: the kernel, family, mode and the short failure."""
    where = " / ".join(str(part) for part in cell if part is not None)
    return f"gmm-harness: {outcome.status.value} {where}: {shorten(outcome.note)}"


def not_run(cell: TableCell) -> CellOutcome:
    """A cell ``--fail-fast`` left out after ``cell``, its kernel's first failure."""
    where = " / ".join(str(part) for part in cell if part is not None)
    return CellOutcome(Status.UNSUPPORTED, f"not run: --fail-fast stopped at the kernel's first failure ({where})")


@dataclass
class Table:
    """Rows being filled, cell by cell, with each cell's :class:`CellOutcome`, and the full failure reports."""

    rows: dict[tuple[str, str], dict[str, CellOutcome]] = field(default_factory=dict)
    details: list[str] = field(default_factory=list)
    #: per cell, what its examples reached of the covering design (``Result.coverage_report``)
    coverage: list[str] = field(default_factory=list)
    #: kernel -> the device it runs on (``gmm_kernels.sandbox.device.of``): the table's device column
    devices: dict[str, str] = field(default_factory=dict)

    def plan(self, cells: Iterable[TableCell]) -> None:
        for kernel, family, _ in cells:
            if family is not None:
                self.rows.setdefault((kernel, family), {})

    def put(self, cell: TableCell, outcome: CellOutcome) -> None:
        """Set a cell (the goldens, whose family is None: in every row of the kernel)."""
        kernel, family, column = cell
        for (k, f), row in self.rows.items():
            if k == kernel and (family is None or f == family):
                row[column] = outcome

    def add(self, cell: TableCell, outcome: CellOutcome) -> None:
        """Set a cell and append its failure reports and coverage."""
        self.put(cell, outcome)
        self.details += outcome.details
        self.coverage += [outcome.coverage] if outcome.coverage else []

    def get(self, cell: TableCell) -> CellOutcome | None:
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
        still catch it (``engine.known_bugs_not_caught``): where every family's cell of such a mode passed, those
        cells become failures saying so. Returns how many cells it failed."""
        failed = 0
        for kernel, modes in declared.items():
            cells = {mode: {f: row[mode] for (k, f), row in self.rows.items() if k == kernel and mode in row}
                     for mode in modes}
            passed = {mode: [o.status is Status.PASSED for o in found.values()] for mode, found in cells.items()}
            for mode, note in known_bugs_not_caught(kernel, modes, passed).items():
                for family, o in cells[mode].items():
                    self.put(TableCell(kernel, family, mode), dataclasses.replace(o, status=Status.FAILED, note=note))
                    failed += 1
                self.details.append(f"== {kernel} / {mode}\n{note}:\n{modes[mode]}")
        return failed

    def causes(self, kernel: str) -> tuple[list[tuple[str, Any, Any]], dict[str, list[str]]]:
        """``kernel``'s cells as ``property_tests.checks.causes.summarize`` reads them (each cell's check, the causes
        it shrank and the evidence of its examples), and the declarations of the traits they saw."""
        cells = [(f"{column} [{f}]", o) for (k, f), row in self.rows.items() if k == kernel
                 for column, o in row.items() if o.causes or o.evidence]
        return ([(where, o.causes, o.evidence) for where, o in cells],
                {t: d for _, o in cells for t, d in o.declarations.items()})

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
