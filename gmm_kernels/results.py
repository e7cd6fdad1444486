"""What checking a kernel found: one :class:`Result` per (kernel, check), gathered in a :class:`Report`.

A *check* is a property mode (``exact``, ``normal``, ... see
``property_tests.checks.modes``) run on one family, or one golden case. The same
result type serves ``check_kernel``, the pytest plugin, the main job's table
and the goldens.
"""

from __future__ import annotations

import enum
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

__all__ = ["Report", "Result", "Status"]


class Status(enum.Enum):
    """The verdict of one check; the value is how the main job's table shows it."""

    PASSED = "pass"
    FAILED = "FAIL"
    UNSUPPORTED = "n/a"
    KNOWN_BUG = "known bug"
    #: a failure that some calls of the same problem show and others do not (``detail`` says how many)
    INTERMITTENT = "INTERMITTENT"
    #: the kernel changed the harness during a call: replaced a function it judges with, left a thread or a
    #: process running (``gmm_kernels.sandbox.tamper``)
    TAMPERED = "TAMPERED"

    @property
    def verdict(self) -> str:
        """The verdict's stable name in JSON (``--json``, an RL loop's reward): ``pass``, ``fail``, ``n/a``,
        ``known_bug``, ``intermittent``, ``tampered``."""
        return _VERDICTS[self.name]

    @property
    def failure(self) -> bool:
        """Whether this verdict is a failure of the kernel (failed, failed on some calls only, tampered)."""
        return self in (Status.FAILED, Status.INTERMITTENT, Status.TAMPERED)


_VERDICTS = {"PASSED": "pass", "FAILED": "fail", "UNSUPPORTED": "n/a", "KNOWN_BUG": "known_bug",
             "INTERMITTENT": "intermittent", "TAMPERED": "tampered"}


