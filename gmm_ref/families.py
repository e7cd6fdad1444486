"""The families of grouped GEMM: one fact record each, in one registry.

A family says how the groups of a grouped GEMM lie in its operands: along which logical axis the groups are ragged
(``m``, ``n``, ``k`` or none), which operands carry a leading group axis, how the groups are expressed (contiguous
sizes, whole matrices, a valid row count per group's own matrix, aligned offsets), whether it is a serving layout,
and what the gradient with respect to each operand is. Everything that used to branch on a family's name reads these
facts instead (``docs/architecture.md``, "Adding a family"); nothing outside this module compares a family's name.

>>> get("ragged_m").ragged, get("ragged_m").shape("rhs", m=8, k=4, n=2, groups=3)
('m', (3, 4, 2))
>>> get("ragged_x")
Traceback (most recent call last):
...
ValueError: family: expected one of ('ragged_m', 'ragged_n', 'ragged_k', 'batch', 'masked', 'padded_contiguous'), \
got 'ragged_x'; did you mean ragged_m or ragged_n or ragged_k?

The names are public (``families=["ragged_m"]``, ``Problem.family``); the records are what the code reads.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from gmm_ref.names import did_you_mean

__all__ = ["ALIGNED", "COUNTS", "OFFSETS", "ROUTED", "ROUTING", "WHOLE", "Family", "get", "names", "ragged_names",
           "routed_names", "serving_names"]

#: how the groups are expressed: sizes of contiguous ranges along the ragged axis (offsets = prefix sums)
OFFSETS = "offsets"
#: every group is one whole matrix (no sizes)
WHOLE = "whole"
#: a valid row count per group's own matrix (the first ``size`` rows of it)
COUNTS = "counts"
#: sizes of ranges along the ragged axis, each starting at a multiple of ``Problem.alignment``
ALIGNED = "aligned"
#: per-slot expert ids (``topk_ids``): each token's rows gathered per expert, scattered back to its slots
ROUTING = "routing"

#: the logical axes of each operand, in its canonical ``[rows, cols]`` orientation
DIMS = {"lhs": ("m", "k"), "rhs": ("k", "n"), "out": ("m", "n")}
#: how a report names a group's range along each ragged axis
AXIS_WORDS = {"m": "rows", "n": "columns", "k": "K range"}


@dataclass(frozen=True)
class Family:
    """The facts of one family (see the module docstring)."""

    name: str
    #: the logical axis the groups split ("m", "n", "k"), None for whole matrices
    ragged: str | None
    #: the operands ("lhs", "rhs", "out") stored with a leading axis of the local groups
    grouped: tuple[str, ...]
    #: how the group sizes are expressed: OFFSETS, WHOLE, COUNTS or ALIGNED
    groups: str
    #: a serving layout (inference kernels; no batch dims, no sharding, no gradient model)
    serving: bool = False
    #: whether its groups can be sharded (group_offset / num_local_groups)
    shardable: bool = False
    #: whether it takes batch dims
    batch_dims: bool = True
    #: whether the strategies draw group sizes that vary per batch index for it
    batched_sizes: bool = False
    #: whether lhs may be stored transposed
    lhs_transposable: bool = True
    #: the families of d lhs (lhs stored plain, transposed) and of d rhs (rhs plain, transposed); None: no gradient
    gradient: tuple[tuple[str, str], tuple[str, str]] | None = None
    #: how a report names the output elements of no group
    outside: str = "tail (past sum(group_sizes))"
    doc: str = ""

    # ------------------------------------------------------------------ facts derived
    @property
    def takes_sizes(self) -> bool:
        """Whether a problem of this family carries group sizes."""
        return self.groups != WHOLE

    @property
    def ragged_out(self) -> bool:
        """Whether the output has the ragged axis (so output rows/columns may belong to no group: ``tail``)."""
        return self.ragged_dim("out") is not None

    @property
    def ragged_contraction(self) -> bool:
        """Whether the groups split the contraction (an empty group leaves a whole output block: ``empty``)."""
        return self.ragged == "k"

    @property
    def axis_word(self) -> str:
        """How a report names a group's range (``rows``, ``columns``, ``K range``)."""
        return AXIS_WORDS.get(self.ragged or "", "")

    def is_grouped(self, operand: str) -> bool:
        """Whether ``operand`` ("lhs", "rhs", "out") has a leading axis of the local groups."""
        return operand in self.grouped

    def ragged_dim(self, operand: str) -> int | None:
        """The logical dim (0 rows, 1 cols of ``[rows, cols]``) of ``operand`` the groups split, or None."""
        dims = DIMS[operand]
        return dims.index(self.ragged) if self.ragged in dims else None

    def ragged_last(self, operand: str, transposed: bool) -> bool:
        """Whether ``operand`` stored (``transposed`` or not) is ragged along its last (fast) axis, over the
        contiguous groups of one ragged axis (those that can be stored packed)."""
        dim = self.ragged_dim(operand)
        return self.groups == OFFSETS and dim is not None and dim == (0 if transposed else 1)

    def extent(self, m: int, k: int, n: int) -> int | None:
        """The extent the group sizes live in (``masked``: the rows of one group's matrix), None for none."""
        return {"m": m, "k": k, "n": n}.get(self.ragged or "")

    def shape(self, operand: str, m: int, k: int, n: int, groups: int, batch: tuple[int, ...] = ()
              ) -> tuple[int, ...]:
        """The canonical (untransposed) shape of ``operand`` with ``groups`` local groups."""
        ext = {"m": m, "k": k, "n": n}
        lead = (groups,) if self.is_grouped(operand) else ()
        return (*lead, *batch, *(ext[d] for d in DIMS[operand]))

    def index(self, operand: str, local: int, lo: int, hi: int, batch: tuple[int, ...] = ()) -> tuple[Any, ...]:
        """The index of local group ``local``'s block (its range ``[lo, hi)`` of the ragged axis) in the canonical
        (untransposed) ``operand``."""
        lead = (local,) if self.is_grouped(operand) else ()
        dim = self.ragged_dim(operand)
        return (*lead, *batch, *(slice(lo, hi) if i == dim else slice(None) for i in range(2)))

    def gradient_family(self, operand: str, transposed: bool) -> str:
        """The family of the gradient w.r.t. ``operand`` ("lhs" or "rhs") stored ``transposed`` or not."""
        if self.gradient is None:
            raise NotImplementedError(f"gradients: the {self.name} family has no gradient model here (its kernels "
                                      "are inference kernels)")
        return self.gradient[operand == "rhs"][bool(transposed)]


