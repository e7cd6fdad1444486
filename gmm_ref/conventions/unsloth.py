"""unsloth's grouped GEMM forward (``unsloth.grouped_gemm``, a routed convention: :data:`GROUPED_GEMM`, whose
arguments come from a ``gmm_ref.Routing``; docs/routed.md, docs/conventions.md).

``grouped_gemm_forward(X, W, topk, m_sizes, gather_indices=None, topk_weights=None, permute_x=False,
permute_y=False, fuse_mul_post=False, autotune=False, BLOCK_SIZE_M=32, BLOCK_SIZE_N=32, BLOCK_SIZE_K=32,
num_warps=4, num_stages=2, use_tma_load_w=False, use_tma_load_x=False, use_tma_store=False, flatten=True,
debug=False)`` of ``unsloth/kernels/moe/grouped_gemm/interface.py``, returning ``y [T*topk, N]`` in X's dtype:

- ``W [E, N, K]`` (or ``[E*N, K]``, ``E`` then from ``m_sizes``); ``m_sizes [E]``: each expert's slot count (not
  cumulative); ``gather_indices [T*topk]``: the flat slot indices ``t*topk + j`` grouped by expert (row ``i`` of
  the expert-ordered rows is slot ``gather_indices[i]``); ``topk_weights``: ``T*topk`` weights in slot order;
- ``permute_x`` (the MLP's first GEMM): ``X [T, K]`` in token order, gathered in the kernel (row ``i`` reads
  token ``gather_indices[i] // topk``); ``y`` in expert order (row ``i`` is slot ``gather_indices[i]``);
- ``permute_y`` (the second GEMM): ``X [T*topk, K]`` already in expert order; ``y`` scattered to slot order (row
  ``t*topk + j`` is slot ``(t, j)``); ``fuse_mul_post`` (permute_y only, inference only): each row of ``y``, once
  rounded to X's dtype, times its slot's weight cast to that dtype, rounded again;
- never both permutations; the kernel ``tl.static_assert`` s ``K % BLOCK_SIZE_K == 0`` (no K tail is masked);
  there is no expert parallelism (every expert is local).

The backward kernels have conventions of their own (below: :data:`GROUPED_GEMM_DX`, :data:`GROUPED_GEMM_DW`,
:data:`GROUPED_GEMM_DW_ACCUMULATE`), whose arguments come from a ``gmm_ref.RoutedBackward`` (a routing with its
per-slot cotangent) and whose outputs are gradients of the routed gradient model (``gmm_ref.routed_gradients``).

This convention builds the fused forms only (:data:`FORMS`; with neither permutation ``X`` is already in expert
order and nothing says which token a row is): a weighted routing takes ``permute_y`` with ``fuse_mul_post`` (the
only form that multiplies the weight in); an unweighted one ``permute_x`` when ``T`` is even, ``permute_y`` when
it is odd, so that one stream of drawn routings reaches all three forms. The launch config is
:data:`GROUPED_GEMM_CONFIG` (16 x 16 x 16 tiles, no autotuning, no TMA).
"""

from __future__ import annotations

import inspect
from typing import Any

import ml_dtypes
import numpy as np

from gmm_ref.conventions import base
from gmm_ref.routed.gradients import RoutedBackward
from gmm_ref.routed.metadata import unsloth_routing_indices
from gmm_ref.routed.routing import Routing

__all__ = ["BACKWARD_FORMS", "DW_EXTENTS", "FORMS", "GRADIENT_DTYPES", "GROUPED_GEMM", "GROUPED_GEMM_CONFIG",
           "GROUPED_GEMM_DW", "GROUPED_GEMM_DW_ACCUMULATE", "GROUPED_GEMM_DX", "backward_form_of", "form_of"]

BF16 = np.dtype(ml_dtypes.bfloat16)
#: the tiles ``unsloth.grouped_gemm`` arguments carry (small, so drawn extents straddle them; K a multiple of 16)
GROUPED_GEMM_CONFIG = {"BLOCK_SIZE_M": 16, "BLOCK_SIZE_N": 16, "BLOCK_SIZE_K": 16}
#: the forms built: (permute_x, permute_y, fuse_mul_post)
FORMS = {"permute_x": (True, False, False), "permute_y": (False, True, False),
         "permute_y+fuse_mul_post": (False, True, True)}


