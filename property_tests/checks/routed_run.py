"""A routed MoE kernel's checks: routings drawn by ``property_tests.strategies.routing`` within its convention and
declared limits, each judged against the routed reference (the token, slot and expert of the first wrong element
named). ``check_mode`` runs a routed kernel's drawn modes here, over the cells of its covering design of routed
relations (``property_tests.strategies.routed_design``); the ``scale`` cells judge through :func:`check_routed` too.
"""

from __future__ import annotations

import contextlib
import zlib
from collections.abc import Callable
from typing import TYPE_CHECKING

import numpy as np
from hypothesis import given
from hypothesis import seed as hypothesis_seed
from hypothesis.database import ExampleDatabase

import gmm_ref
from gmm_kernels import KernelAdapter
from gmm_kernels.sandbox import cuda_graph, device, host, routed_graph, tamper
from gmm_ref.routed.compare import routed_element
from property_tests.checks import failures
from property_tests.checks.profiles import pinned_constants
from property_tests.checks.profiles import profile as profile_settings
from property_tests.checks.tiers import budgets, cell_settings

if TYPE_CHECKING:
    from hypothesis.strategies import SearchStrategy

    from property_tests.checks.modes import Mode
    from property_tests.checks.tally import Tally
    from property_tests.checks.tiers import Tier
    from property_tests.strategies.routed_design import RoutedCell, RoutedDesign

__all__ = ["check_routed", "run_routed"]


def _routing_note(r: gmm_ref.Routing) -> str:
    """What a routed failure was drawn on: the routing's static facts and its ids (the values are the drawn ones)."""
    with np.printoptions(threshold=200, linewidth=120):
        emap = "none" if r.expert_map is None else np.array2string(r.expert_map, separator=", ")
        return (f"{r.describe()}\ntopk_ids = {np.array2string(r.topk_ids, separator=', ')}\n"
                f"expert_map = {emap}")


def check_routed(adapter: KernelAdapter, routing: gmm_ref.Routing, mode: Mode) -> None:
    """A routed kernel's output (per slot or combined, as its convention says) against the routed reference
    (``gmm_ref.assert_routed_matches``: the token, slot and expert of the first wrong element named); run twice
    for a deterministic kernel in a mode that asks, bit for bit."""
    __tracebackhide__ = True
    numerics = adapter.numerics_for(routing)
    try:
        with tamper.sealed(routing, adapter.name):
            out = adapter.run(routing)
        ref = adapter.reference_for(routing)  # once the kernel has returned (as _check_forward's)
        output = adapter.convention_facts.output
        gmm_ref.assert_routed_matches(out, ref, numerics=numerics, kernel=adapter.name, output=output)
        if mode.deterministic_repeat and adapter.deterministic:
            again = adapter.run(routing)
            bits = f"u{out.dtype.itemsize}"
            differ = np.argwhere(np.ascontiguousarray(out).view(bits) != np.ascontiguousarray(again).view(bits))
            if differ.size:
                raise gmm_ref.Mismatch(f"{routed_element(routing, output, differ[0])}: a second call returned other "
                                       f"bits ({adapter.name} declares itself deterministic)", kind="determinism")
    except Exception as exc:
        exc.add_note(_routing_note(routing))
        failures.attach(exc, problem=routing, numerics=numerics)  # its reproducer
        raise


def check_calls(adapter: KernelAdapter, calls: tuple[gmm_ref.Routing, ...], mode: Mode) -> None:
    """:func:`check_routed` of each routing in turn on the same kernel; a failure of a later one names the call and
    the routings before it (its reproducer makes those calls first). On a CUDA device, a torch kernel's calls again
    as replays of one captured CUDA graph (``gmm_kernels.sandbox.routed_graph``); ``cuda_graph.NotCapturable``
    where the call cannot be captured."""
    __tracebackhide__ = True
    for i, routing in enumerate(calls):
        try:
            check_routed(adapter, routing, mode)
        except Exception as exc:
            if i:
                exc.add_note(f"Call {i + 1} of {len(calls)} on the same kernel, one shape (T={routing.num_tokens}, "
                             f"top_k={routing.top_k}, {routing.num_experts} experts), new topk_ids and weights: the "
                             f"calls before it passed; this one failed: metadata kept from an earlier call (sorted "
                             "ids, counts per expert cached by shape, a count read on the host once, a replayed CUDA "
                             "graph)? The reproducer makes the calls before it.")
                failures.extend_recipe(exc, before_routings=calls[:i])
                if isinstance(exc, gmm_ref.Mismatch):  # the one line names the call
                    exc.args = (f"call {i + 1} of one routing shape: {exc.args[0]}", *exc.args[1:])
            raise
    if len(calls) > 1 and adapter.convention_facts.framework == "torch" and device.on_cuda():
        if host.hosted(adapter):  # a capture here would record none of the kernel's work: it runs elsewhere
            raise cuda_graph.NotCapturable("runs in a process of its own, where its CUDA graph capture is not made "
                                           "(its eager calls passed; --in-process captures it)")

        def attach(exc: BaseException, replay: int) -> None:
            routing = calls[replay - 1]
            failures.attach(exc, problem=routing, numerics=adapter.numerics_for(routing))
            failures.extend_recipe(exc, before_routings=calls[:replay - 1])

        routed_graph.check_routed_replays(adapter, calls, capture=cuda_graph.cuda_capture, on_failure=attach)


