"""The modes a kernel is checked in, and the strategy of problems each draws for a kernel.

A *mode* is one kind of input a kernel must get right (exact integers bit for
bit, normal values within the bound, poisoned padding, all groups empty,
sharded groups with and without an existing output, other output dtypes,
gradients, several group sizes in turn for one shape). Each is a Hypothesis
property over the problems of one family that the kernel's convention can
express and the kernel declares it takes.

A :class:`Mode` is one object that carries all it means: the options of its
strategy, what it checks (the forward result, repeated for determinism, or the
gradients; or one fixed problem instead of drawn ones) and when it applies to a
kernel. Nothing outside this module branches on a mode's name: adding a mode is
one ``Mode`` in :data:`MODES` (or :data:`OPT_IN_MODES`) plus its tests.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from hypothesis import strategies as st

from gmm_kernels import KernelAdapter
from gmm_ref import dtypes as _dt
from gmm_ref import families
from gmm_ref.problem import SERVING_FAMILIES
from property_tests.checks import large, large_strided, real_k
from property_tests.checks.declared import Unsupported, problem_options, routing_options
from property_tests.strategies.cotangents import routed_backwards
from property_tests.strategies.problems import Covering, covering, problems
from property_tests.strategies.routed_design import RoutedCell, RoutedDesign
from property_tests.strategies.routing import routed_covering, routed_replays, routings

__all__ = ["ALL_MODES", "MODES", "OPT_IN_MODES", "Mode", "Unsupported", "mode_arguments", "mode_covering",
           "mode_routed_design", "mode_routings", "mode_strategy", "routed_plan"]


#: strategy options that change the values drawn, not the shapes: modes differing only in these share compiled shapes
_VALUE_OPTIONS = ("values", "all_empty")


@dataclass(frozen=True)
class Mode:
    """One kind of input: its strategy, what it checks and where it applies.

    - ``options`` go to :func:`property_tests.strategies.problems`;
    - ``needs_sharding``: it draws sharded groups (``group_offset``), which not every convention has;
    - ``deterministic_repeat``: a kernel declaring itself deterministic is run twice on each problem and must
      return the same bits;
    - ``gradient``: it checks ``adapter.vjp`` against ``gmm_ref.gradients`` instead of the forward result (a
      kernel without a gradient declines its problems);
    - ``cells``: it checks the deterministic problems of a list of cells built for the kernel
      (:mod:`property_tests.checks.scale`: group and row counts past real kernels' limits;
      :mod:`property_tests.checks.large`: offsets past 2**31) instead of drawing examples; a cell the kernel cannot take
      is left out with its reason, none: the mode is ``n/a``;
    - ``cell_runner``: ``(adapter, mode, family, check) -> (cells checked, {why: cells left out})``, which runs
      those cells (raising :class:`Unsupported` where it takes none); None: the scale mode's
      (``property_tests.checks.scale.run_cells``);
    - ``replays``: how many group-size vectors are checked per drawn problem, one call after the other on the
      same adapter with the same operands and shapes (a kernel that keeps the group sizes of its first call,
      e.g. a launch plan cached by shape or a captured CUDA graph replayed with stale sizes, fails the later
      ones); 1: one call per problem;
    - ``refuse``: ``(adapter, family) -> reason or None``, why the mode does not apply to a kernel (beyond
      what its strategy cannot draw);
    - ``routed_values``: for a routed MoE kernel (``gmm_kernels.base.RoutedKernelAdapter``), the values kind
      ``gst.routings`` draws in this mode; None: the mode does not apply to one, ``routed_why`` says why.
    """

    name: str
    doc: str
    options: dict[str, Any] = field(default_factory=dict)
    needs_sharding: bool = False
    deterministic_repeat: bool = False
    gradient: bool = False
    cells: bool = False
    cell_runner: Callable[..., tuple[int, dict[str, list[str]]]] | None = None
    replays: int = 1
    refuse: Callable[[KernelAdapter, str | None], str | None] | None = None
    routed_values: str | None = None
    routed_why: str = "no routed form of this mode"

    def applicable(self, adapter: KernelAdapter, family: str | None = None) -> str | None:
        """Why this mode does not apply to ``adapter`` (checked on ``family``, or all its families), or None."""
        if self.needs_sharding and not adapter.convention_facts.sharding:
            return f"{adapter.convention} has no group_offset (no sharded groups)"
        return None if self.refuse is None else self.refuse(adapter, family)

    @property
    def changes_shapes(self) -> bool:
        """Whether its problems have shapes of their own (else the ``exact`` mode's: one compilation serves both)."""
        return self.cells or any(k not in _VALUE_OPTIONS for k in self.options)

    @property
    def draws_examples(self) -> bool:
        """Whether it draws examples (else it checks problems built for the kernel, one per cell)."""
        return not self.cells


def _no_gradient(adapter: KernelAdapter, family: str | None) -> str | None:
    """Why ``adapter`` has no gradient to check, or None."""
    if all(f in SERVING_FAMILIES for f in adapter.families):
        return (f"{adapter.convention}: the {' / '.join(adapter.families)} layout has no gradient model "
                "(its kernels are inference kernels)")
    if adapter.convention_facts.quantizations:
        return (f"{adapter.convention} takes quantized operands: codes have no gradient (a quantized "
                "layer's backward is its own scaled GEMM)")
    if not _has_gradient(adapter):
        return f"{adapter.name}: no reverse-mode gradient in this adapter"
    return None


def _no_group_sizes(adapter: KernelAdapter, family: str | None) -> str | None:
    """Why ``adapter``'s problems have no group sizes to vary between calls, or None."""
    fams = (family,) if family is not None else adapter.families
    if not any(families.get(f).takes_sizes for f in fams):
        return f"the {' / '.join(fams)} family has no group sizes (every group is one whole matrix)"
    quantizations = adapter.convention_facts.quantizations
    # a convention of scaled and unscaled operands: its scaled problems are declined (strategies.replay_refusal)
    if quantizations and (None, None) not in quantizations:
        return (f"{adapter.convention} takes quantized operands only: their block scales follow the group sizes, "
                "so other sizes need other operands")
    return None


def _replayable(adapter: KernelAdapter, kwargs: dict[str, Any]) -> dict[str, Any]:
    """The strategy options that draw only problems whose group sizes can change under the same operands: the
    families with group sizes (not batch), and unscaled operands (block scales follow the group sizes)."""
    out: dict[str, Any] = {"families": tuple(f for f in kwargs.get("families", adapter.families)
                                             if families.get(f).takes_sizes)}
    facts = adapter.convention_facts
    if facts.quantizations:  # _no_group_sizes refused a convention of scaled operands only
        out["quantizations"] = ((None, None),)
        pairs = kwargs.get("dtypes") or facts.dtype_pairs
        codes = facts.code_dtypes
        out["dtypes"] = tuple(p for p in pairs if _dt.as_dtype(p[0], name="dtypes", codes=True) not in codes)
    return out


def _strided_cells(adapter: KernelAdapter, mode: Mode, family: str | None,
                   check: Callable[..., None]) -> tuple[int, dict[str, list[str]]]:
    """The strided mode's cells (``property_tests.checks.large_strided.run_cells``); :class:`Unsupported` with the
    reasons where the kernel takes none."""
    __tracebackhide__ = True
    if adapter.routed:
        raise Unsupported(mode.routed_why)
    checked, left_out = large_strided.run_cells(adapter, family)
    if not large_strided.cells(adapter):
        raise Unsupported(f"no strided cell: {large_strided.none_why(adapter)}")
    if not checked:
        raise Unsupported(f"{adapter.name} takes none of the strided cells: " + "; ".join(
            f"{', '.join(c)} ({why})" for why, c in left_out.items()))
    return checked, left_out


def _large_cells(adapter: KernelAdapter, mode: Mode, family: str | None,
                 check: Callable[..., None]) -> tuple[int, dict[str, list[str]]]:
    """The large mode's cells (``property_tests.checks.large.run_cells``); :class:`Unsupported` where the kernel
    takes none."""
    __tracebackhide__ = True
    try:
        return large.run_cells(adapter, mode, family, check)
    except large.TooLarge as exc:
        raise Unsupported(str(exc)) from None


MODES: dict[str, Mode] = {
    m.name: m
    for m in (
        Mode("exact", "small integers: the result is exact, so it must match bit for bit",
             {"values": "exact"}, deterministic_repeat=True, routed_values="exact"),
        Mode("normal", "normal values within the per-element bound", {"values": "normal"}, routed_values="normal"),
        Mode("wide", "subnormals up to values near the output's overflow, within the bound",
             {"values": "wide"}, routed_values="wide"),
        Mode("poisoned", "NaN/Inf in rows and columns of no group must not reach the output",
             {"values": "poisoned"}, routed_values="poisoned"),
        Mode("all_empty", "every group empty: the output is all tail / all zero blocks",
             {"values": "exact", "all_empty": True},
             routed_why="routed: T = 0, experts without slots and ranks without local experts are drawn in every "
                        "mode"),
        Mode("many_groups", "9 to 64 groups: more groups than tiles, indices past small fixed tables",
             {"values": "exact", "min_groups": 9, "max_groups": 64},
             routed_why="routed: many experts (by default up to 513, past 256) are drawn in every mode"),
        Mode("sharded", "group_offset / num_local_groups without an existing output",
             {"values": "exact", "sharding": True}, needs_sharding=True,
             routed_why="routed: expert parallelism (an expert_map, other ranks' experts) is drawn in every mode"),
        Mode("sharded_existing", "sharded groups writing into an existing output",
             {"values": "exact", "sharding": True, "existing_out": True},
             needs_sharding=True, routed_why="routed: the kernel writes every slot of its output (no existing "
                                             "output to keep)"),
        Mode("grad", "reverse-mode gradients w.r.t. lhs, rhs and existing_out, against gmm_ref.gradients",
             {"values": "normal", "dtypes": ("float32", "bfloat16", "float16")}, gradient=True, refuse=_no_gradient,
             routed_why="routed: not differentiated; a routed backward is a kernel of its own (a convention "
                        "returning a gradient of gmm_ref.routed_gradients: unsloth.grouped_gemm_dX, _dW)"),
        Mode("out_dtype", "every output dtype the convention takes, exact shape and dtype",
             {"values": "normal", "vary_out_dtype": True},
             routed_why="routed: every (input, output) dtype pair of the convention is drawn in every mode"),
        Mode("graph", "one shape, 4 group-size vectors in turn on the same kernel, then the last again, in the same "
             "buffers with new contents: later calls must not reuse the first call's group sizes or a result kept by "
             "the buffers' addresses (a launch plan cached by shape, a replayed CUDA graph)",
             {"values": "exact"}, replays=4, refuse=_no_group_sizes, routed_values="exact"),
        Mode("real_k", "the K of real MoE layers: 2,048, 7,168, 4,097 (no tile divides it) and 129 groups at 2,048, "
             "normal values under the per-element bound (property_tests.checks.real_k)", cells=True,
             cell_runner=real_k.run_cells,
             routed_why="routed: the K of real layers in routings is not built yet"),
        Mode("strided", "element offsets past 2**31 in a small problem: one operand (or the output buffer) a view "
             "whose rows or groups lie 2**26 or 2**30 elements apart in a lazily committed allocation, a few MiB "
             "touched (property_tests.checks.large_strided)", cells=True, cell_runner=_strided_cells,
             routed_why="routed: int32 slot offsets past 2**31 are the scale mode's offsets cell "
                        "(property_tests.checks.scale_offsets)"),
        Mode("scale", "group counts just past real limits (129 to 1,025) and 65,600 rows in one call and in one "
             "group, K and N a few dozen, exact values (property_tests.checks.scale)", cells=True,
             routed_why="routed: the scale mode's routed cells are built, not drawn "
                        "(property_tests.checks.scale_routed)"),
    )
}


#: modes a run leaves out unless asked for by name (``--modes large``, ``check_kernel(modes=[...])``)
OPT_IN_MODES: dict[str, Mode] = {
    "large": Mode("large", "element offsets past 2**31, where int32 offsets overflow: the strided mode's views and "
                  "an operand past 2**31 elements (several GiB) (opt-in; "
                  "property_tests.checks.large)", cells=True, cell_runner=_large_cells,
                  routed_why="routed: int32 slot offsets past 2**31 are the scale mode's offsets cell "
                             "(property_tests.checks.scale_offsets: no 2**31 elements needed)"),
}
ALL_MODES: dict[str, Mode] = {**MODES, **OPT_IN_MODES}

def mode_of(mode: Mode | str) -> Mode:
    if isinstance(mode, Mode):
        return mode
    if mode not in ALL_MODES:
        raise ValueError(f"modes: unknown mode {mode!r}; expected some of {sorted(ALL_MODES)}")
    return ALL_MODES[mode]


def _dtypes(mode_dtypes: Any, adapter: KernelAdapter) -> Any:
    """The dtype pairs to draw: the kernel's (its declared ones, else its convention's), narrowed
    to the mode's dtypes (each ``x`` meaning the pair ``(x, x)``) when the mode names some."""
    declared = adapter.limits().dtypes
    if mode_dtypes is None:
        return declared
    mine = declared if declared is not None else adapter.convention_facts.dtype_pairs
    wanted = {str(d) for d in mode_dtypes}
    narrowed = tuple(pr for pr in mine if str(pr[0]) == str(pr[1]) and str(pr[0]) in wanted)
    if not narrowed:
        raise Unsupported(f"{adapter.name} takes none of the {mode_dtypes} inputs this mode draws")
    return narrowed


def _has_gradient(adapter: KernelAdapter) -> bool:
    """False where the adapter can say up front that it has no gradient (so no problem is drawn for it)."""
    if type(adapter).vjp is not KernelAdapter.vjp:
        return True
    try:
        return adapter.differentiable_fn() is not None
    except ImportError:  # its framework is missing: the check says so elsewhere
        return True


def _takes_another_output(adapter: KernelAdapter, dtypes: Any) -> None:
    """Raise :class:`Unsupported` naming why, when the kernel returns no dtype other than its input's."""
    pairs = adapter.convention_facts.dtype_pairs if dtypes is None else dtypes
    if any(str(i) != str(o) for i, o in pairs):
        return
    refused = (adapter.dtype_refusal(i, i, o) for i, o in adapter.convention_facts.dtype_pairs if str(i) != str(o))
    reason = next((r for r in refused if r is not None), None)
    if reason is not None:  # else the strategies say that the convention has no such pair
        raise Unsupported(f"{adapter.name} returns no dtype other than its input's: {reason}")


def mode_strategy(adapter: KernelAdapter, mode: Mode | str, family: str | None = None) -> st.SearchStrategy:
    """Problems in ``adapter``'s convention for ``mode``, within what the kernel declares it takes."""
    return problems(**mode_arguments(adapter, mode, family))


def mode_covering(adapter: KernelAdapter, mode: Mode | str, family: str | None = None) -> Covering:
    """The covering design of ``mode`` for ``adapter``: cells that reach every pair of relations the
    kernel's convention and declared scope can express (``property_tests.strategies.design``)."""
    return covering(**mode_arguments(adapter, mode, family))


def mode_arguments(adapter: KernelAdapter, mode: Mode | str, family: str | None = None) -> dict[str, Any]:
    """The ``problems()`` arguments of ``mode`` for ``adapter`` (its declared options and scope applied)."""
    mode = mode_of(mode)
    if not mode.draws_examples:
        raise Unsupported(f"the {mode.name} mode draws no examples (it checks problems built for the kernel)")
    why = mode.applicable(adapter, family)
    if why is not None:
        raise Unsupported(why)
    kwargs = dict(mode.options)
    declared = problem_options(adapter)
    for option, what in (("sharding", "sharded groups (group_offset)"), ("existing_out", "an existing output")):
        if kwargs.get(option) and declared.get(option) is False:
            why = adapter.option_refusal(option)
            raise Unsupported(f"{adapter.name} takes no {what}" + (f": {why}" if why else ""))
    # group counts: the mode's range narrowed to what the kernel takes; dtypes: the intersection
    lo = max(kwargs.get("min_groups", 1), declared.pop("min_groups", 1))
    hi = min(kwargs.get("max_groups", 8), declared.pop("max_groups", 1 << 30))
    if lo > hi:
        raise Unsupported(f"{adapter.name} takes at most {hi} groups; the {mode.name} mode needs {lo}")
    dtypes = _dtypes(kwargs.get("dtypes"), adapter)
    if kwargs.get("vary_out_dtype"):
        _takes_another_output(adapter, dtypes)
    declared.pop("dtypes", None)
    kwargs.update(declared, min_groups=lo, max_groups=hi)
    if dtypes is not None:
        kwargs["dtypes"] = dtypes
    if adapter.tiling is not None:
        kwargs["tiling"] = adapter.tiling
    if family is not None:
        kwargs["families"] = (family,)
    elif adapter.families != adapter.convention_facts.families:
        kwargs["families"] = adapter.families
    if mode.replays > 1:  # replays vary the group sizes of one problem's operands: problems that can have others
        kwargs.update(_replayable(adapter, kwargs))
    return dict(convention=adapter.convention, **kwargs)


def mode_routed_design(adapter: KernelAdapter) -> RoutedDesign:
    """The covering design of routed relations of a routed kernel's routings (``gst.routed_covering``; one for
    every mode: the modes differ in values, not in relations)."""
    return routed_covering(**routing_options(adapter))


def routed_plan(adapter: KernelAdapter, mode: Mode | str
                ) -> tuple[RoutedDesign, Callable[[RoutedCell], st.SearchStrategy]]:
    """A routed kernel's run of ``mode``: its design (:func:`mode_routed_design`) and each cell's routings."""
    return mode_routed_design(adapter), lambda cell: mode_routings(adapter, mode, cell)


def mode_routings(adapter: KernelAdapter, mode: Mode | str, cell: RoutedCell | None = None) -> st.SearchStrategy:
    """The routings (``gst.routings``) ``mode`` draws for a routed kernel, within its convention and declared
    limits, in one ``cell`` of :func:`mode_routed_design` (None: any); a backward kernel's: their backward
    (``gst.routed_backwards``, with the existing experts' gradient its convention adds into). :class:`Unsupported`
    naming why where the mode does not apply to a routed kernel."""
    mode = mode_of(mode)
    if mode.routed_values is None:
        raise Unsupported(mode.routed_why)
    drawn = routings(values=mode.routed_values, cell=cell, **routing_options(adapter))
    conv = adapter.convention_facts
    if mode.replays > 1:  # one shape, new routings in turn (the graph mode)
        if conv.backward:
            raise Unsupported("routed: a backward kernel's routings in turn are not drawn yet")
        return routed_replays(drawn, mode.replays, distinct_experts=conv.distinct_experts,
                              block_size=conv.block_size)
    if not conv.backward:
        return drawn
    return routed_backwards(drawn, values=mode.routed_values, existing=conv.accumulates)