def form_of(r: Routing) -> str:
    """The form the arguments of ``r`` take (module docstring)."""
    if r.mul_routed_weight:
        return "permute_y+fuse_mul_post"
    return "permute_x" if r.num_tokens % 2 == 0 else "permute_y"


def _flag(name: str, value: Any) -> bool:
    if not isinstance(value, (bool, np.bool_)):
        raise TypeError(f"{name}: expected a bool, got {value!r}")
    return bool(value)


def _experts(w: np.ndarray, m_sizes: np.ndarray) -> np.ndarray:
    """``W`` as ``[E, N, K]`` (a 2-D ``[E*N, K]`` split by ``m_sizes``' length, as unsloth splits it)."""
    base.expect_ndim("W", w, (2, 3))
    if w.ndim == 3:
        if w.shape[0] != m_sizes.shape[0]:
            raise ValueError(f"m_sizes: expected one count per expert of W {w.shape}, got {m_sizes.shape[0]}")
        return w
    e = m_sizes.shape[0]
    if e == 0 or w.shape[0] % e:
        raise ValueError(f"W: a 2-D W [E*N, K] needs its rows a multiple of E = len(m_sizes) = {e}, got {w.shape}")
    return w.reshape(e, w.shape[0] // e, w.shape[1])


class _GroupedGemm(base.RoutedConvention):
    def parse(self, X: Any, W: Any, topk: Any, m_sizes: Any, gather_indices: Any = None, topk_weights: Any = None,
              permute_x: bool = False, permute_y: bool = False, fuse_mul_post: bool = False, autotune: bool = False,
              BLOCK_SIZE_M: int = 32, BLOCK_SIZE_N: int = 32, BLOCK_SIZE_K: int = 32, num_warps: int = 4,
              num_stages: int = 2, use_tma_load_w: bool = False, use_tma_load_x: bool = False,
              use_tma_store: bool = False, flatten: bool = True, debug: bool = False) -> Routing:
        """unsloth's grouped GEMM forward (module docstring) as the routing it computes: slot ``gather_indices[i]``
        of token ``gather_indices[i] // topk`` goes to the expert whose rows (``m_sizes``, in order) hold row ``i``.
        Refuses what unsloth asserts (both permutations, ``fuse_mul_post`` without ``permute_y``, TMA with the
        permutation it cannot do, ``K % BLOCK_SIZE_K``) and what no routing is (neither permutation, sizes that do
        not add up, a gather that is no permutation, two rows of one token that differ under ``permute_y``)."""
        for name in ("permute_x", "permute_y", "fuse_mul_post", "autotune", "use_tma_load_w", "use_tma_load_x",
                     "use_tma_store", "flatten", "debug"):
            _flag(name, locals()[name])
        if permute_x and permute_y:
            raise ValueError("permute_x, permute_y: unsloth cannot permute both X and Y")
        if not (permute_x or permute_y):
            raise ValueError("permute_x, permute_y: with neither, X is already in expert order and no argument says "
                             "which token a row is; this convention expresses the fused forms (one of them True)")
        if fuse_mul_post and not permute_y:
            raise ValueError("fuse_mul_post: unsloth requires permute_y with it (FUSE_MUL requires PERMUTE_Y)")
        if (use_tma_load_x and permute_x) or (use_tma_store and permute_y):
            raise ValueError("use_tma_load_x / use_tma_store: TMA cannot gather X (permute_x) nor scatter Y "
                             "(permute_y) before Blackwell; unsloth asserts against both")
        if isinstance(topk, bool) or not isinstance(topk, (int, np.integer)) or topk < 1:
            raise TypeError(f"topk: expected a positive int, got {topk!r}")
        x = base.as_array("X", X)
        base.expect_ndim("X", x, 2)
        sizes = base.as_sizes("m_sizes", m_sizes).astype(np.int64)
        w = _experts(base.as_array("W", W), sizes)
        e, n, k = w.shape
        if x.shape[1] != k:
            raise ValueError(f"X: expected K = {k} (W's last axis), got shape {x.shape}")
        for name, value in (("BLOCK_SIZE_M", BLOCK_SIZE_M), ("BLOCK_SIZE_N", BLOCK_SIZE_N),
                            ("BLOCK_SIZE_K", BLOCK_SIZE_K)):
            if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 16:
                raise ValueError(f"{name}: expected an int of at least 16 (tl.dot's smallest tile), got {value!r}")
        if k % BLOCK_SIZE_K:
            raise ValueError(f"BLOCK_SIZE_K: the kernel asserts K % BLOCK_SIZE_K == 0 (it masks no K tail), got "
                             f"K = {k}, BLOCK_SIZE_K = {BLOCK_SIZE_K}")
        if x.dtype != w.dtype:
            raise TypeError(f"W: expected X's dtype {x.dtype} (the output's too), got {w.dtype}")
        gather = base.as_sizes("gather_indices", gather_indices).astype(np.int64) if gather_indices is not None \
            else None
        if gather is None:
            raise ValueError("gather_indices: required with permute_x or permute_y")
        total = gather.shape[0]
        if total % topk:
            raise ValueError(f"gather_indices: expected T*topk entries, got {total} (not a multiple of topk={topk})")
        t = total // topk
        if x.shape[0] != (t if permute_x else total):
            what = f"num_tokens = {t}" if permute_x else f"T*topk = {total} (expert-ordered rows)"
            raise ValueError(f"X: expected {what} rows with {'permute_x' if permute_x else 'permute_y'}, got {x.shape}")
        ids = _routed_ids(sizes, gather, t, topk)
        tokens = x if permute_x else _tokens(x, gather, t, topk)
        weights = None
        if fuse_mul_post or topk_weights is not None:
            if topk_weights is None:
                raise ValueError("topk_weights: required with fuse_mul_post")
            tw = base.as_array("topk_weights", topk_weights)
            if tw.size != total:
                raise ValueError(f"topk_weights: expected T*topk = {total} weights, got shape {tw.shape}")
            weights = tw.reshape(t, topk)
        return Routing(tokens, w, ids, weights, expert_layout="enk", mul_routed_weight=bool(fuse_mul_post),
                       out_dtype=x.dtype, foreign=self.foreign)

    def _arguments(self, r: Routing) -> tuple[tuple[Any, ...], dict[str, Any]]:
        m_sizes, gather = unsloth_routing_indices(r.topk_ids, r.num_experts)
        px, py, fuse = FORMS[form_of(r)]
        x = r.tokens if px else r.tokens[gather // r.top_k]
        weights = None if r.topk_weights is None else r.topk_weights.reshape(-1)
        return ((x, r.experts, r.top_k, m_sizes, gather, weights),
                {"permute_x": px, "permute_y": py, "fuse_mul_post": fuse, "autotune": False, **GROUPED_GEMM_CONFIG})

    def per_slot(self, out: Any, args: tuple, kwargs: dict) -> Any:
        """``y [T*topk, N]`` as ``[T, topk, N]``: scattered back by ``gather_indices`` where it is in expert order
        (``permute_x``); a ``y`` of any other shape is returned as it is (the comparison then names its shape)."""
        call = inspect.signature(self.parse).bind(*args, **kwargs).arguments
        topk, gather = int(call["topk"]), np.asarray(call["gather_indices"]).astype(np.int64)
        y = np.asarray(out)
        if y.ndim != 2 or y.shape[0] != gather.shape[0]:
            return out
        if call.get("permute_x", False):
            slots = np.empty_like(y)
            slots[gather] = y
            y = slots
        return y.reshape(gather.shape[0] // topk, topk, y.shape[1])


def _routed_ids(sizes: np.ndarray, gather: np.ndarray, t: int, topk: int) -> np.ndarray:
    """``topk_ids [T, topk]``: row ``i`` of expert ``e``'s rows (``m_sizes``, in order) is slot ``gather[i]``."""
    total = gather.shape[0]
    if (sizes < 0).any() or int(sizes.sum()) != total:
        cumulative = sizes.size and (np.diff(sizes) >= 0).all() and int(sizes[-1]) == total
        raise ValueError(f"m_sizes: expected non-negative per-expert counts adding up to T*topk = {total}, got "
                         f"{sizes.tolist()}" + (" (cumulative offsets? unsloth takes counts)" if cumulative else ""))
    if not np.array_equal(np.sort(gather), np.arange(total)):
        bad = np.flatnonzero(np.bincount(np.clip(gather, 0, max(total - 1, 0)), minlength=total) != 1)
        raise ValueError(f"gather_indices: expected each flat slot index in [0, {total}) once (a permutation), got "
                         f"{gather.tolist()[:16]}... (slot {int(bad[0]) if bad.size else '?'} is not there once)")
    ids = np.empty(total, np.int64)
    ids[gather] = np.repeat(np.arange(sizes.shape[0]), sizes)
    return ids.reshape(t, topk)


def _tokens(x: np.ndarray, gather: np.ndarray, t: int, topk: int) -> np.ndarray:
    """The tokens ``[T, K]`` of expert-ordered rows ``x`` (``permute_y``); every row of one token must be equal."""
    x = np.ascontiguousarray(x)
    owner = gather // topk
    tokens = np.zeros((t, x.shape[1]), x.dtype)
    tokens[owner] = x
    bits = x.view(np.uint8).reshape(x.shape[0], x.shape[1] * x.dtype.itemsize)
    tbits = tokens.view(np.uint8).reshape(t, x.shape[1] * x.dtype.itemsize)
    differ = np.flatnonzero((bits != tbits[owner]).any(axis=1))
    if differ.size:
        i = int(differ[0])
        raise ValueError(f"X: rows of token {int(owner[i])} (gather_indices) differ (row {i} among them): a routing "
                         "has one row per token")
    return tokens


GROUPED_GEMM = _GroupedGemm(
    name="unsloth.grouped_gemm", framework="torch",
    dtype_pairs=((BF16, BF16), ("float16", "float16"), ("float32", "float32")),
    weight_dtypes=("float32", BF16, "float16"), expert_layouts=("enk",), foreign="zero", distinct_experts=False,
    block_size=GROUPED_GEMM_CONFIG["BLOCK_SIZE_M"], expert_parallel=False,
    extents=((16, 8), (32, 24), (48, 40)),
    summary="unsloth grouped_gemm_forward(X, W, topk, m_sizes, gather_indices, topk_weights, permute_x, permute_y, "
            "fuse_mul_post, ...): routed tokens, experts [E, N, K], y [T*topk, N] in expert order (permute_x) or "
            "slot order (permute_y, fuse_mul_post), unquantized",
)


# ------------------------------------------------------------------------------------------------- backward
#: the forms of the backward kernels built: (permute_x, permute_y), what the forward did (no fused weight: unsloth's
#: backward asserts ``fuse_mul_*`` off, inference only)
BACKWARD_FORMS = {"permute_x": (True, False), "permute_y": (False, True)}


def backward_form_of(r: Routing) -> str:
    """The form of a backward call of ``r``: ``permute_x`` where the sum of its expert ids is even, ``permute_y``
    where it is odd (the ids vary inside every bucket of drawn routings, ``T`` near block edges is mostly odd:
    every bucket reaches both forms)."""
    return "permute_x" if int(r.topk_ids.astype(np.int64).sum()) % 2 == 0 else "permute_y"


def _flags(**flags: Any) -> None:
    for name, value in flags.items():
        _flag(name, value)


def _permutations(permute_x: bool, permute_y: bool) -> None:
    if permute_x and permute_y:
        raise ValueError("permute_x, permute_y: unsloth cannot permute both X and Y")
    if not (permute_x or permute_y):
        raise ValueError("permute_x, permute_y: with neither, the rows are in expert order and no argument says "
                         "which token a row is; this convention expresses the fused forms (one of them True)")


def _topk(topk: Any) -> int:
    if isinstance(topk, bool) or not isinstance(topk, (int, np.integer)) or topk < 1:
        raise TypeError(f"topk: expected a positive int, got {topk!r}")
    return int(topk)


def _blocks(**blocks: Any) -> None:
    for name, value in blocks.items():
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 16:
            raise ValueError(f"{name}: expected an int of at least 16 (tl.dot's smallest tile), got {value!r}")


def _gather(gather_indices: Any, topk: int) -> tuple[np.ndarray, int]:
    if gather_indices is None:
        raise ValueError("gather_indices: required with permute_x or permute_y")
    gather = base.as_sizes("gather_indices", gather_indices).astype(np.int64)
    if gather.shape[0] % topk:
        raise ValueError(f"gather_indices: expected T*topk entries, got {gather.shape[0]} (not a multiple of "
                         f"topk={topk})")
    return gather, gather.shape[0] // topk


def _rows_2d(name: str, x: Any) -> np.ndarray:
    a = base.as_array(name, x)
    base.expect_ndim(name, a, 2)
    return a


def _slot_order(rows: np.ndarray, gather: np.ndarray, expert_order: bool) -> np.ndarray:
    """``rows [T*topk, ...]`` in slot order (row ``i`` of expert-ordered rows is slot ``gather[i]``)."""
    if not expert_order:
        return rows
    out = np.empty_like(rows)
    out[gather] = rows
    return out


class _GroupedGemmDX(base.RoutedConvention):
    def parse(self, dY: Any, W: Any, gather_indices: Any, m_sizes: Any, topk: Any, BLOCK_SIZE_M: int = 32,
              BLOCK_SIZE_N: int = 32, BLOCK_SIZE_K: int = 32, debug: bool = False, permute_x: bool = False,
              permute_y: bool = False, use_tma_load_w: bool = False, use_tma_load_dy: bool = False,
              use_tma_store: bool = False, num_warps: int = 4, num_stages: int = 2, flatten: bool = True,
              fuse_mul_pre: bool = False, fuse_mul_post: bool = False, autotune: bool = False) -> RoutedBackward:
        """unsloth's ``grouped_gemm_dX`` (docs/conventions.md) as the backward it computes: ``dX [T*topk, K]``, row
        ``i`` the gradient of the forward's ``X`` row ``i`` (``permute_x``: slot order, dY in expert order;
        ``permute_y``: expert order, dY in slot order), ``w = 1``. The tokens are not an argument: zeros stand for
        them. Refuses what unsloth asserts (``fuse_mul_pre`` / ``fuse_mul_post``, both permutations, TMA with the
        permutation it cannot do, ``N % BLOCK_SIZE_N``, ``K % BLOCK_SIZE_K``) and what no routing is."""
        _flags(debug=debug, permute_x=permute_x, permute_y=permute_y, use_tma_load_w=use_tma_load_w,
               use_tma_load_dy=use_tma_load_dy, use_tma_store=use_tma_store, flatten=flatten,
               fuse_mul_pre=fuse_mul_pre, fuse_mul_post=fuse_mul_post, autotune=autotune)
        if fuse_mul_pre or fuse_mul_post:
            raise ValueError("fuse_mul_pre / fuse_mul_post: inference only; unsloth's dX asserts both False")
        _permutations(permute_x, permute_y)
        if permute_y and use_tma_load_dy:
            raise ValueError("use_tma_load_dy: TMA cannot gather dY (permute_y); unsloth asserts against both")
        if permute_x and use_tma_store:
            raise ValueError("use_tma_store: TMA cannot scatter dX (permute_x); unsloth asserts against both")
        topk = _topk(topk)
        dy = _rows_2d("dY", dY)
        sizes = base.as_sizes("m_sizes", m_sizes).astype(np.int64)
        w = _experts(base.as_array("W", W), sizes)
        _, n, k = w.shape
        if dy.shape[1] != n:
            raise ValueError(f"dY: expected N = {n} columns (W's second axis), got shape {dy.shape}")
        _blocks(BLOCK_SIZE_M=BLOCK_SIZE_M, BLOCK_SIZE_N=BLOCK_SIZE_N, BLOCK_SIZE_K=BLOCK_SIZE_K)
        for name, extent, block in (("N", n, BLOCK_SIZE_N), ("K", k, BLOCK_SIZE_K)):
            if extent % block:
                raise ValueError(f"BLOCK_SIZE_{name}: the kernel asserts {name} % BLOCK_SIZE_{name} == 0 (it masks "
                                 f"no {name} tail), got {name} = {extent}, BLOCK_SIZE_{name} = {block}")
        if dy.dtype != w.dtype:
            raise TypeError(f"W: expected dY's dtype {dy.dtype} (dX's too), got {w.dtype}")
        gather, t = _gather(gather_indices, topk)
        if dy.shape[0] != gather.shape[0]:
            raise ValueError(f"dY: expected T*topk = {gather.shape[0]} rows (gather_indices' length), got {dy.shape}")
        ids = _routed_ids(sizes, gather, t, topk)
        cot = _slot_order(dy, gather, permute_x).reshape(t, topk, n)
        return RoutedBackward(np.zeros((t, k), w.dtype), w, ids, expert_layout="enk", out_dtype=dy.dtype,
                              foreign=self.foreign, cotangent=cot)

    def _arguments(self, b: RoutedBackward) -> tuple[tuple[Any, ...], dict[str, Any]]:
        m_sizes, gather = unsloth_routing_indices(b.topk_ids, b.num_experts)
        px, py = BACKWARD_FORMS[backward_form_of(b)]
        rows = b.cotangent.reshape(-1, b.n)
        return ((rows[gather] if px else rows, b.experts, gather, m_sizes, b.top_k),
                {"permute_x": px, "permute_y": py, "autotune": False, **GROUPED_GEMM_CONFIG})

    def per_slot(self, out: Any, args: tuple, kwargs: dict) -> Any:
        """``dX [T*topk, K]`` as ``[T, topk, K]``: scattered back by ``gather_indices`` where it is in expert order
        (``permute_y``); a ``dX`` of any other shape is returned as it is (the comparison then names its shape)."""
        call = inspect.signature(self.parse).bind(*args, **kwargs).arguments
        topk, gather = int(call["topk"]), np.asarray(call["gather_indices"]).astype(np.int64)
        dx = np.asarray(out)
        if dx.ndim != 2 or dx.shape[0] != gather.shape[0]:
            return out
        return _slot_order(dx, gather, bool(call.get("permute_y", False))).reshape(-1, topk, dx.shape[1])


def _parse_dw(conv: base.RoutedConvention, X: Any, dY: Any, m_sizes: Any, gather_indices: Any, topk: Any,
              existing: Any, dW_dtype: Any, permute_x: bool, permute_y: bool, use_tma_load_dy: bool,
              use_tma_load_x: bool, blocks: dict[str, Any]) -> RoutedBackward:
    """The backward a dW call computes (``_GroupedGemmDW.parse``, ``_GroupedGemmDWAccumulate.parse``)."""
    _permutations(permute_x, permute_y)
    if permute_y and use_tma_load_dy:
        raise ValueError("use_tma_load_dy: TMA cannot gather dY (permute_y); unsloth asserts against both")
    if permute_x and use_tma_load_x:
        raise ValueError("use_tma_load_x: TMA cannot gather X (permute_x); unsloth asserts against both")
    topk = _topk(topk)
    x, dy = _rows_2d("X", X), _rows_2d("dY", dY)
    sizes = base.as_sizes("m_sizes", m_sizes).astype(np.int64)
    _blocks(**blocks)
    if dy.dtype != x.dtype:
        raise TypeError(f"dY: expected X's dtype {x.dtype} (the kernel casts dY to it), got {dy.dtype}")
    gather, t = _gather(gather_indices, topk)
    total = gather.shape[0]
    if dy.shape[0] != total:
        raise ValueError(f"dY: expected T*topk = {total} rows (gather_indices' length), got {dy.shape}")
    if x.shape[0] != (t if permute_x else total):
        what = f"num_tokens = {t}" if permute_x else f"T*topk = {total} (expert-ordered rows)"
        raise ValueError(f"X: expected {what} rows with {'permute_x' if permute_x else 'permute_y'}, got {x.shape}")
    ids = _routed_ids(sizes, gather, t, topk)
    e, n, k = sizes.shape[0], dy.shape[1], x.shape[1]
    if existing is not None:
        existing = base.as_array("dW", existing)
        if existing.size != e * n * k or existing.dtype not in GRADIENT_DTYPES:
            raise ValueError(f"dW: expected E*N*K = {e}*{n}*{k} elements of float16, bfloat16 or float32 (unsloth "
                             f"asserts its numel), got {existing.dtype} {existing.shape}")
        existing = existing.reshape(e, n, k)
    dtype = existing.dtype if existing is not None else base.optional_dtype("dW_dtype", dW_dtype)
    dtype = x.dtype if dtype is None else dtype
    if dtype not in GRADIENT_DTYPES:
        raise TypeError(f"dW_dtype: expected float16, bfloat16 or float32, got {dtype}")
    tokens = x if permute_x else _tokens(x, gather, t, topk)
    return RoutedBackward(tokens, np.zeros((e, n, k), dtype), ids, expert_layout="enk", out_dtype=dy.dtype,
                          foreign=conv.foreign, cotangent=_slot_order(dy, gather, permute_x).reshape(t, topk, n),
                          existing=existing)


def _dw_arguments(b: RoutedBackward) -> tuple[tuple[Any, ...], dict[str, Any]]:
    m_sizes, gather = unsloth_routing_indices(b.topk_ids, b.num_experts)
    px, py = BACKWARD_FORMS[backward_form_of(b)]
    rows = b.cotangent.reshape(-1, b.n)
    x = b.tokens if px else b.tokens[gather // b.top_k]
    return ((x, rows[gather] if px else rows, m_sizes, gather),
            {"permute_x": px, "permute_y": py, **GROUPED_GEMM_CONFIG})


class _GroupedGemmDW(base.RoutedConvention):
    def parse(self, X: Any, dY: Any, m_sizes: Any, gather_indices: Any, topk: Any, BLOCK_SIZE_M: int = 32,
              BLOCK_SIZE_N: int = 32, BLOCK_SIZE_K: int = 32, permute_x: bool = False, permute_y: bool = False,
              use_tma_load_dy: bool = False, use_tma_load_x: bool = False, use_tma_store: bool = False,
              fuse_mul_pre: bool = False, fuse_mul_post: bool = False, num_warps: int = 4, num_stages: int = 2,
              flatten: bool = True, autotune: bool = False, debug: bool = False,
              dW_dtype: Any = None) -> RoutedBackward:
        """unsloth's ``grouped_gemm_dW`` (docs/conventions.md) as the backward it computes: ``dW [E, N, K]``, per
        expert ``dY_e^T X_e`` over its rows (``permute_x``: ``X [T, K]`` tokens, row ``gather // topk``, dY in expert
        order; ``permute_y``: ``X`` in expert order, dY in slot order, row ``gather``), in ``dW_dtype`` (X's by
        default). The experts are not an argument: zeros stand for them. Refuses what unsloth asserts
        (``fuse_mul_*``, both permutations, TMA with the permutation it cannot do) and what no routing is."""
        _flags(permute_x=permute_x, permute_y=permute_y, use_tma_load_dy=use_tma_load_dy,
               use_tma_load_x=use_tma_load_x, use_tma_store=use_tma_store, fuse_mul_pre=fuse_mul_pre,
               fuse_mul_post=fuse_mul_post, flatten=flatten, autotune=autotune, debug=debug)
        if fuse_mul_pre or fuse_mul_post:
            raise ValueError("fuse_mul_pre / fuse_mul_post: unsloth's dW asserts both False (not supported)")
        return _parse_dw(self, X, dY, m_sizes, gather_indices, topk, None, dW_dtype, permute_x, permute_y,
                         use_tma_load_dy, use_tma_load_x, dict(BLOCK_SIZE_M=BLOCK_SIZE_M, BLOCK_SIZE_N=BLOCK_SIZE_N,
                                                               BLOCK_SIZE_K=BLOCK_SIZE_K))

    def _arguments(self, b: RoutedBackward) -> tuple[tuple[Any, ...], dict[str, Any]]:
        args, kwargs = _dw_arguments(b)
        return (*args, b.top_k), {**kwargs, "autotune": False}


class _GroupedGemmDWAccumulate(base.RoutedConvention):
    def parse(self, X: Any, dY: Any, m_sizes: Any, gather_indices: Any, dW: Any, topk: Any, BLOCK_SIZE_M: int = 32,
              BLOCK_SIZE_N: int = 32, BLOCK_SIZE_K: int = 32, permute_x: bool = False, permute_y: bool = False,
              use_tma_load_dy: bool = False, use_tma_load_x: bool = False, use_tma_store: bool = False,
              num_warps: int = 4, num_stages: int = 2) -> RoutedBackward:
        """unsloth's ``grouped_gemm_dW_accumulate`` (docs/conventions.md): ``grouped_gemm_dW``'s gradient added into
        ``dW`` in place (``E*N*K`` elements, its dtype the gradient's): the backward with ``dW`` as its existing
        experts' gradient."""
        _flags(permute_x=permute_x, permute_y=permute_y, use_tma_load_dy=use_tma_load_dy,
               use_tma_load_x=use_tma_load_x, use_tma_store=use_tma_store)
        return _parse_dw(self, X, dY, m_sizes, gather_indices, topk, dW, None, permute_x, permute_y,
                         use_tma_load_dy, use_tma_load_x, dict(BLOCK_SIZE_M=BLOCK_SIZE_M, BLOCK_SIZE_N=BLOCK_SIZE_N,
                                                               BLOCK_SIZE_K=BLOCK_SIZE_K))

    def _arguments(self, b: RoutedBackward) -> tuple[tuple[Any, ...], dict[str, Any]]:
        args, kwargs = _dw_arguments(b)
        return (*args, b.existing, b.top_k), kwargs


#: the dtypes of unsloth's dW (``_DW_DTYPES``)
GRADIENT_DTYPES = (BF16, np.dtype(np.float16), np.dtype(np.float32))
_BACKWARD = dict(framework="torch", dtype_pairs=((BF16, BF16), ("float16", "float16"), ("float32", "float32")),
                 expert_layouts=("enk",), foreign="zero", distinct_experts=False,
                 block_size=GROUPED_GEMM_CONFIG["BLOCK_SIZE_M"], expert_parallel=False, mul_routed_weight=False)
#: (K, N) of dW: K tails within one tile and past two, three whole K tiles; N tails within one tile and past one,
#: one whole N tile; the scale cells take (8, 16), one tile (nearest 24 x 24: 1,025 experts, one program each)
DW_EXTENTS = ((8, 16), (40, 8), (48, 24))

GROUPED_GEMM_DX = _GroupedGemmDX(
    name="unsloth.grouped_gemm_dX", output="d_slots", extents=((16, 16), (32, 48), (48, 32)), **_BACKWARD,
    summary="unsloth grouped_gemm_dX(dY, W, gather_indices, m_sizes, topk, ..., permute_x, permute_y, ...): the "
            "per-slot input gradient dX [T*topk, K] (slot order under permute_x, expert order under permute_y)",
)
GROUPED_GEMM_DW = _GroupedGemmDW(
    name="unsloth.grouped_gemm_dW", output="d_experts", extents=DW_EXTENTS, **_BACKWARD,
    summary="unsloth grouped_gemm_dW(X, dY, m_sizes, gather_indices, topk, ..., permute_x, permute_y, ..., "
            "dW_dtype): the experts' gradient dW [E, N, K]",
)
GROUPED_GEMM_DW_ACCUMULATE = _GroupedGemmDWAccumulate(
    name="unsloth.grouped_gemm_dW_accumulate", output="d_experts", accumulates=True, out_argument="dW",
    extents=DW_EXTENTS, **_BACKWARD,
    summary="unsloth grouped_gemm_dW_accumulate(X, dY, m_sizes, gather_indices, dW, topk, ..., permute_x, "
            "permute_y, ...): the experts' gradient added into dW [E, N, K] in place",
)
