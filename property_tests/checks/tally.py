"""What a mode's examples reached, counted as they run: :class:`Tally`.

``check_mode`` keeps one per mode: the examples checked, those the kernel declined (with the reasons), those that
raised an exception another check already reported, the relations the examples showed and the pairs of relations
they reached together in the covering design; a :class:`gmm_kernels.Result` is made from it.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import gmm_ref
from gmm_kernels import KernelAdapter
from property_tests.checks import failures
from property_tests.checks.causes import Evidence
from property_tests.checks.declared import Unsupported
from property_tests.strategies.design import pairs_of
from property_tests.strategies.routed_design import observe_routing

__all__ = ["Tally"]


class Tally:
    """What a mode's cells found so far: examples checked, declined and repeated, relations reached."""

    def __init__(self, evidence: Evidence | None = None) -> None:
        #: what each example did, by the traits of its problem (``property_tests.checks.causes``)
        self.evidence = evidence if evidence is not None else Evidence()
        self.checked = 0
        self.declined: list[str] = []
        self.repeated: list[tuple[str, BaseException]] = []
        self.coverage: Counter[str] = Counter()
        self.cells = (0, 0)  # cells run, cells in the design
        self.reached: set[tuple[str, frozenset]] = set()  # (family, pair) of relations checked together
        self.summary: tuple[tuple[int, int], tuple[str, ...]] = ((0, 0), ())

    def count(self, problem: gmm_ref.Problem, seen: dict[str, frozenset[str]], relations: list[str]) -> None:
        """One example checked (or, for coverage, drawn), with the relations it showed."""
        self.checked += 1
        self.coverage.update(relations)
        self.reached.update((problem.family, p) for p in pairs_of(seen))

    def count_routed(self, calls: tuple[gmm_ref.Routing, ...], block: int) -> None:
        """One routed example checked (``calls``: the routings of one shape called in turn), with the routed
        relations each showed (``property_tests.strategies.routed_design``)."""
        self.checked += 1
        for r in calls:
            seen = observe_routing(r, block)
            self.coverage.update(f"{f}={v}" for f, vs in seen.items() for v in vs)
            self.reached.update(("routed", p) for p in pairs_of(seen))

    def conclude(self, adapter: KernelAdapter, what: str) -> None:
        """After a mode's examples (``what``: problem, routing): :class:`failures.Repeated` if examples raised an
        exception another check reported, :class:`Unsupported` if the kernel declined every one."""
        if self.repeated:
            where, exc = self.repeated[0]
            raise failures.Repeated(
                f"raised again in {len(self.repeated)} of {len(self.repeated) + self.checked} examples, as in "
                f"{where} (reported there; not shrunk again): {failures.one_line(exc)}")
        if self.checked == 0:
            # the most frequent reason, the first given among equals (a set's order would follow the hash seed)
            reason = Counter(self.declined).most_common(1)[0][0] if self.declined else f"no {what} drawn"
            raise Unsupported(f"{adapter.name} declined every {what}: {reason}")

    def reached_fields(self) -> dict[str, Any]:
        """The :class:`Result` fields of what the examples reached."""
        return dict(examples=self.checked, coverage=tuple(sorted(self.coverage.items())), cells=self.cells,
                    pairs=self.summary[0], missing=self.summary[1])

    def pairs(self, designs: dict[str, Any]) -> tuple[tuple[int, int], tuple[str, ...]]:
        """(pairs reached, pairs in the ``designs`` (by family; a grouped ``Covering.designs``, or a routed
        design)) and the missing ones, described."""
        wanted = {(fam, p) for fam, d in designs.items() for p in d.pairs}
        missing = sorted(f"{fam}: " + " & ".join(f"{f}={v}" for f, v in sorted(p)) for fam, p in wanted - self.reached)
        return (len(wanted & self.reached), len(wanted)), tuple(missing)
