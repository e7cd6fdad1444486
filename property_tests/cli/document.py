"""The main job's ``--json`` document, typed: :class:`RunDocument` (with a :class:`KernelEntry` per kernel), written
by a run or a shard, read back by ``gmm-harness merge``, with one JSON codec.

Its cells are the table's cells in plan order, each the JSON of its ``property_tests.cli.outcomes.CellOutcome`` with
its place (``kernel``, ``family``, ``check``), its ``text`` and ``seconds``, its reports and coverage being the
document's ``failures`` and ``coverage``. A document of the merge of shards also says which shards it joined and
their seconds.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NoReturn

from property_tests.checks.tiers import DEFAULT, same_every_run
from property_tests.cli.shards import TableCell, plan_key

__all__ = ["FORMAT", "KernelEntry", "OtherFormat", "RunDocument", "load_shards", "run_verdict"]

#: the format of the document (a merge refuses shards of another)
FORMAT = 2


class OtherFormat(ValueError):
    """A document written by another version of gmm-harness (another :data:`FORMAT`)."""


def run_verdict(cells: Any) -> str:
    """The whole run's verdict from its cells' (``verdict`` of each): ``tampered`` if any cell is, else ``fail``,
    else ``intermittent``, else ``pass`` where a cell passed or caught its known bug, else ``nothing_checked``."""
    seen = {c.get("verdict") for c in cells if isinstance(c, Mapping)}
    for worst in ("tampered", "fail", "intermittent"):
        if worst in seen:
            return worst
    return "pass" if seen & {"pass", "known_bug"} else "nothing_checked"


@dataclass(frozen=True)
class KernelEntry:
    """A kernel of the run: its name and convention, why it cannot run here (None: it can), its declared scope
    and (a routed function's) numerics as JSON, the device it ran on, and the known upstream bug it declares in
    each mode (mode -> the bug)."""

    name: str
    convention: str
    available: str | None = None
    scope: dict[str, Any] | None = None
    device: str | None = None
    numerics: dict[str, Any] | None = None
    known_bugs: dict[str, str] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        doc = {"name": self.name, "convention": self.convention, "available": self.available, "scope": self.scope,
               "device": self.device}
        return {**doc, **({"numerics": self.numerics} if self.numerics is not None else {}),
                "known_bugs": dict(self.known_bugs)}

    @classmethod
    def from_json(cls, doc: Mapping[str, Any]) -> KernelEntry:
        return cls(str(doc["name"]), str(doc["convention"]), doc.get("available"), doc.get("scope"),
                   doc.get("device"), doc.get("numerics"), dict(doc.get("known_bugs") or {}))


@dataclass(frozen=True)
class RunDocument:
    """What a run (or one shard of it, or the merge of its shards) checked and found.

    The run's options (``requested``: the kernels were named with ``--kernel``; ``goldens``: the goldens column is
    in), its ``plan`` (every cell, in table order), ``shard`` (I, N) and ``checked`` (the cells this shard
    checked), the ``cells``' JSON, the full ``failures`` reports and ``coverage``, and the totals. A merged
    document has ``shards`` (each (I, N)) and ``shard_seconds``."""

    kernels: tuple[KernelEntry, ...]
    modes: tuple[str, ...]
    plan: tuple[TableCell, ...]
    requested: bool = False
    goldens: bool = True
    max_examples: int | None = None
    seed: int | None = None
    budget: float | None = None
    tier: str = DEFAULT
    rounds_from: int | None = None
    golden_dir: str | None = None
    shard: tuple[int, int] | None = None
    checked: int | None = None
    cells: tuple[dict[str, Any], ...] = ()
    failures: tuple[str, ...] = ()
    coverage: tuple[str, ...] = ()
    passed: int = 0
    failed: int = 0
    seconds: float = 0.0
    checked_nothing: tuple[str, ...] = ()
    reached: dict[str, list[int]] | None = None
    shards: tuple[tuple[int, int], ...] | None = None
    shard_seconds: tuple[float | None, ...] | None = None
    #: kernel -> the distinct causes of its failures (``property_tests.checks.causes.summarize``)
    causes: dict[str, list[dict[str, Any]]] = field(default_factory=dict)

    @property
    def same_every_run(self) -> bool:
        """Whether its examples are the same in every run (no seed, no example count asked, a tier whose first run
        is gmm-ci's): there a declared known bug must still be caught."""
        return same_every_run(self.tier, seed=self.seed, max_examples=self.max_examples)

    def declared_bugs(self) -> dict[str, dict[str, str]]:
        """Kernel -> mode -> the known upstream bug it declares there (kernels that declare some)."""
        return {k.name: dict(k.known_bugs) for k in self.kernels if k.known_bugs}

    def replace(self, **changes: Any) -> RunDocument:
        return dataclasses.replace(self, **changes)

    def to_json(self) -> dict[str, Any]:
        """The document as JSON (:meth:`from_json` reads it back); keys a run did not set are left out (a merged
        document's ``shards``, a run's ``passed`` before it finished)."""
        doc: dict[str, Any] = {
            "format": FORMAT, "kernels": [k.to_json() for k in self.kernels], "requested": self.requested,
            "modes": list(self.modes), "goldens": self.goldens, "max_examples": self.max_examples, "seed": self.seed,
            "budget": self.budget, "tier": self.tier, "rounds_from": self.rounds_from, "golden_dir": self.golden_dir,
            "shard": list(self.shard) if self.shard else None, "plan": [list(c) for c in self.plan],
            "checked": self.checked, "cells": list(self.cells), "failures": list(self.failures),
            "coverage": list(self.coverage), "passed": self.passed, "failed": self.failed,
            "seconds": round(self.seconds, 1), "checked_nothing": list(self.checked_nothing), "reached": self.reached,
            "verdict": run_verdict(self.cells), "causes": self.causes}
        if self.shards is not None:
            doc.update(shards=[list(s) for s in self.shards], shard_seconds=list(self.shard_seconds or ()))
        return doc

    @classmethod
    def from_json(cls, doc: Mapping[str, Any]) -> RunDocument:
        """The document of :meth:`to_json`'s dict; a key it lacks takes its default. ``ValueError``, ``KeyError``
        or ``TypeError`` for anything that is not such a document, :class:`OtherFormat` for another format."""
        if not isinstance(doc, Mapping):
            raise TypeError(f"expected a JSON object, got {type(doc).__name__}")
        if doc.get("format") != FORMAT:
            raise OtherFormat(f"written by another version of gmm-harness (format {doc.get('format', 1)}, "
                              f"not {FORMAT})")
        shard, shards = doc.get("shard"), doc.get("shards")
        return cls(
            kernels=tuple(KernelEntry.from_json(k) for k in doc["kernels"]), modes=tuple(doc["modes"]),
            plan=tuple(TableCell(*c) for c in doc["plan"]), requested=bool(doc.get("requested")),
            goldens=bool(doc.get("goldens", True)), max_examples=doc.get("max_examples"), seed=doc.get("seed"),
            budget=doc.get("budget"), tier=str(doc.get("tier") or DEFAULT), rounds_from=doc.get("rounds_from"),
            golden_dir=doc.get("golden_dir"), shard=None if not shard else (int(shard[0]), int(shard[1])),
            checked=doc.get("checked"), cells=tuple(dict(c) for c in doc["cells"]),
            failures=tuple(doc.get("failures", ())), coverage=tuple(doc.get("coverage", ())),
            passed=int(doc.get("passed", 0)), failed=int(doc.get("failed", 0)),
            seconds=float(doc.get("seconds", 0.0)), checked_nothing=tuple(doc.get("checked_nothing", ())),
            reached=doc.get("reached"),
            shards=None if shards is None else tuple((int(s[0]), int(s[1])) for s in shards),
            shard_seconds=None if shards is None else tuple(doc.get("shard_seconds", ())),
            causes={str(k): list(v) for k, v in (doc.get("causes") or {}).items()})


def load_shards(paths: Sequence[str], error: Callable[[str], NoReturn]) -> RunDocument:
    """The shards' documents merged into one (cells in plan order); ``error`` for anything that is not exactly the N
    shards of one plan."""
    docs: list[tuple[str, RunDocument]] = []
    for p in paths:
        try:
            raw = json.loads(Path(p).read_text())
        except (OSError, ValueError) as exc:
            error(f"{p}: expected a shard's --json file: {type(exc).__name__}: {exc}")
        if not isinstance(raw, dict) or not raw.get("shard") or not isinstance(raw.get("plan"), list) \
                or not isinstance(raw.get("cells"), list):
            error(f"{p}: not a shard's result (run gmm-harness check with --shard I/N --json FILE)")
        try:
            docs.append((p, RunDocument.from_json(raw)))
        except OtherFormat as exc:
            error(f"{p}: a shard's result {exc}: run every shard again with this one")
        except (ValueError, KeyError, TypeError) as exc:
            error(f"{p}: not a shard's result: {type(exc).__name__}: {exc}")
    first_path, first = docs[0]
    assert first.shard is not None  # (every document here is a shard's)
    n = first.shard[1]
    seen: dict[int, str] = {}
    for p, doc in docs:
        assert doc.shard is not None
        if doc.plan != first.plan or doc.shard[1] != n or doc.modes != first.modes \
                or doc.requested != first.requested or doc.tier != first.tier:
            error(f"{p}: a shard of another run than {first_path} (its plan, modes, shard count, --kernel or --tier "
                  "differ)")
        i = doc.shard[0]
        if i in seen:
            error(f"{p}: shard {i}/{n} given twice (also {seen[i]})")
        seen[i] = p
    by_cell: dict[str, list[dict[str, Any]]] = {}
    owner: dict[str, str] = {}
    for p, doc in docs:
        for c in doc.cells:
            key = plan_key((c["kernel"], c["family"], c["check"]))
            if owner.setdefault(key, p) != p:
                error(f"{p}: the cell {key} was also checked by {owner[key]}")
            by_cell.setdefault(key, []).append(c)
    plan = list(dict.fromkeys(plan_key(c) for c in first.plan))
    unchecked = [k for k in plan if k not in by_cell]
    missing = [f"{i}/{n}" for i in range(1, n + 1) if i not in seen]
    if missing:  # every shard's file is needed, an empty shard's too: the merge says the run is whole
        lost = f"{_cells(len(unchecked), len(plan))} in no given shard's result" if unchecked \
            else "every cell of the plan is in the given shards' results, but each shard writes a file, even one " \
                 "that checked nothing"
        error(f"missing shard{'s' * (len(missing) > 1)} {', '.join(missing)} (given {len(docs)} of {n}): {lost}")
    if unchecked:
        error(f"{_cells(len(unchecked), len(plan))} in no shard's result, e.g. {unchecked[0]}")
    docs.sort(key=lambda d: d[1].shard[0])  # type: ignore[index]
    shards = [d for _, d in docs]
    return first.replace(
        kernels=tuple(_unique(k for d in shards for k in d.kernels)), shard=None, checked=None,
        cells=tuple(c for k in plan for c in by_cell[k]), failures=tuple(f for d in shards for f in d.failures),
        coverage=tuple(c for d in shards for c in d.coverage), seconds=round(sum(d.seconds for d in shards), 1),
        passed=0, failed=0, checked_nothing=(), reached=None,
        shards=tuple(d.shard for d in shards if d.shard is not None), shard_seconds=tuple(d.seconds for d in shards))


def _cells(n: int, total: int) -> str:
    """``"1 of the plan's 3 cells is"``: a count of cells and its verb."""
    return f"{n} of the plan's {total} cell{'s' * (total != 1)} {'is' if n == 1 else 'are'}"


def _unique(kernels: Iterable[KernelEntry]) -> list[KernelEntry]:
    """One entry per kernel (the first shard's); a kernel whose shards ran it on different devices names them
    all (``cpu, cuda:0``)."""
    out: dict[str, KernelEntry] = {}
    for k in kernels:
        first = out.setdefault(k.name, k)
        devices = [d for d in str(first.device or "").split(", ") if d]
        if k.device and k.device not in devices:
            out[k.name] = dataclasses.replace(first, device=", ".join([*devices, k.device]))
    return list(out.values())
