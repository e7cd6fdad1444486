"""The routing metadata fused-MoE kernels take, built as their libraries build it, and validated on its own.

vLLM / SGLang (``moe_align_block_size``, semantics from vLLM's ``csrc/moe/moe_align_sum_kernels.cu`` and
``fused_moe/moe_align_block_size.py``; docs/routed.md):

- ``sorted_token_ids`` (int32, ``max_num_tokens_padded = T*top_k + num_experts*(block_size - 1)`` entries,
  rounded up to a multiple of ``block_size`` with ``pad_sorted_ids``, and at most ``T*top_k*block_size`` when
  ``T*top_k < num_experts``): every entry starts as the sentinel ``T*top_k``; the experts' runs follow one
  another in increasing expert id, each holding the flat slot indices ``t*top_k + j`` routed to it and padded
  with the sentinel to a multiple of ``block_size``; an expert with no slot has no run. The order inside a run is
  not part of the contract (the CUDA op places slots with atomics); this builder keeps flat order.
- ``expert_ids`` (int32, ``ceil(max_num_tokens_padded / block_size)`` entries): the expert of each block of
  ``block_size`` entries; the blocks past ``num_tokens_post_padded`` hold 0 (which kernels never read). With an
  ``expert_map`` the ids are mapped through it afterwards (-1: the block's expert is on another rank, its rows
  are written as zeros); with ``ignore_invalid_experts`` the slots of non-local experts are left out instead and
  the runs are those of the local experts, by local id.
- ``num_tokens_post_padded`` (int32, ``[1]``): the padded runs' total length.

SGLang (``moe_align_block_size`` of ``srt/layers/moe/moe_runner/triton_utils``, its CUDA op called with
``num_experts + 1`` buckets and ``pad_sorted_token_ids=True``; docs/conventions.md): the layout above over the
buckets ``topk_ids + 1`` of *local* ids in ``[-1, E)`` (-1: another rank's expert, as SGLang's dispatcher maps
them), so the run of the -1 slots comes first and its blocks' ``expert_ids`` are -1 (bucket 0 minus one); the
sentinel is the same ``T*top_k``; ``sorted_token_ids`` has ``T*top_k*block_size`` entries when
``T*top_k < E + 1``, else ``T*top_k + (E + 1)*(block_size - 1)``, rounded up to a multiple of 4 (the op's int4
stores), all sentinels past the runs; ``expert_ids`` has ``ceil(len / block_size)`` entries, those past
``num_tokens_post_padded`` never written (``torch.empty``: :func:`sglang_moe_align_block_size` writes -1 there,
what the op writes with ``pad_expert_ids``). There is no ``expert_map`` argument: the ids are local already.

unsloth (``get_routing_indices``): ``m_sizes [E]`` (int32, per expert, not cumulative) and ``gather_indices
[T*top_k]`` (int64, the flat slot indices grouped by expert: a stable argsort of the flattened ``topk_ids``).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from gmm_ref.checks import as_int
from gmm_ref.routed.routing import check_expert_map, check_ids

__all__ = ["moe_align_block_size", "sglang_moe_align_block_size", "unsloth_routing_indices",
           "validate_moe_align_block_size", "validate_sglang_moe_align_block_size", "validate_unsloth_routing"]


def _positive(name: str, value: Any) -> int:
    v = as_int(name, value)
    if v < 1:
        raise ValueError(f"{name}: expected a positive integer, got {v}")
    return v


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def _keys(topk_ids: np.ndarray, expert_map: np.ndarray | None, ignore_invalid_experts: bool) -> np.ndarray:
    """The flat slots' run keys: global ids, or local ids (-1: left out) with ``ignore_invalid_experts``."""
    flat = topk_ids.reshape(-1).astype(np.int64)
    if expert_map is not None and ignore_invalid_experts:
        return expert_map.astype(np.int64)[flat]
    return flat


