"""What a table cell found, as data: :class:`CellOutcome` (with the goldens cell's :class:`GoldenTally` and the time
budget's :class:`FailedRound`), the record a worker sends the main job as JSON, that the table, the JSON document,
the merge of shards and the exit status read. Light on purpose: the worker's events carry it before any framework
loads."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, NamedTuple

from gmm_kernels.results import Status

__all__ = ["CellOutcome", "FailedRound", "GoldenTally"]


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
        from golden.judge import reasons_text  # (the goldens' own words for the reasons)

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
    #: the distinct causes the cell's check shrank and the traits of its examples by what they did
    #: (``gmm_kernels.Result.causes``, ``Result.evidence``; ``property_tests.checks.causes``)
    causes: tuple[dict[str, str], ...] = ()
    evidence: dict[str, dict[str, int]] = dataclasses.field(default_factory=dict)
    #: trait -> the declaration that scopes it out of the kernel's checks (``causes.declarations``)
    declarations: dict[str, list[str]] = dataclasses.field(default_factory=dict)

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
                "goldens": None if self.goldens is None else self.goldens.to_json(), "pairs": list(self.pairs),
                "causes": [dict(c) for c in self.causes], "evidence": {k: dict(v) for k, v in self.evidence.items()},
                "declarations": {k: list(v) for k, v in self.declarations.items()}}

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
                   pairs=tuple(doc.get("pairs", (0, 0))),
                   causes=tuple({str(k): str(v) for k, v in c.items()} for c in doc.get("causes", ())),
                   evidence={str(k): {str(t): int(n) for t, n in v.items()}
                             for k, v in doc.get("evidence", {}).items()},
                   declarations={str(k): [str(x) for x in v] for k, v in doc.get("declarations", {}).items()})