@dataclass(frozen=True)
class Result:
    """One check of one kernel.

    ``detail`` is the reason (unsupported), the upstream bug (known bug) or the
    one-line cause (failed); ``error`` the exception the check raised (a
    ``gmm_ref.Mismatch`` carrying its report, reproducer and ``comparison``, or
    whatever the kernel raised); ``examples`` how many examples (or golden
    cases) were checked.
    """

    kernel: str
    check: str
    status: Status
    family: str | None = None
    examples: int = 0
    detail: str = ""
    error: BaseException | None = field(default=None, repr=False, compare=False)
    seconds: float = 0.0
    #: how values were judged: "bit-for-bit", "bound", "shape" (when known)
    criterion: str = ""
    #: how the examples were chosen: a Hypothesis profile or a seed
    setting: str = ""
    #: the relations the checked examples reached ("factor=level", examples), see
    #: ``property_tests.strategies.design``
    coverage: tuple[tuple[str, int], ...] = field(default=(), compare=False)
    #: the covering design's cells run and in all, and its pairs of relations reached and in all
    cells: tuple[int, int] = field(default=(0, 0), compare=False)
    pairs: tuple[int, int] = field(default=(0, 0), compare=False)
    #: the design's pairs no checked example reached ("family: factor=level & factor=level")
    missing: tuple[str, ...] = field(default=(), compare=False)
    #: the distinct causes the check shrank, in the order found: each a record of its key, line, check, smallest
    #: problem, the kernel's raising frame and reproducer (``property_tests.checks.causes``)
    causes: tuple[Mapping[str, str], ...] = field(default=(), compare=False, repr=False)
    #: the traits of the problems checked, counted under what each example did (``""``: passed; else a cause's key)
    evidence: Mapping[str, Mapping[str, int]] = field(default_factory=dict, compare=False, repr=False)

    @property
    def comparison(self) -> Any:
        """The structured mismatch (``gmm_ref.Comparison``) of a failure, if it was a mismatch."""
        return getattr(self.error, "comparison", None)

    @property
    def ok(self) -> bool:
        """Nothing failed: passed, unsupported, or a known upstream bug still caught."""
        return not self.status.failure

    def coverage_report(self) -> str:
        """What the checked examples reached: cells and pairs of the covering design, the pairs never
        reached, and each relation with its example count ('' when nothing was recorded)."""
        if not self.cells[1]:
            return ""
        pairs = f" reached {self.pairs[0]} of {self.pairs[1]} pairs of relations" if self.pairs[1] else ""
        lines = [f"{self.examples} examples in {self.cells[0]} of {self.cells[1]} cells{pairs}"]
        lines += [f"  never reached: {m}" for m in self.missing[:20]]
        if len(self.missing) > 20:
            lines.append(f"  ... and {len(self.missing) - 20} more pairs never reached")
        if self.coverage:
            lines.append("  relations: " + ", ".join(f"{r} ({n})" for r, n in self.coverage))
        return "\n".join(lines)

    def cell(self) -> str:
        """The main job's table cell: ``pass (n)``, ``FAIL: cause``, ``n/a: reason``, ``known bug: ...``."""
        if self.status is Status.PASSED:
            partial = f"; {self.cells[0]}/{self.cells[1]} cells" if self.cells[0] < self.cells[1] else ""
            return f"pass ({self.examples}{partial})"
        return f"{self.status.value}: {self.detail}"

    def line(self) -> str:
        """One line: ``PASS kernel :: check [family] (criterion): detail``."""
        fam = f" [{self.family}]" if self.family else ""
        crit = f" ({self.criterion})" if self.criterion and self.status is Status.PASSED else ""
        detail = f": {self.detail}" if self.detail else ""
        return f"{self.status.name:<11} {self.kernel} :: {self.check}{fam}{crit}{detail}"

    def full_report(self) -> str:
        """The whole failure report with its notes (the reproducer), or the cell text."""
        if self.error is None:
            return self.cell()
        notes = "\n".join(getattr(self.error, "__notes__", []))
        err = self.error
        text = str(err) if isinstance(err, AssertionError) else f"{type(err).__name__}: {err}"
        return text + ("\n" + notes if notes else "")

    def raise_for_status(self) -> None:
        """Re-raise the failure (and a still-caught known bug), else return."""
        __tracebackhide__ = True
        if (self.status.failure or self.status is Status.KNOWN_BUG) and self.error is not None:
            raise self.error


@dataclass(frozen=True)
class Report:
    """Every check of one kernel, in order."""

    kernel: str
    results: tuple[Result, ...]
    #: the tier the checks ran (``property_tests.checks.tiers``), "" where none was named
    tier: str = ""
    #: the distinct causes of the kernel's failures over its checks, each with the checks it showed in, its smallest
    #: problem, reproducer and, for a problem the kernel may simply not take, the declaration that scopes it out
    #: (``property_tests.checks.causes.summarize``)
    causes: tuple[Mapping[str, Any], ...] = ()

    def __iter__(self) -> Iterator[Result]:
        return iter(self.results)

    def __len__(self) -> int:
        return len(self.results)

    @property
    def ok(self) -> bool:
        return all(r.ok for r in self.results)

    @property
    def failures(self) -> tuple[Result, ...]:
        return tuple(r for r in self.results if r.status.failure)

    def by_check(self) -> dict[str, Result]:
        """``{check: result}`` (the last result of each check when several families ran)."""
        return {r.check: r for r in self.results}

    def count(self, status: Status) -> int:
        return sum(r.status is status for r in self.results)

    def summary(self) -> str:
        return ", ".join(f"{self.count(s)} {s.name.lower().replace('_', ' ')}" for s in Status)

    def reached(self) -> tuple[tuple[int, int], tuple[int, int]]:
        """The covering designs' cells run and in all, and their pairs of relations reached and in all, summed over
        the results."""
        return ((sum(r.cells[0] for r in self.results), sum(r.cells[1] for r in self.results)),
                (sum(r.pairs[0] for r in self.results), sum(r.pairs[1] for r in self.results)))