def max_num_tokens_padded(numel: int, block_size: int, num_experts: int, pad_sorted_ids: bool = False) -> int:
    """The length vLLM allocates for ``sorted_token_ids``."""
    size = numel + num_experts * (block_size - 1)
    if pad_sorted_ids:
        size = _cdiv(size, block_size) * block_size
    if numel < num_experts:
        size = min(numel * block_size, size)
    return size


def _check_align_args(topk_ids: Any, block_size: Any, num_experts: Any,
                      expert_map: Any) -> tuple[np.ndarray, int, int, np.ndarray | None]:
    block_size = _positive("block_size", block_size)
    num_experts = _positive("num_experts", num_experts)
    ids = check_ids("topk_ids", topk_ids, num_experts)
    if expert_map is not None:
        expert_map = check_expert_map(expert_map, None)
        if expert_map.shape[0] != num_experts:
            raise ValueError(f"expert_map: expected num_experts = {num_experts} entries (global -> local), "
                             f"got {expert_map.shape[0]}")
    return ids, block_size, num_experts, expert_map


def moe_align_block_size(topk_ids: Any, block_size: Any, num_experts: Any, expert_map: Any = None,
                         pad_sorted_ids: bool = False,
                         ignore_invalid_experts: bool = False) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """vLLM's ``moe_align_block_size`` in NumPy: ``(sorted_token_ids, expert_ids, num_tokens_post_padded)``
    (module docstring). ``topk_ids [T, top_k]`` int32/int64 in ``[0, num_experts)``; ``num_experts`` is the
    global count; ``expert_map [num_experts]`` global -> local (-1 elsewhere)."""
    ids, block_size, num_experts, expert_map = _check_align_args(topk_ids, block_size, num_experts, expert_map)
    numel = int(ids.size)
    size = max_num_tokens_padded(numel, block_size, num_experts, bool(pad_sorted_ids))
    sorted_ids = np.full(size, numel, np.int32)
    expert_ids = np.zeros(_cdiv(size, block_size), np.int32)
    keys = _keys(ids, expert_map, bool(ignore_invalid_experts))
    order = np.argsort(keys, kind="stable")
    sorted_keys = keys[order]
    start = 0
    for e in range(num_experts):
        run = order[np.searchsorted(sorted_keys, e, "left"):np.searchsorted(sorted_keys, e, "right")]
        sorted_ids[start:start + run.size] = run
        padded = _cdiv(run.size, block_size) * block_size
        expert_ids[start // block_size:(start + padded) // block_size] = e
        start += padded
    if expert_map is not None and not ignore_invalid_experts:
        expert_ids = expert_map.astype(np.int32)[expert_ids]
    return sorted_ids, expert_ids, np.array([start], np.int32)


def _flat_array(name: str, value: Any) -> np.ndarray:
    if not isinstance(value, np.ndarray) or value.ndim != 1 or not np.issubdtype(value.dtype, np.integer):
        shape = getattr(value, "shape", None)
        raise TypeError(f"{name}: expected a 1-D integer numpy array, got {type(value).__name__} of shape {shape}")
    return value.astype(np.int64)


def _slot(i: int, top_k: int) -> str:
    return f"token {i // top_k}, slot {i % top_k}"


def validate_moe_align_block_size(topk_ids: Any, block_size: Any, num_experts: Any, sorted_token_ids: Any,
                                  expert_ids: Any, num_tokens_post_padded: Any, expert_map: Any = None,
                                  ignore_invalid_experts: bool = False) -> None:
    """Raise ValueError naming the first index at which the metadata is not what ``moe_align_block_size`` makes
    of ``topk_ids`` (any order inside an expert's run; module docstring); return None when it is."""
    ids, bs, num_experts, expert_map = _check_align_args(topk_ids, block_size, num_experts, expert_map)
    sorted_ids = _flat_array("sorted_token_ids", sorted_token_ids)
    blocks = _flat_array("expert_ids", expert_ids)
    post = _flat_array("num_tokens_post_padded", num_tokens_post_padded)
    if post.shape != (1,):
        raise ValueError(f"num_tokens_post_padded: expected one entry, got shape {post.shape}")
    numel, total = int(ids.size), int(post[0])
    keys = _keys(ids, expert_map, bool(ignore_invalid_experts))
    counts = np.bincount(keys[keys >= 0], minlength=num_experts)
    want = int((-(-counts // bs) * bs).sum())
    if total != want:
        raise ValueError(f"num_tokens_post_padded[0] = {total}: expected {want}, the runs of "
                         f"{int((counts > 0).sum())} experts each padded to a multiple of block_size = {bs}")
    if sorted_ids.shape[0] < total or blocks.shape[0] < total // bs:
        raise ValueError(f"sorted_token_ids / expert_ids: expected at least {total} / {total // bs} entries "
                         f"(num_tokens_post_padded = {total}), got {sorted_ids.shape[0]} / {blocks.shape[0]}")
    start = 0
    for e in np.flatnonzero(counts):
        padded = _cdiv(int(counts[e]), bs) * bs
        _check_run(int(e), start, int(counts[e]), padded, sorted_ids, keys, numel, ids.shape[1])
        _check_run_blocks(int(e), start, padded, bs, blocks, expert_map, bool(ignore_invalid_experts))
        start += padded
    tail = np.flatnonzero(sorted_ids[total:] != numel)
    if tail.size:
        i = total + int(tail[0])
        raise ValueError(f"sorted_token_ids[{i}] = {int(sorted_ids[i])}: past num_tokens_post_padded = {total} "
                         f"every entry is the sentinel {numel}")


def _check_run(e: int, start: int, count: int, padded: int, sorted_ids: np.ndarray, keys: np.ndarray,
               numel: int, top_k: int) -> None:
    """Expert ``e``'s run ``sorted_ids[start:start + padded]``: its ``count`` slots, each once, then sentinels."""
    run = sorted_ids[start:start + padded]
    real = run[:count]
    sentinel = real == numel
    outside = ~sentinel & ((real < 0) | (real >= numel))
    wrong = ~sentinel & ~outside & (keys[np.clip(real, 0, max(numel - 1, 0))] != e)
    bad = np.flatnonzero(sentinel | outside | wrong)
    if bad.size:
        off = int(bad[0])
        i, v = start + off, int(real[off])
        if sentinel[off]:
            raise ValueError(f"sorted_token_ids[{i}] = {numel} (the sentinel) inside expert {e}'s run: its "
                             f"{count} slots come first, the padding after them")
        if outside[off]:
            raise ValueError(f"sorted_token_ids[{i}] = {v}: expected a flat slot index t*top_k + j in "
                             f"[0, {numel}) of expert {e}, or the sentinel {numel}")
        raise ValueError(f"sorted_token_ids[{i}] = {v} ({_slot(v, top_k)}) routes to expert {int(keys[v])}, "
                         f"but lies in expert {e}'s run")
    uniq, reps = np.unique(real, return_counts=True)
    if (reps > 1).any():
        v = int(uniq[reps > 1][0])
        at = start + np.flatnonzero(real == v)
        raise ValueError(f"sorted_token_ids[{int(at[1])}] = {v} ({_slot(v, top_k)}, expert {e}) repeats "
                         f"sorted_token_ids[{int(at[0])}]")
    pad = np.flatnonzero(run[count:] != numel)
    if pad.size:
        i = start + count + int(pad[0])
        raise ValueError(f"sorted_token_ids[{i}] = {int(sorted_ids[i])}: expected the sentinel {numel} padding "
                         f"expert {e}'s run of {count} slots to a multiple of the block size")


def _check_run_blocks(e: int, start: int, padded: int, bs: int, blocks: np.ndarray, expert_map: np.ndarray | None,
                      ignore_invalid_experts: bool) -> None:
    """The ``expert_ids`` of expert ``e``'s blocks: ``e``, mapped through ``expert_map`` where vLLM maps it."""
    want = e
    if expert_map is not None and not ignore_invalid_experts:
        want = int(expert_map[e])
    for b in range(start // bs, (start + padded) // bs):
        if blocks[b] != want:
            what = f"expert_map[{e}] = {want}" if want != e else f"expert {e}"
            raise ValueError(f"expert_ids[{b}] = {int(blocks[b])}: block {b} holds the slots of expert {e}, "
                             f"expected {what}")


def _sglang_ids(topk_ids: Any, num_experts: Any) -> tuple[np.ndarray, int]:
    """SGLang's local ``topk_ids`` in ``[-1, num_experts)`` (ValueError naming the first other) and the count
    (0 allowed: a rank whose slots all go to other ranks' experts)."""
    num_experts = as_int("num_experts", num_experts)
    if num_experts < 0:
        raise ValueError(f"num_experts: expected the local experts' count (0 or more), got {num_experts}")
    ids = topk_ids
    if isinstance(ids, np.ndarray) and ids.ndim == 2 and ids.dtype in (np.int32, np.int64):
        bad = np.argwhere((ids < -1) | (ids >= num_experts))
        if len(bad):
            t, j = (int(i) for i in bad[0])
            raise ValueError(f"topk_ids[{t}, {j}] = {int(ids[t, j])}: expected a local expert in "
                             f"[0, {num_experts}) or -1 (another rank's)")
        ids = ids + 1
    return check_ids("topk_ids", ids, num_experts + 1), num_experts


def sglang_max_num_tokens_padded(numel: int, block_size: int, num_experts: int) -> int:
    """The length SGLang allocates for ``sorted_token_ids`` (``num_experts`` local experts, one more bucket)."""
    buckets = num_experts + 1
    size = numel * block_size if numel < buckets else numel + buckets * (block_size - 1)
    return _cdiv(size, 4) * 4


def sglang_moe_align_block_size(topk_ids: Any, block_size: Any,
                                num_experts: Any) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """SGLang's ``moe_align_block_size`` in NumPy: ``(sorted_token_ids, expert_ids, num_tokens_post_padded)``
    (module docstring): vLLM's layout over the buckets ``topk_ids + 1``, resized to SGLang's length, each
    written block's expert its bucket minus one. ``topk_ids [T, top_k]`` int32/int64 local ids in
    ``[-1, num_experts)``."""
    buckets, num_experts = _sglang_ids(topk_ids, num_experts)
    block_size = _positive("block_size", block_size)
    runs, bucket_of_block, post = moe_align_block_size(buckets, block_size, num_experts + 1)
    numel, total = int(buckets.size), int(post[0])
    size = sglang_max_num_tokens_padded(numel, block_size, num_experts)
    sorted_ids = np.full(size, numel, np.int32)
    sorted_ids[:total] = runs[:total]
    expert_ids = np.full(_cdiv(size, block_size), -1, np.int32)
    expert_ids[:total // block_size] = bucket_of_block[:total // block_size] - 1
    return sorted_ids, expert_ids, post


def validate_sglang_moe_align_block_size(topk_ids: Any, block_size: Any, num_experts: Any, sorted_token_ids: Any,
                                         expert_ids: Any, num_tokens_post_padded: Any) -> None:
    """Raise ValueError naming the first index at which the metadata is not what
    :func:`sglang_moe_align_block_size` makes of ``topk_ids`` (any order inside a run; ``expert_ids`` past
    ``num_tokens_post_padded`` unread); return None when it is."""
    buckets, num_experts = _sglang_ids(topk_ids, num_experts)
    bs = _positive("block_size", block_size)
    sorted_ids = _flat_array("sorted_token_ids", sorted_token_ids)
    blocks = _flat_array("expert_ids", expert_ids)
    size = sglang_max_num_tokens_padded(int(buckets.size), bs, num_experts)
    if sorted_ids.shape[0] != size or blocks.shape[0] != _cdiv(size, bs):
        raise ValueError(f"sorted_token_ids / expert_ids: expected {size} / {_cdiv(size, bs)} entries (SGLang's "
                         f"length for {buckets.size} slots, {num_experts} + 1 buckets, block_size = {bs}), got "
                         f"{sorted_ids.shape[0]} / {blocks.shape[0]}")
    post = _flat_array("num_tokens_post_padded", num_tokens_post_padded)
    written = blocks[:int(post[0]) // bs] + 1 if post.shape == (1,) else blocks
    try:
        validate_moe_align_block_size(buckets, bs, num_experts + 1, sorted_token_ids, written, post)
    except ValueError as exc:  # vLLM's words over buckets: name SGLang's experts (bucket - 1)
        raise ValueError(f"in SGLang's +1 buckets (bucket b holds expert b - 1, bucket 0 the slots of -1): {exc}") \
            from None


def unsloth_routing_indices(topk_ids: Any, num_experts: Any) -> tuple[np.ndarray, np.ndarray]:
    """unsloth's ``get_routing_indices``: ``(m_sizes [E] int32, gather_indices [T*top_k] int64)``: the slots'
    count per expert, and the flat slot indices grouped by expert (a stable sort: flat order within one)."""
    num_experts = _positive("num_experts", num_experts)
    flat = check_ids("topk_ids", topk_ids, num_experts).reshape(-1)
    m_sizes = np.bincount(flat, minlength=num_experts).astype(np.int32)
    return m_sizes, np.argsort(flat, kind="stable").astype(np.int64)


def validate_unsloth_routing(topk_ids: Any, num_experts: Any, m_sizes: Any, gather_indices: Any) -> None:
    """Raise ValueError naming the first index at which ``m_sizes`` / ``gather_indices`` are not what
    :func:`unsloth_routing_indices` makes of ``topk_ids`` (any order inside one expert's slots)."""
    num_experts = _positive("num_experts", num_experts)
    ids = check_ids("topk_ids", topk_ids, num_experts)
    sizes = _flat_array("m_sizes", m_sizes)
    gather = _flat_array("gather_indices", gather_indices)
    flat, top_k = ids.reshape(-1).astype(np.int64), ids.shape[1]
    counts = np.bincount(flat, minlength=num_experts)
    if sizes.shape[0] != num_experts:
        raise ValueError(f"m_sizes: expected num_experts = {num_experts} entries, got {sizes.shape[0]}")
    bad = np.flatnonzero(sizes != counts)
    if bad.size:
        e = int(bad[0])
        hint = (" (m_sizes holds per-expert counts, not cumulative offsets)"
                if sizes.size and np.array_equal(sizes, np.cumsum(counts)) else "")
        raise ValueError(f"m_sizes[{e}] = {int(sizes[e])}: topk_ids routes {int(counts[e])} slots to expert {e}"
                         f"{hint}")
    if gather.shape[0] != flat.size:
        raise ValueError(f"gather_indices: expected T*top_k = {flat.size} entries, got {gather.shape[0]}")
    out = np.flatnonzero((gather < 0) | (gather >= flat.size))
    if out.size:
        i = int(out[0])
        raise ValueError(f"gather_indices[{i}] = {int(gather[i])}: expected a flat slot index in [0, {flat.size})")
    expert_of_row = np.repeat(np.arange(num_experts), counts)
    wrong = np.flatnonzero(flat[gather] != expert_of_row)
    if wrong.size:
        i = int(wrong[0])
        v = int(gather[i])
        raise ValueError(f"gather_indices[{i}] = {v} ({_slot(v, top_k)}) routes to expert {int(flat[v])}, but row "
                         f"{i} is in expert {int(expert_of_row[i])}'s rows (m_sizes)")
    uniq, reps = np.unique(gather, return_counts=True)
    if (reps > 1).any():
        v = int(uniq[reps > 1][0])
        at = np.flatnonzero(gather == v)
        raise ValueError(f"gather_indices[{int(at[1])}] = {v} ({_slot(v, top_k)}) repeats "
                         f"gather_indices[{int(at[0])}]")
