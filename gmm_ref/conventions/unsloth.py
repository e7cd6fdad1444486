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
from gmm_ref.routing import Routing
from gmm_ref.routing_metadata import unsloth_routing_indices

__all__ = ["FORMS", "GROUPED_GEMM", "GROUPED_GEMM_CONFIG", "form_of"]

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
