"""Golden cases: a small JSON-able spec per case, and the problem it describes.

A *case* (:class:`Case`) names a convention, family, extents, group sizes,
layouts, dtypes and a seed. Its inputs are recomputed from the spec, bit for
bit on any machine, by :func:`golden.generator.values`, so a golden file need
hold only the outputs. The convention's facts (``gmm_ref.conventions``) fix
the tail, foreign and empty-group policies, so a golden says exactly what that
API promises. docs/goldens.md documents the format.
"""

from __future__ import annotations

import dataclasses
import fnmatch
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import ml_dtypes
import numpy as np

import gmm_ref
from gmm_ref import conventions, families
from gmm_ref import dtypes as _dt
from gmm_ref.layouts import blocks
from gmm_ref.scaled.model import round_scales
from golden import routed
from golden.generator import raw_bits, values

__all__ = ["Case", "GoldenError", "build_problem", "inputs_of", "select"]


class GoldenError(Exception):
    """A golden set is corrupt, inconsistent or would change without ``--update``."""


@dataclass(frozen=True)
class Case:
    """One golden case: everything needed to rebuild its problem (JSON-able).

    ``m``, ``k``, ``n`` are the logical extents (the ragged one includes any
    padded tail); ``group_sizes`` is ``[G]`` or ``[b..., G]`` (None for the
    ``batch`` family, which takes ``groups``). ``existing`` asks for an
    existing output (its policy is the convention's). The convention's own
    front-end (``gmm_ref.problem_from_arguments``) fixes the tail, foreign and
    empty-group policies, so a golden says exactly what that API promises.
    """

    name: str
    convention: str
    family: str
    m: int
    k: int
    n: int
    group_sizes: Any = None
    groups: int | None = None
    batch_shape: tuple[int, ...] = ()
    dtype: str = "float32"
    out_dtype: str | None = None
    lhs_transposed: bool = False
    rhs_transposed: bool = False
    packed: bool = False
    existing: bool = False
    group_offset: int = 0
    num_local_groups: int | None = None
    tiling: tuple[int, int, int] | None = None
    kind: str = "uniform"
    int_range: int = 3
    poison: bool = False
    seed: int = 0
    tags: tuple[str, ...] = ()
    #: a scaled convention's quantization: the index among those of its ``quantizations`` whose codes are
    #: ``dtype`` (left out of the JSON spec when 0, so specs written before it stay the same)
    quant: int = 0
    #: ``padded_contiguous`` only: every group starts at a multiple of it (left out of the JSON spec when None)
    alignment: int | None = None
    #: a routed case only (``golden.routed``; left out of the JSON spec when at their defaults): the slots per
    #: token, the global -> local expert map (-1: another rank's expert) and whether the weights multiply in
    top_k: int | None = None
    expert_map: Any = None
    mul_routed_weight: bool = False
    #: a routed case only (left out of the JSON spec when at their defaults): ``"peaked"`` for a peaked router's
    #: weights (``gmm_ref.routed.routing.peaked_weights``; None: the generator's), and the tokens that list their slot
    #: 0's expert in every slot (a convention whose callers never repeat an expert refuses them)
    router: str | None = None
    repeat_tokens: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        ok = set("abcdefghijklmnopqrstuvwxyz0123456789._-")
        if not self.name or set(self.name) - ok:
            raise ValueError(f"name: expected lowercase letters, digits, '.', '_' or '-', got {self.name!r}")
        gs = self.group_sizes
        if gs is not None:
            object.__setattr__(self, "group_sizes", np.asarray(gs, dtype=np.int64).tolist())
        object.__setattr__(self, "batch_shape", tuple(int(b) for b in self.batch_shape))
        object.__setattr__(self, "tags", tuple(self.tags))
        if self.tiling is not None:
            object.__setattr__(self, "tiling", tuple(int(t) for t in self.tiling))
        if self.expert_map is not None:
            object.__setattr__(self, "expert_map", np.asarray(self.expert_map, dtype=np.int64).tolist())
        object.__setattr__(self, "repeat_tokens", tuple(int(t) for t in self.repeat_tokens))

    def to_json(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["batch_shape"] = list(self.batch_shape)
        d["tags"] = list(self.tags)
        if self.tiling is not None:
            d["tiling"] = list(self.tiling)
        if not self.quant:
            del d["quant"]
        d["repeat_tokens"] = list(self.repeat_tokens)
        for name, default in (("alignment", None), ("top_k", None), ("expert_map", None),
                              ("mul_routed_weight", False), ("router", None), ("repeat_tokens", [])):
            if d[name] == default:
                del d[name]
        return d

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> Case:
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = set(d) - known
        if unknown:
            raise GoldenError(f"case spec: unknown fields {sorted(unknown)}")
        d = dict(d)
        d["batch_shape"] = tuple(d.get("batch_shape", ()))
        d["tags"] = tuple(d.get("tags", ()))
        d["repeat_tokens"] = tuple(d.get("repeat_tokens", ()))
        if d.get("tiling") is not None:
            d["tiling"] = tuple(d["tiling"])
        return cls(**d)



def _shapes(c: Case, local: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """The stored shapes of lhs and rhs (``local``: the local groups; batch: ``groups``)."""
    facts = families.get(c.family)  # ValueError naming the families
    b, m, k, n = c.batch_shape, c.m, c.k, c.n
    lt = (k, m) if c.lhs_transposed else (m, k)
    rt = (n, k) if c.rhs_transposed else (k, n)
    lead = (local,) if facts.takes_sizes else (int(c.groups or 0),)
    return ((*lead[:facts.is_grouped("lhs")], *b, *lt),
            (*lead[:facts.is_grouped("rhs")], *b, *rt))


def _quantization(case: Case, convention: Any, dtype: np.dtype) -> tuple[Any, Any]:
    """The case's (lhs, rhs) quantization: ``case.quant`` among its convention's whose codes are ``dtype``."""
    if not convention.quantizations:
        if case.quant:
            raise ValueError(f"case {case.name}: quant={case.quant}, but {case.convention} is not scaled")
        return (None, None)
    if dtype not in convention.code_dtypes and (None, None) in convention.quantizations:
        if case.quant:
            raise ValueError(f"case {case.name}: quant={case.quant}, but {dtype} operands of {case.convention} are "
                             "unscaled")
        return (None, None)
    mine = [q for q in convention.quantizations if q != (None, None) and all(x is None or x.elem == dtype for x in q)]
    if not 0 <= case.quant < len(mine):
        raise ValueError(f"case {case.name}: quant={case.quant}, but {case.convention} has {len(mine)} "
                         f"quantizations of {dtype} codes")
    return mine[case.quant]


def _code_scale(quant: Any, kind: str) -> float:
    """The range of a scaled operand's uniform codes: half its element's largest value (1 when unscaled)."""
    if quant is None or kind != "uniform" or _dt.is_integer(quant.elem):
        return 1.0
    return float(ml_dtypes.finfo(quant.elem).max) / 2


def _scaled(case: Case, p: gmm_ref.Problem, quants: tuple[Any, Any], out_dtype: Any,
            codes: tuple[np.ndarray, np.ndarray]) -> gmm_ref.Problem:
    """``p`` with scales for its codes: ``2**((bits % 7) - 3) * (1 + u)`` rounded into the scale dtype
    (``2**(bits % 2)`` for ``kind="int"``, so that exact cases stay exact), from the generator's stream
    ``lhs_scales`` / ``rhs_scales``; ``codes``: the operands' own codes (``p`` may hold stand-ins)."""
    extra: dict[str, Any] = {"lhs": codes[0], "rhs": codes[1]}
    for name, q in zip(("lhs", "rhs"), quants, strict=True):
        if q is None:
            continue
        count = sum(r * c for r, c in p.scale_shapes(name, q))
        top = raw_bits(case.seed, f"{name}_scales", count) >> np.uint64(11)
        if case.kind == "int":
            v = np.ldexp(1.0, (top % np.uint64(2)).astype(np.int64))
        else:
            u = top.astype(np.float64) * 2.0 ** -53
            v = np.ldexp(1.0 + u, (top % np.uint64(7)).astype(np.int64) - 3)
            if ml_dtypes.finfo(q.scale).nmant == 0:  # a power-of-two scale dtype (e8m0)
                v = np.ldexp(1.0, np.floor(np.log2(v)).astype(np.int64))
        extra[f"{name}_quant"] = q
        extra[f"{name}_scales"] = round_scales(v, q.scale)
        if q.global_scale:  # one per local group: 2**((bits % 5) - 4) * (1 + u) in float32 (1 or 2 for int cases)
            gtop = raw_bits(case.seed, f"{name}_global", p.num_local_groups) >> np.uint64(11)
            spread, low = (2, 0) if case.kind == "int" else (5, 4)
            gexp = (gtop % np.uint64(spread)).astype(np.int64) - low
            gu = 0.0 if case.kind == "int" else gtop.astype(np.float64) * 2.0 ** -53
            extra[f"{name}_global"] = np.ldexp(1.0 + gu, gexp).astype(np.float32)
    return p.replace(**extra, out_dtype=out_dtype)


def _touched(p: gmm_ref.Problem, which: str) -> np.ndarray:
    """Which elements of operand ``which`` some group of ``p`` reads."""
    arr = getattr(p, which)
    index = np.arange(arr.size, dtype=np.float64).reshape(arr.shape)
    unscaled = dict(lhs_quant=None, lhs_scales=None, rhs_quant=None, rhs_scales=None, lhs_global=None, rhs_global=None)
    probe = p.replace(**{which: index}, existing_out=None, out_dtype=np.float64, **unscaled)
    seen = np.zeros(arr.size, bool)
    for blk in blocks(probe):
        seen[(blk.a if which == "lhs" else blk.b).astype(np.int64).ravel()] = True
    return seen.reshape(arr.shape)


def build_problem(case: Case) -> gmm_ref.Problem:
    """The problem a case describes, with its convention's policies, in the case's own layout (a routed case:
    its ``gmm_ref.Routing``, :func:`golden.routed.build_routing`).

    The convention's gmm_ref front-end, fed ``gmm_ref.arguments(problem)``,
    must describe the same output (shape, dtype, tail / foreign / empty-group
    policies); a ValueError says where they part.
    """
    try:
        convention = conventions.get(case.convention)
    except ValueError as exc:
        raise ValueError(f"case {case.name}: {exc}") from None
    if routed.is_routed(case) != (case.convention in conventions.routed_names()):
        raise ValueError(f"case {case.name}: family {case.family!r} in the convention {case.convention}: a routed "
                         "convention's cases are of the routed family, and only theirs")
    if routed.is_routed(case):  # a gmm_ref.Routing, not a grouped Problem
        return routed.build_routing(case, convention)
    routed.refuse_routed_fields(case)
    local = case.num_local_groups
    if families.get(case.family).takes_sizes:
        gs = np.asarray(case.group_sizes, dtype=np.int64)
        if local is None:
            local = gs.shape[-1] - case.group_offset
    else:
        gs = None
        local = int(case.groups or 0)
    lshape, rshape = _shapes(case, local)
    dt = _dt.as_dtype(case.dtype, name="dtype", codes=True)
    kw = {"kind": case.kind, "int_range": case.int_range}
    quants = _quantization(case, convention, dt)
    lhs, rhs = (values(case.seed, name, shape, dt, **kw, scale=_code_scale(q, case.kind))
                for name, shape, q in (("lhs", lshape, quants[0]), ("rhs", rshape, quants[1])))
    p = gmm_ref.Problem(  # (4-bit codes stand in as 8-bit ones until their scales come)
        case.family, _dt.standin_codes(lhs), _dt.standin_codes(rhs), gs, lhs_transposed=case.lhs_transposed,
        rhs_transposed=case.rhs_transposed, packed=case.packed, batch_ndim=len(case.batch_shape),
        out_dtype=None if quants != (None, None) else case.out_dtype,  # a scaled case's codes: theirs, for now
        group_offset=case.group_offset, num_local_groups=local, alignment=case.alignment,
        convention=case.convention, tiling=case.tiling, **convention.policies(case.family),
    )
    if quants != (None, None):  # a scaled convention's cases: its (first) quantization, scales from the spec
        p = _scaled(case, p, quants, case.out_dtype, (lhs, rhs))
    if case.poison:
        if _dt.is_integer(dt):
            raise ValueError(f"case {case.name}: poison needs float inputs")
        for which in ("lhs", "rhs"):
            arr = getattr(p, which).copy()
            arr[~_touched(p, which)] = np.nan
            p = p.replace(**{which: arr})
    if case.existing:
        p = p.replace(existing_out=values(case.seed, "existing_out", p.out_shape, p.out_dtype, **kw))
    reason = convention.refusal(p)
    if reason:
        raise ValueError(f"case {case.name}: {reason}")
    args, kwargs = gmm_ref.arguments(p)
    front = gmm_ref.problem_from_arguments(case.convention, *args, **kwargs)
    mine, theirs = _promise(p), _promise(front)
    if mine != theirs:
        raise ValueError(f"case {case.name}: the gmm_ref {case.convention} front-end describes "
                         f"{theirs}, the case {mine}")
    return p


def _promise(p: gmm_ref.Problem) -> dict[str, Any]:
    """What a problem says about its output (layouts aside)."""
    d = {"family": p.family, "out_shape": p.out_shape, "out_dtype": str(p.out_dtype),
         "existing": p.existing_out is not None}
    if p.family_facts.ragged_out and p.existing_out is None:
        d["tail"] = p.tail
        if p.num_local_groups != p.num_groups:
            d["foreign"] = p.foreign
    if p.family_facts.ragged_contraction:
        d["empty"] = p.empty
    if p.existing_out is not None:
        d["existing_policy"] = p.existing_policy
    return d


def inputs_of(p: gmm_ref.Problem) -> dict[str, np.ndarray]:
    """The arrays a problem (or a routed case's routing) is made of (what :func:`inputs_sha256` hashes)."""
    if isinstance(p, gmm_ref.Routing):
        return routed.inputs(p)
    d = {"lhs": p.lhs, "rhs": p.rhs}
    if p.group_sizes is not None:
        d["group_sizes"] = p.group_sizes
    if p.existing_out is not None:
        d["existing_out"] = p.existing_out
    for name in ("lhs_scales", "rhs_scales", "lhs_global", "rhs_global"):
        if getattr(p, name) is not None:
            d[name] = getattr(p, name)
    return d


def split_patterns(cases: str | Sequence[str] | None) -> list[str] | None:
    """``--cases`` as a list of glob patterns (a comma-separated string or a sequence)."""
    if cases is None:
        return None
    if isinstance(cases, str):
        return [c for c in cases.split(",") if c]
    return list(cases)


def select(names: Iterable[str], cases: str | Sequence[str] | None) -> list[str]:
    """The names matching any of the ``cases`` glob patterns (all when None)."""
    patterns = split_patterns(cases)
    if not patterns:
        return list(names)
    return [n for n in names if any(fnmatch.fnmatchcase(n, pat) for pat in patterns)]
