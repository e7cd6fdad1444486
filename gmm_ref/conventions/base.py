"""The convention template: one frozen object holds every fact of one kernel calling convention.

A :class:`Convention` states what a real kernel's API expresses (families,
layouts, batch dims, sharding, existing output), what it promises about the
elements it does not compute (tail, foreign rows, empty groups), its shape
constraints, the dtypes strategies draw for it and the framework its callers
use. The template turns those facts into :meth:`Convention.refusal` (why a
problem cannot be expressed) and :meth:`Convention.arguments` (a problem as
the kernel's own arguments). A subclass supplies only what is its own:
:meth:`~Convention.parse` (the kernel's signature, arguments -> problem),
:meth:`~Convention._arguments` (problem -> arguments) and, where a fact does
not fit a field, :meth:`~Convention._refusal`.

docs/conventions.md has the contract of each convention; docs/architecture.md
the recipe for adding one.
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from gmm_ref import dtypes as _dt
from gmm_ref import families as _families
from gmm_ref.exact import Reference, reference
from gmm_ref.layouts import stored
from gmm_ref.problem import FAMILIES, Problem
from gmm_ref.routed.gradients import GRADIENT_OUTPUTS, OUTPUTS, RoutedBackward

__all__ = [
    "PLAIN",
    "TRANSPOSES",
    "Convention",
    "Layout",
    "RoutedConvention",
    "front_end",
    "packed_layouts",
    "ragged_last",
]

#: ``(lhs_transposed, rhs_transposed, packed)``
Layout = tuple[bool, bool, bool]
PLAIN: tuple[Layout, ...] = ((False, False, False),)
TRANSPOSES: tuple[Layout, ...] = tuple((lt, rt, False) for lt in (False, True) for rt in (False, True))


def ragged_last(family: str, lhs_transposed: bool, rhs_transposed: bool) -> bool:
    """Whether some operand of this family and layout is ragged along its stored last axis."""
    facts = _families.get(family)
    return facts.ragged_last("lhs", lhs_transposed) or facts.ragged_last("rhs", rhs_transposed)


def packed_layouts(family: str) -> tuple[Layout, ...]:
    """Every transposition, with an operand ragged along its last axis stored packed (TE's storage)."""
    return tuple((lt, rt, ragged_last(family, lt, rt))
                 for lt, rt in ((False, False), (False, True), (True, False), (True, True)))


def _dtype_pairs(pairs: Any) -> tuple[tuple[np.dtype, np.dtype], ...]:
    return tuple((_dt.as_dtype(i, name="dtype_pairs", codes=True), _dt.as_dtype(o, name="dtype_pairs"))
                 for i, o in pairs)


@dataclass(frozen=True, eq=False)
class Convention:
    """The facts of one calling convention (see the module docstring).

    ``layouts`` holds ``(family, layouts)`` pairs; ``multiple_of`` holds
    ``(axis, requirement)`` pairs, ``axis`` one of ``"m"``, ``"k"``, ``"n"`` or
    ``"ragged"``, ``requirement`` an int, ``"tm"``/``"tk"``/``"tn"`` (that tile
    of the tiling) or ``"16B"`` (16 bytes of the input dtype).
    ``existing_policy`` is None when the convention takes no existing output;
    ``sharding`` says whether it takes ``group_offset`` / a subset of local groups.
    """

    name: str
    framework: str
    families: tuple[str, ...]
    layouts: tuple[tuple[str, tuple[Layout, ...]], ...]
    dtype_pairs: tuple[tuple[Any, Any], ...]
    tail: str = "zero"
    foreign: str = "zero"
    empty: str = "zero"
    existing_policy: str | None = None
    existing_argument: str | None = None
    #: every call passes the existing output (an output buffer whose rows no group writes keep their values)
    existing_required: bool = False
    sharding: bool = False
    max_batch_dims: int = 0
    full_sums: bool = False
    out_dtype_is_input: bool = False
    #: only the (input, output) pairs of ``dtype_pairs`` are taken (otherwise any output dtype is)
    listed_pairs_only: bool = False
    multiple_of: tuple[tuple[str, Any], ...] = ()
    default_tiling: tuple[int, int, int] | None = None
    default_families: tuple[str, ...] | None = None
    #: the arguments carry strides (torch tensors): lhs and rhs, its first two positional
    #: arguments, are passed in the problem's ``storage`` (contiguous, transposed view, slice, chunk)
    strided: bool = False
    #: the axes ("m", "k", "n") whose extent may be 0 (every one unless the API cannot take it)
    zero_extents: tuple[str, ...] = ("m", "k", "n")
    #: the (lhs, rhs) quantizations a scaled convention takes (``gmm_ref.Quantization``; None: that operand
    #: is not scaled); empty for a convention of unscaled operands
    quantizations: tuple[tuple[Any, Any], ...] = ()
    #: the parameter (of :meth:`parse`) that is an output buffer the kernel writes in place and returns nothing
    #: (DeepGEMM's ``d``); the arguments built here fill it with NaN, and its content after the call is the
    #: kernel's output (it is not an input the kernel must leave alone)
    out_argument: str | None = None
    summary: str = ""

    def __post_init__(self) -> None:
        object.__setattr__(self, "dtype_pairs", _dtype_pairs(self.dtype_pairs))
        bad = [f for f in self.families if f not in FAMILIES]
        if bad or not self.families:
            raise ValueError(f"families: expected some of {FAMILIES}, got {self.families!r}")
        if {f for f, _ in self.layouts} != set(self.families):
            raise ValueError(f"layouts: expected one entry per family of {self.families}")
        if self.framework not in ("jax", "torch"):
            raise ValueError(f"framework: expected 'jax' or 'torch', got {self.framework!r}")

    def __repr__(self) -> str:
        return f"<Convention {self.name}>"

    def quantizations_for(self, family: str) -> tuple[tuple[Any, Any], ...]:
        """The ``(lhs, rhs)`` quantizations it takes in ``family`` (a subclass narrows them per form)."""
        return self.quantizations

    @property
    def code_dtypes(self) -> frozenset[np.dtype]:
        """The element dtypes of the quantizations it takes (such operands come with scales)."""
        return frozenset(q.elem for pair in self.quantizations for q in pair if q is not None)

    @property
    def backward(self) -> bool:
        """Whether the kernel is a backward kernel (its output a gradient: its routings carry a cotangent)."""
        return self.output in GRADIENT_OUTPUTS

    def out_value(self, args: tuple, kwargs: dict) -> Any:
        """The value of :attr:`out_argument` among a call's ``args`` / ``kwargs`` (None if it has none)."""
        if self.out_argument is None:
            return None
        if self.out_argument in kwargs:
            return kwargs[self.out_argument]
        params = list(inspect.signature(self.parse).parameters)
        i = params.index(self.out_argument)
        return args[i] if i < len(args) else None

    # ------------------------------------------------------------------ facts
    def layouts_of(self, family: str) -> tuple[Layout, ...]:
        """The layouts this convention expresses for ``family`` (empty if none)."""
        return dict(self.layouts).get(family, ())

    def policies(self, family: str) -> dict[str, str]:
        """The tail / foreign / empty / existing-output policies of this convention's kernels."""
        return {"tail": self.tail if _families.get(family).takes_sizes else "zero", "foreign": self.foreign,
                "empty": self.empty, "existing_policy": self.existing_policy or "overwrite"}

    def axis_multiple(self, axis: str, family: str, tiling: tuple[int, int, int] | None, in_dtype: Any) -> int:
        """What the extent of ``axis`` ("m", "k" or "n") must be a multiple of."""
        ragged = _families.get(family).ragged
        tiling = tiling or self.default_tiling or (1, 1, 1)
        mult = 1
        for name, req in self.multiple_of:
            if name == axis or (name == "ragged" and axis == ragged):
                if req == "16B":
                    v = max(1, 16 // int(np.dtype(in_dtype).itemsize))
                elif isinstance(req, str):
                    v = int(tiling["mkn".index(req[1])])
                else:
                    v = int(req)
                mult = mult * v // math.gcd(mult, v)
        return mult

    # --------------------------------------------------------------- template
    def refusal(self, p: Problem) -> str | None:
        """None if this convention can express ``p`` with its policies, else the reason."""
        for rule in (self._shape_refusal, self._sharding_refusal, self._scale_refusal, self._policy_refusal,
                     self._refusal):
            reason = rule(p)
            if reason:
                return reason
        return None

    def arguments(self, p: Problem) -> tuple[tuple[Any, ...], dict[str, Any]]:
        """``(args, kwargs)`` of this convention's kernel for ``p`` (NumPy arrays)."""
        reason = self.refusal(p)
        if reason:
            raise ValueError(f"convention: {self.name!r} cannot express this problem: {reason}")
        args, kwargs = self._arguments(p)
        if self.strided:
            args = (stored(args[0], p.storage[0]), stored(args[1], p.storage[1]), *args[2:])
        return args, kwargs

    def parse(self, *args: Any, **kwargs: Any) -> Problem:
        """The problem a call of this convention's kernel describes (its own signature)."""
        raise NotImplementedError

    def reference(self, *args: Any, **kwargs: Any) -> Reference:
        """The reference of a call with these arguments."""
        return reference(self.parse(*args, **kwargs))

    # ------------------------------------------------------------------ hooks
    def _arguments(self, p: Problem) -> tuple[tuple[Any, ...], dict[str, Any]]:
        raise NotImplementedError

    def _refusal(self, p: Problem) -> str | None:
        """A refusal no field states (subclasses)."""
        return None

    # ------------------------------------------------------------ shared rules
    def _shape_refusal(self, p: Problem) -> str | None:
        if p.family not in self.families:
            return f"{self.name} expresses the families {self.families}, not {p.family!r}"
        if p.batch_ndim > self.max_batch_dims:
            most = "no batch dims" if not self.max_batch_dims else f"at most {self.max_batch_dims} batch dims"
            return f"{self.name} takes {most}, got batch_ndim={p.batch_ndim}"
        layout = (p.lhs_transposed, p.rhs_transposed, p.packed)
        if layout not in self.layouts_of(p.family):
            return (f"{self.name} takes the {p.family} layouts (lhs_transposed, rhs_transposed, packed) "
                    f"{list(self.layouts_of(p.family))}, not {layout}")
        if p.storage != ("contiguous", "contiguous") and not self.strided:
            return f"{self.name}'s arguments carry no strides (its operands are always contiguous), not {p.storage}"
        for operand, kind, rows in (("lhs", p.storage[0], p.m), ("rhs", p.storage[1], p.k)):
            why = self.storage_refusal(operand, kind, rows, p.lhs.dtype)
            if why:
                return why
        for i, axis in enumerate("mkn"):
            mult = self.axis_multiple(axis, p.family, p.tiling, p.lhs.dtype)
            extent = (p.m, p.k, p.n)[i]
            if extent == 0 and axis not in self.zero_extents:
                return f"{self.name} takes no {axis.upper()} = 0"
            if extent % mult:
                return f"{self.name} needs {axis.upper()}={extent} to be a multiple of {mult}{self._why(axis, p)}"
        return None

    def storage_refusal(self, operand: str, kind: str, rows: int, dtype: Any) -> str | None:
        """Why ``operand`` ("lhs" or "rhs") with ``rows`` rows in its last two axes cannot be passed stored as
        ``kind``, or None. Under a 16-byte stride rule a transposed view's row count sets a stride."""
        if kind == "transposed" and any(req == "16B" for _, req in self.multiple_of):
            step = max(1, 16 // int(np.dtype(dtype).itemsize))
            if rows % step:
                return (f"{self.name} needs every stride to be a multiple of 16 bytes: a transposed {operand} "
                        f"with {rows} rows of {np.dtype(dtype)} has a stride of {rows * np.dtype(dtype).itemsize}")
        return None

    def _why(self, axis: str, p: Problem) -> str:
        ragged = p.family_facts.ragged
        for name, req in self.multiple_of:
            if name == axis or (name == "ragged" and axis == ragged):
                return " (16 bytes of the input dtype)" if req == "16B" else f" (the tile {req})"
        return ""

    def _scale_refusal(self, p: Problem) -> str | None:
        have = (p.lhs_quant, p.rhs_quant)
        if not self.quantizations:
            return f"{self.name} takes no scaled (quantized) operands" if p.scaled else None
        if have == (None, None) and p.lhs.dtype in self.code_dtypes:
            return f"{self.name} takes {p.lhs.dtype} operands as codes with scales, not unscaled"
        if have not in self.quantizations:
            def text(pair: tuple[Any, Any]) -> str:
                if pair == (None, None):
                    return "unscaled operands"
                return " x ".join("unscaled" if q is None else q.describe() for q in pair)
            return (f"{self.name} takes the quantizations {', '.join(text(q) for q in self.quantizations)}, "
                    f"not {text(have)}")
        return None

    def _sharding_refusal(self, p: Problem) -> str | None:
        sharded = p.group_offset != 0 or p.num_local_groups != p.num_groups
        if sharded and not self.sharding:
            return f"{self.name} has no group_offset / sharded groups"
        return None

    def _policy_refusal(self, p: Problem) -> str | None:
        if p.existing_out is None and self.existing_required:
            return f"{self.name} always writes into an existing output ({self.existing_argument})"
        if p.existing_out is not None:
            if self.existing_policy is None:
                return f"{self.name} takes no existing output"
            if p.existing_policy != self.existing_policy:
                verb = "overwrites" if self.existing_policy == "overwrite" else "accumulates into"
                return f"{self.name} {verb} existing_out"
        facts = p.family_facts
        if (facts.ragged_out and not facts.serving and p.existing_out is None and self.tail == "undefined"
                and p.tail == "zero" and has_tail(p)):
            return f"{self.name} never writes the rows/columns past sum(group_sizes) (needs tail='undefined')"
        if facts.serving and self.tail == "undefined" and p.tail == "zero" and has_tail(p):
            return f"{self.name} leaves the rows of no group undefined (needs tail='undefined')"
        if facts.ragged_contraction and p.empty not in (self.empty, "undefined"):
            return f"{self.name} gives empty groups {self.empty!r} output blocks, not {p.empty!r}"
        if self.full_sums and has_tail(p):
            return f"{self.name} needs sum(group_sizes) equal to the ragged extent"
        if self.out_dtype_is_input and (p.out_dtype != p.lhs.dtype or p.lhs.dtype != p.rhs.dtype):
            return (f"{self.name}: out_dtype must equal the input dtype, got {p.lhs.dtype} x {p.rhs.dtype} "
                    f"-> {p.out_dtype}")
        if self.listed_pairs_only and (p.lhs.dtype, p.out_dtype) not in self.dtype_pairs:
            return (f"{self.name} takes the (input, output) dtypes "
                    f"{', '.join(f'{i}->{o}' for i, o in self.dtype_pairs)} only, got {p.lhs.dtype} -> {p.out_dtype}")
        return None


@dataclass(frozen=True, eq=False)
class RoutedConvention:
    """The facts of one routed MoE calling convention (a fused-MoE kernel's API, docs/routed.md): its kernel
    takes a :class:`gmm_ref.Routing` (tokens, expert weights, the routing and its metadata) rather than a
    grouped :class:`Problem`. A subclass supplies :meth:`parse` (its kernel's signature -> ``Routing``) and
    :meth:`_arguments` (``Routing`` -> its arguments); the template checks the facts (:meth:`refusal`).

    ``dtype_pairs``: the (tokens and experts, output) dtypes; ``weight_dtypes``: of ``topk_weights``;
    ``expert_layouts``: ``"enk"`` and/or ``"ekn"``; ``foreign``: what a slot routed to another rank's expert
    holds (``"zero"``, ``"undefined"``); ``distinct_experts``: the kernel's callers never list one expert twice
    in a token's slots (the strategies then draw none); ``block_size``: the alignment's block (``BLOCK_SIZE_M``)
    where the kernel's metadata pads each expert's slots; ``out_argument``: the output buffer written in place;
    ``expert_parallel``: False where the kernel has no expert map (every expert local; the strategies draw none),
    None where it takes one; ``extents``: the ``(K, N)`` pairs it takes (its tiles divide K, say; None: any).
    A kernel returning its output in another layout than ``[T, top_k, N]`` maps it in :meth:`per_slot`.
    ``output``: what the kernel returns, the per-slot ``"slots"`` ``[T, top_k, N]`` or the ``"combined"``
    ``[T, N]`` (the weighted sum over slots), or for a backward kernel a gradient of the routed gradient model
    (``gmm_ref.routed_gradients``: ``"d_slots"``, ``"d_tokens"``, ``"d_experts"``, ``"d_weights"``), its routings
    then :class:`gmm_ref.RoutedBackward` s (a routing with its cotangent); ``accumulates``: the backward kernel adds
    the experts' gradient into one it is given (``out_argument``; the routings carry that ``existing`` gradient);
    ``mul_routed_weight``: True or False where the kernel always or never multiplies the weights in (None: an
    argument says).
    """

    name: str
    framework: str
    dtype_pairs: tuple[tuple[Any, Any], ...]
    weight_dtypes: tuple[Any, ...] = ("float32",)
    expert_layouts: tuple[str, ...] = ("enk",)
    foreign: str = "zero"
    distinct_experts: bool = True
    block_size: int = 16
    out_argument: str | None = None
    expert_parallel: bool | None = None
    extents: tuple[tuple[int, int], ...] | None = None
    output: str = "slots"
    accumulates: bool = False
    mul_routed_weight: bool | None = None
    #: its family's name (``gmm_ref.families.ROUTED``): the main job's row of its kernels
    family: str = _families.ROUTED.name
    summary: str = ""

    #: a routed convention has no grouped families: every check of ``Convention.families`` finds none
    families: tuple[str, ...] = ()
    quantizations: tuple[tuple[Any, Any], ...] = ()
    sharding: bool = False

    def __post_init__(self) -> None:
        object.__setattr__(self, "dtype_pairs", _dtype_pairs(self.dtype_pairs))
        object.__setattr__(self, "weight_dtypes", tuple(_dt.as_dtype(d, name="weight_dtypes")
                                                        for d in self.weight_dtypes))
        if self.framework not in ("jax", "torch"):
            raise ValueError(f"framework: expected 'jax' or 'torch', got {self.framework!r}")
        if self.output not in OUTPUTS + GRADIENT_OUTPUTS:
            raise ValueError(f"output: expected one of {OUTPUTS + GRADIENT_OUTPUTS}, got {self.output!r}")
        if self.accumulates and self.output != "d_experts":
            raise ValueError("accumulates: only a kernel returning the experts' gradient ('d_experts') adds into one")

    def __repr__(self) -> str:
        return f"<RoutedConvention {self.name}>"

    @property
    def backward(self) -> bool:
        """Whether the kernel is a backward kernel (its output a gradient: its routings carry a cotangent)."""
        return self.output in GRADIENT_OUTPUTS

    def out_value(self, args: tuple, kwargs: dict) -> Any:
        """The value of :attr:`out_argument` among a call's ``args`` / ``kwargs`` (None if it has none)."""
        return Convention.out_value(self, args, kwargs)  # type: ignore[arg-type]

    def refusal(self, r: Any) -> str | None:
        """None if this convention can express the routing ``r``, else the reason."""
        if self.backward and not isinstance(r, RoutedBackward):
            return f"{self.name} is a backward kernel: it takes a routing with its cotangent (a gmm_ref.RoutedBackward)"
        if self.backward and self.accumulates != (r.existing is not None):
            return (f"{self.name} {'adds into' if self.accumulates else 'returns'} the experts' gradient: a routing "
                    f"{'with' if self.accumulates else 'without'} an existing experts' gradient")
        if r.expert_layout not in self.expert_layouts:
            return f"{self.name} takes experts stored {self.expert_layouts}, not {r.expert_layout!r}"
        pair = (np.dtype(r.tokens.dtype), np.dtype(r.out_dtype))
        if r.experts.dtype != r.tokens.dtype or pair not in self.dtype_pairs:
            pairs = ", ".join(f"{i}->{o}" for i, o in self.dtype_pairs)
            return (f"{self.name} takes the (input, output) dtypes {pairs}, got {r.tokens.dtype} x "
                    f"{r.experts.dtype} -> {r.out_dtype}")
        if r.topk_weights is not None and r.topk_weights.dtype not in self.weight_dtypes:
            return (f"{self.name} takes topk_weights of {[str(d) for d in self.weight_dtypes]}, not "
                    f"{r.topk_weights.dtype}")
        if r.foreign != self.foreign and r.foreign != "undefined":
            return f"{self.name} gives slots of another rank's experts {self.foreign!r} values, not {r.foreign!r}"
        if self.mul_routed_weight is not None and bool(r.mul_routed_weight) != self.mul_routed_weight:
            return f"{self.name}'s kernel {'always' if self.mul_routed_weight else 'never'} multiplies the weights in"
        if self.distinct_experts and r.repeats_an_expert:
            return f"{self.name}'s callers never list one expert twice in a token's slots"
        if self.expert_parallel is False and r.expert_map is not None:
            return f"{self.name} has no expert parallelism: every expert is local (no expert_map)"
        if self.extents is not None and (r.k, r.n) not in self.extents:
            return f"{self.name} takes the (K, N) extents {list(self.extents)}, not {(r.k, r.n)}"
        return self._refusal(r)

    def per_slot(self, out: Any, args: tuple, kwargs: dict) -> Any:
        """The per-slot output ``[T, top_k, N]`` of a call's ``out`` (NumPy; its arguments ``args`` / ``kwargs``
        as given to the kernel); the kernel's output is that already unless a convention says otherwise."""
        return out

    def arguments(self, r: Any) -> tuple[tuple[Any, ...], dict[str, Any]]:
        """``(args, kwargs)`` of this convention's kernel for the routing ``r`` (NumPy arrays)."""
        reason = self.refusal(r)
        if reason:
            raise ValueError(f"convention: {self.name!r} cannot express this routing: {reason}")
        return self._arguments(r)

    def parse(self, *args: Any, **kwargs: Any) -> Any:
        """The routing a call of this convention's kernel describes (its own signature)."""
        raise NotImplementedError

    def _arguments(self, r: Any) -> tuple[tuple[Any, ...], dict[str, Any]]:
        raise NotImplementedError

    def _refusal(self, r: Any) -> str | None:
        return None


def has_tail(p: Problem) -> bool:
    """Whether some ragged output rows/columns lie past ``sum(group_sizes)`` (the serving layouts: whether some
    output row belongs to no group)."""
    if p.group_sizes is None:
        return False
    groups = p.family_facts.groups
    if groups == _families.COUNTS:
        return bool(np.any(p.group_sizes < p.m))
    if groups == _families.ALIGNED:
        starts, ends = p.spans_at(())
        return int(np.sum(ends - starts)) < p.m
    return bool(np.any(p.group_sizes.sum(axis=-1) < p.ragged_extent))


def front_end(conv: Convention, name: str) -> Callable[..., Any]:
    """The public reference front-end of ``conv``: its kernel's signature plus ``with_reference``.

    Returns the reference values in the output dtype, or with
    ``with_reference=True`` the :class:`~gmm_ref.Reference` (values, mask, bound).
    """
    sig = inspect.signature(conv.parse)
    params = [*sig.parameters.values(),
              inspect.Parameter("with_reference", inspect.Parameter.KEYWORD_ONLY, default=False)]

    def call(*args: Any, with_reference: bool = False, **kwargs: Any) -> Any:
        if not isinstance(with_reference, bool):
            raise TypeError(f"with_reference: expected a bool, got {with_reference!r}")
        ref = conv.reference(*args, **kwargs)
        return ref if with_reference else ref.values

    call.__signature__ = sig.replace(parameters=params, return_annotation=Any)  # type: ignore[attr-defined]
    call.__name__ = call.__qualname__ = name
    call.__doc__ = conv.parse.__doc__
    call.__module__ = type(conv).__module__
    return call


# ------------------------------------------------------------- argument checks
def as_array(name: str, x: Any) -> np.ndarray:
    """An argument as NumPy (NumPy, jax, torch, lists), TypeError naming ``name`` otherwise."""
    if isinstance(x, np.ndarray):
        return x
    if type(x).__module__.startswith(("jax", "jaxlib", "torch")):
        return _dt.as_numpy(x, name=name)
    if isinstance(x, (list, tuple)):
        return np.asarray(x)
    raise TypeError(f"{name}: expected an array, got {type(x).__name__}")


def as_sizes(name: str, x: Any, *, ndim1: bool = True) -> np.ndarray:
    """Group sizes (or offsets): an integer array, 1-D unless ``ndim1=False``."""
    gs = as_array(name, x)
    if not np.issubdtype(gs.dtype, np.integer):
        raise TypeError(f"{name}: expected an integer array, got dtype {gs.dtype}")
    if ndim1 and gs.ndim != 1:
        raise ValueError(f"{name}: expected a 1-D array of G sizes, got shape {gs.shape}")
    return gs


def expect_ndim(name: str, x: np.ndarray, want: int | tuple[int, ...]) -> None:
    want_t = (want,) if isinstance(want, int) else want
    if x.ndim not in want_t:
        raise ValueError(f"{name}: expected {' or '.join(map(str, want_t))} dims, got shape {x.shape}")


def expect_grouped_nt(lhs_name: str, lhs: np.ndarray, rhs_name: str, rhs: np.ndarray) -> tuple[int, int, int, int]:
    """``(G, M, K, N)`` of ``[G, M, K]`` activations and ``[G, N, K]`` weights (a masked layout's operands, the
    weights transposed: "nt"); ValueError naming the argument otherwise."""
    expect_ndim(lhs_name, lhs, 3)
    expect_ndim(rhs_name, rhs, 3)
    g, m, k = lhs.shape
    if rhs.shape[0] != g or rhs.shape[2] != k:
        raise ValueError(f"{rhs_name}: expected [G={g}, N, K={k}], got {rhs.shape}")
    return g, m, k, rhs.shape[1]


def optional_dtype(name: str, value: Any) -> np.dtype | None:
    return None if value is None else _dt.as_dtype(value, name=name)


def sizes32(p: Problem) -> np.ndarray | None:
    """The problem's group sizes as int32 (None for the batch family)."""
    return None if p.group_sizes is None else p.group_sizes.astype(np.int32)