def _budgets(adapter: KernelAdapter, max_examples: int | None, profile: str | None, cells: int,
             tier: Tier | None) -> list[int]:
    """Routings per cell: a tier's ``per_cell``, else the profile's spread as the grouped cells' are; an explicit
    limit (``max_examples``, or the kernel's own cap) below two a cell gives every cell one while it lasts, then
    none (a cell's first routing, its simplest, still shows the cell's relations)."""
    limits = [x for x in (max_examples, adapter.max_examples) if x is not None]
    if not limits or min(limits) >= 2 * cells or (tier is not None and tier.per_cell is not None):
        return budgets(max_examples, profile, adapter.max_examples, cells, tier.per_cell if tier else None)
    n = min(limits)
    return [n // cells + (i < n % cells) for i in range(min(n, cells))]


def run_routed(adapter: KernelAdapter, mode: Mode, design: RoutedDesign,
               strategy_of: Callable[[RoutedCell], SearchStrategy], tally: Tally, max_examples: int | None,
               profile: str | None, seed: int | None = None, database: ExampleDatabase | None = None,
               run: failures.CheckRun | None = None, tier: Tier | None = None, dry: bool = False,
               start: int = 0) -> Tally:
    """Run ``mode``'s property on a routed kernel over the cells of ``design``, its covering design of routed
    relations (from the ``start``-th cell on), each cell's routings from ``strategy_of(cell)`` (within its
    convention and declared limits), each routing checked by :func:`check_routed` (``dry``: drawn and counted, no
    kernel called) and counted in ``tally`` with the relations it showed. A failure names its cell's place
    (``failures.POSITION``): the search for another cause goes on from there."""
    __tracebackhide__ = True
    run = run if run is not None else failures.CheckRun()
    per_cell = _budgets(adapter, max_examples, profile, len(design.cells), tier)
    tally.cells = (len(per_cell), len(design.cells))
    block = adapter.convention_facts.block_size

    def check(drawn: gmm_ref.Routing | tuple[gmm_ref.Routing, ...]) -> None:
        __tracebackhide__ = True
        calls = drawn if isinstance(drawn, tuple) else (drawn,)  # the graph mode: new routings of one shape in turn
        reason = next((r for r in map(adapter.supports, calls) if r is not None), None)
        if reason is not None:
            tally.declined.append(reason)
            return
        try:
            if not dry:
                check_calls(adapter, calls, mode)
        except cuda_graph.NotCapturable as exc:  # a refusal: its eager calls passed
            tally.declined.append(f"{adapter.name} {exc}")
            return
        except Exception as exc:
            where = run.seen_before(adapter, exc)
            if where is None:
                tally.evidence.add(calls[0], exc)
                failures.attach_again(exc, lambda: check_calls(adapter, calls, mode))
                run.found(adapter, mode.name, f"routed / {mode.name}", exc)  # said now, before shrinking
                raise
            tally.repeated.append((where, exc))
            tally.evidence.add(calls[0], exc)
            return
        tally.count_routed(calls, block)
        tally.evidence.add(calls[0])

    def routed(routing: gmm_ref.Routing) -> None:
        check(routing)

    for i, (cell, n) in enumerate(zip(design.cells, per_cell, strict=False)):
        if i < start:
            continue
        prop = given(routing=strategy_of(cell))(routed)
        name = f"gmm-harness {adapter.name} {adapter.convention} {mode.name} routed {cell.describe()}"
        if seed is not None or profile_settings(profile).derandomize:
            cell_seed = zlib.crc32(f"routed {cell.describe()}".encode()) ^ (seed or 0) ^ i
            prop = cell_settings(profile, n, True, database, name)(hypothesis_seed(cell_seed)(prop))
        else:
            prop = cell_settings(profile, n, False, database, name)(prop)
        try:
            with pinned_constants():
                prop()
        except Exception as exc:
            with contextlib.suppress(AttributeError):
                setattr(exc, failures.POSITION, i)
            raise
    tally.conclude(adapter, "routing")
    tally.summary = tally.pairs({"routed": design})
    return tally
