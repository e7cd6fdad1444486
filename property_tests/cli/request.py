"""What the main job and its worker say to each other: a typed request one way, typed events the other, each
with one JSON codec.

A :class:`WorkRequest` holds the kernel specs and every option a cell needs;
the main job builds it from its command line, a lane narrows it to one kernel
(``dataclasses.replace``) and the supervisor adds the cells a worker computes.
:func:`resolve_request` turns it into kernels, in the main job and in the
worker alike. A :class:`WorkerEvent` is what computing the cells reports (a
cell begins, the problem a kernel is given, a failing example found, a cell's
outcome, an error that ended the worker, the end). This module imports nothing
heavy (the worker sets its environment from the request before any framework
loads) and nothing of the command line.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from property_tests.checks.tiers import DEFAULT
from property_tests.cli.shards import TableCell

if TYPE_CHECKING:
    from gmm_kernels import KernelAdapter
    from property_tests.cli.outcomes import CellOutcome

__all__ = ["EVENT_KINDS", "WorkRequest", "WorkerEvent", "resolve_request"]


@dataclass(frozen=True)
class WorkRequest:
    """The kernels and options of a run, and the cells a worker is to compute (none in the main job)."""

    #: kernel specs (built-in adapter names or ``pkg.module:fn``); none: every built-in adapter
    kernels: tuple[str, ...] = ()
    convention: str | None = None
    tiling: str | None = None
    modes: tuple[str, ...] = ()
    #: the declared scope's option values, by option name without ``--`` (``property_tests.cli.options``)
    scope: Mapping[str, Any] = field(default_factory=dict)
    max_examples: int | None = None
    seed: int | None = None
    golden_dir: str | None = None
    kernel_version: str | None = None
    #: a missing golden of the kernel's own version fails (with ``kernel_version``)
    require_own: bool = False
    example_db: str | None = None
    #: environment variables the worker sets before anything imports a framework
    environ: Mapping[str, str] = field(default_factory=dict)
    #: the device torch-convention kernels run on, resolved by the main job (``cpu``, ``cuda:0``;
    #: ``gmm_kernels.sandbox.device``): the worker selects it as it is, so ``--device auto`` means the same there
    device: str = "cpu"
    #: ``time.time()`` until which the kernel's time budget adds rounds of examples; None: no budget
    deadline: float | None = None
    #: ``--fail-fast``: a kernel's cells after its first failed one are not run
    fail_fast: bool = False
    #: ``--tier``: what a mode runs (``property_tests.checks.tiers``)
    tier: str = DEFAULT
    #: the first seed of the time budget's rounds (None: the run's seed, or 0)
    rounds_from: int | None = None
    #: ``--in-process``: a ``pkg.module:fn`` kernel is imported and called in the judging process (no host process)
    in_process: bool = False
    cells: tuple[TableCell, ...] = ()

    def to_json(self) -> dict[str, Any]:
        """A JSON-able dict (:meth:`from_json` reads it back)."""
        doc = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        return {**doc, "kernels": list(self.kernels), "modes": list(self.modes), "scope": dict(self.scope),
                "environ": dict(self.environ), "cells": [list(c) for c in self.cells]}

    @classmethod
    def from_json(cls, doc: Mapping[str, Any]) -> WorkRequest:
        """The request of :meth:`to_json`'s dict; a field it lacks takes its default."""
        names = {f.name for f in dataclasses.fields(cls)}
        values = {k: v for k, v in doc.items() if k in names}
        for name in ("kernels", "modes"):
            if name in values:
                values[name] = tuple(values[name])
        if "cells" in values:
            values["cells"] = tuple(TableCell(*c) for c in values["cells"])
        return cls(**values)


#: what a worker reports: a cell begins (``start``), the problem a kernel is about to be given (``problem``), a
#: failing example found before it is shrunk (``found``), a cell's outcome (``cell``), an exception that ended the
#: worker (``error``), every cell reported (``end``)
EVENT_KINDS = ("start", "problem", "found", "cell", "error", "end")


@dataclass(frozen=True)
class WorkerEvent:
    """One thing a worker reports, of a kind in :data:`EVENT_KINDS`; the fields its kind has are set.

    ``cell`` (start, cell) and ``extra`` (a round of the time budget revising a cell already reported);
    ``kernel`` (problem, found); ``text`` (problem: the problem described; found: the failure's line; error: the
    exception named); ``where`` (found: the mode and family); ``outcome`` (cell); ``traceback`` (error)."""

    kind: str
    cell: TableCell | None = None
    extra: bool = False
    kernel: str = ""
    text: str = ""
    where: str = ""
    outcome: CellOutcome | None = None
    traceback: str = ""

    def __post_init__(self) -> None:
        if self.kind not in EVENT_KINDS:
            raise ValueError(f"kind: expected one of {EVENT_KINDS}, got {self.kind!r}")
        if self.kind in ("start", "cell") and self.cell is None:
            raise ValueError(f"cell: a {self.kind} event names its cell")
        if self.kind == "cell" and self.outcome is None:
            raise ValueError("outcome: a cell event carries the cell's outcome")

    def to_json(self) -> dict[str, Any]:
        """A JSON-able dict of the fields set (:meth:`from_json` reads it back)."""
        doc: dict[str, Any] = {"event": self.kind}
        if self.cell is not None:
            doc.update(cell=list(self.cell), extra=self.extra)
        doc.update((k, getattr(self, k)) for k in ("kernel", "text", "where", "traceback") if getattr(self, k))
        if self.outcome is not None:
            doc["outcome"] = self.outcome.to_json()
        return doc

    @classmethod
    def from_json(cls, doc: Mapping[str, Any]) -> WorkerEvent:
        """The event of :meth:`to_json`'s dict; ``ValueError``, ``KeyError`` or ``TypeError`` for anything else (a
        line a kernel wrote into the events file)."""
        from property_tests.cli.outcomes import CellOutcome

        cell, outcome = doc.get("cell"), doc.get("outcome")
        return cls(str(doc["event"]), cell=None if cell is None else TableCell(*cell),
                   extra=bool(doc.get("extra", False)),
                   **{k: str(doc.get(k, "")) for k in ("kernel", "text", "where", "traceback")},
                   outcome=None if outcome is None else CellOutcome.from_json(outcome))


def resolve_request(request: WorkRequest) -> list[KernelAdapter]:
    """The kernels of a request (in the main job and in the worker): resolved, scoped and versioned."""
    # imported here: the worker reads its request, and sets its environment from it, before these load
    from gmm_kernels import configure, resolve_kernels
    from property_tests.checks.check import check_known_issue_modes
    from property_tests.cli.options import apply_scope, scope_fields

    fields = scope_fields(request.scope or {})
    kernels = []
    for resolved in resolve_kernels(list(request.kernels), convention=request.convention, tiling=request.tiling,
                                    in_process=request.in_process):
        k = configure(apply_scope(resolved, fields), version=request.kernel_version or None)
        if request.kernels:
            check_known_issue_modes(k, option="--kernel")
        kernels.append(k)
    return kernels