_BUILTIN = (
    Family("ragged_m", "m", ("rhs",), OFFSETS, shardable=True, batched_sizes=True,
           gradient=(("ragged_m", "ragged_n"), ("ragged_k", "ragged_k")),
           doc="lhs [b..., T, K], rhs [L, b..., K, N], out [b..., T, N]"),
    Family("ragged_n", "n", ("lhs",), OFFSETS, shardable=True,
           gradient=(("ragged_k", "ragged_k"), ("ragged_n", "ragged_m")),
           doc="lhs [L, b..., M, K], rhs [b..., K, T], out [b..., M, T]"),
    Family("ragged_k", "k", ("out",), OFFSETS, shardable=True, batched_sizes=True,
           gradient=(("ragged_n", "ragged_m"), ("ragged_m", "ragged_n")),
           doc="lhs [b..., M, T], rhs [b..., T, N], out [L, b..., M, N]"),
    Family("batch", None, ("lhs", "rhs", "out"), WHOLE,
           gradient=(("batch", "batch"), ("batch", "batch")),
           doc="lhs [G, b..., M, K], rhs [G, b..., K, N], out [G, b..., M, N]"),
    Family("masked", "m", ("lhs", "rhs", "out"), COUNTS, serving=True, batch_dims=False,
           outside="rows past a group's valid count (masked)",
           doc="lhs [G, M, K], rhs [G, K, N], out [G, M, N]; group g: the first group_sizes[g] rows of its matrix"),
    Family("padded_contiguous", "m", ("rhs",), ALIGNED, serving=True, batch_dims=False, lhs_transposable=False,
           outside="padding rows (no group's)",
           doc="lhs [T, K], rhs [G, K, N], out [T, N]; each group starts at a multiple of alignment"),
)

_REGISTRY: dict[str, Family] = {f.name: f for f in _BUILTIN}

#: the routed MoE family (docs/routed.md): a ``gmm_ref.Routing``, not a grouped ``Problem``, so it is none of
#: :func:`names`' (the families a ``Problem`` and the grouped conventions express); its routed conventions'
#: ``family`` and the main job's row of a routed kernel are its name
ROUTED = Family("routed", "m", ("rhs",), ROUTING, serving=True, batch_dims=False, lhs_transposable=False,
                outside="slots of another rank's experts (foreign)",
                doc="tokens [T, K], experts [E_local, N, K] or [E_local, K, N], topk_ids [T, top_k] -> out "
                    "[T, top_k, N]; slot (t, j): w[t, j] * tokens[t] @ experts[local(topk_ids[t, j])]")


def names() -> tuple[str, ...]:
    """Every family's name, in the registry's order."""
    return tuple(_REGISTRY)


def ragged_names() -> tuple[str, ...]:
    """The families of one ragged axis and batch (each with every layout, batch dims and gradients)."""
    return tuple(f.name for f in _REGISTRY.values() if not f.serving)


def serving_names() -> tuple[str, ...]:
    """The serving layouts."""
    return tuple(f.name for f in _REGISTRY.values() if f.serving)


def routed_names() -> tuple[str, ...]:
    """The routed family's name (:data:`ROUTED`), apart from :func:`names`."""
    return (ROUTED.name,)


def get(name: Any) -> Family:
    """The family named ``name`` (a Family is returned as is; ``"routed"``: :data:`ROUTED`); ValueError naming
    the known ones otherwise."""
    if isinstance(name, Family):
        return name
    if name == ROUTED.name:
        return ROUTED
    try:
        return _REGISTRY[name]
    except (KeyError, TypeError):
        raise ValueError(f"family: expected one of {names()}, got {name!r}{did_you_mean(name, names())}") from None
