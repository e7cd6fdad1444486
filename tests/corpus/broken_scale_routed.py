"""Routed MoE kernels in ``vllm.fused_moe``'s convention with the bugs of ``property_tests.checks.scale_routed``'s
limits: slots past a grid axis of 65,535 blocks never written and an expert scan of 1,024 threads (only the scale mode's
cells reach them), an expert scan of 256 or 512 threads and per-expert weight pointers in a table of 128 (the routed
strategies' 257 and 513 experts reach them too). Each is a thin wrapper around a correct fused MoE (:func:`fused_moe`,
a torch one taking the convention's arguments; or vLLM's own kernel, ``test_scale_routed``), so that only the bug
differs. torch functions, imported where torch is installed."""

from __future__ import annotations

from typing import Any

import numpy as np

from gmm_ref.routed.metadata import moe_align_block_size

#: a CUDA grid axis holds at most 65,535 blocks (gridDim.y and gridDim.z)
GRID_AXIS_LIMIT = 65_535


def fused_moe(A, B, C, topk_weights, sorted_token_ids, expert_ids, num_tokens_post_padded, mul_routed_weight,
              top_k, config=None, compute_type=None):
    """A correct fused MoE in ``vllm.fused_moe``'s convention: per expert of the blocks below
    ``num_tokens_post_padded``, its slots (entries below ``T * top_k``) computed in float32, times their weight
    where ``mul_routed_weight``, and written to ``C``; a block of expert -1 writes zeros."""
    import torch

    bm = config["BLOCK_SIZE_M"]
    numel = A.shape[0] * top_k
    post = int(num_tokens_post_padded[0])
    rows = sorted_token_ids[:post].long()
    experts = expert_ids[:post // bm].long().repeat_interleave(bm)
    real = rows < numel
    rows, experts = rows[real], experts[real]
    out = C.view(numel, C.shape[-1])
    for e in torch.unique(experts).tolist():
        mine = rows[experts == e]
        if e < 0:
            out[mine] = 0
            continue
        acc = A[mine // top_k].float() @ B[e].float().T
        if mul_routed_weight:
            acc = acc * topk_weights.reshape(-1)[mine].float()[:, None]
        out[mine] = acc.to(C.dtype)


def fused_moe_returning(A, B, C, *args, **kwargs):
    """Correct, as :func:`fused_moe`, but into a tensor of its own, which it returns (docs/routed.md: a kernel fills
    C or returns the per-slot output); C is left as it was."""
    import torch

    mine = torch.zeros(C.shape, dtype=C.dtype, device=C.device)
    fused_moe(A, B, mine, *args, **kwargs)
    return mine


def grid_capped(kernel: Any) -> Any:
    """``kernel`` whose slots sit on a grid axis of one-slot blocks capped at 65,535: the flat slots
    ``t * top_k + j`` past the 65,535th are never written (the class of
    github.com/FlashML-org/FreeToken/issues/186: tokens * top_k on gridDim.z; a kernel that clamps its grid
    drops the slots)."""

    def capped(A, B, C, *args, **kwargs):
        import torch

        mine = torch.full_like(C, float("nan"))
        kernel(A, B, mine, *args, **kwargs)
        n = C.shape[-1]
        C.view(-1, n)[:GRID_AXIS_LIMIT] = mine.view(-1, n)[:GRID_AXIS_LIMIT]

    return capped


def table_of_128(kernel: Any) -> Any:
    """``kernel`` whose per-expert weight pointers live in a table of 128 entries: local expert e multiplies by
    the weights of expert e % 128 (a pointer array sized for Qwen3's 128 experts)."""

    def table(A, B, *args, **kwargs):
        import torch

        return kernel(A, B[torch.arange(B.shape[0]) % 128], *args, **kwargs)

    return table


def scan_of(width: int, sorted_ids: np.ndarray, blocks: np.ndarray, topk_ids: np.ndarray, block_size: int,
            num_experts: int, expert_map: np.ndarray | None) -> tuple[np.ndarray, np.ndarray]:
    """``moe_align_block_size``'s ``(sorted_token_ids, expert_ids)`` as an alignment whose expert scan runs in one
    block of ``width`` threads, one expert each, builds them: the runs of the global experts past the
    ``width``-th are never placed (their entries stay the sentinel), so their slots are never written (the class
    of github.com/sgl-project/sglang/pull/21610: a CUB block scan of 1,024 threads capped the experts at 1,024)."""
    sorted_ids, blocks = sorted_ids.copy(), blocks.copy()
    _, global_ids, post = moe_align_block_size(topk_ids, block_size, num_experts)
    for b in np.flatnonzero(global_ids[:post[0] // block_size] >= width):
        sorted_ids[b * block_size:(b + 1) * block_size] = topk_ids.size
    return sorted_ids, blocks


def fused_moe_int32_token_offsets(A, B, C, topk_weights, sorted_token_ids, expert_ids, num_tokens_post_padded,
                                  mul_routed_weight, top_k, config=None, compute_type=None):
    """Wrong: reads token t's row of A at ``t * stride_am`` computed in int32 (vLLM's kernel casts the token ids to
    int64 first; a kernel that does not wraps past 2**31 - 1 elements): right while A holds fewer, its rows read
    from before A's start past it."""
    import torch

    s = A.stride(0)
    rows = []
    for t in range(A.shape[0]):
        offset = int(np.int64(t * s).astype(np.int32))  # the int32 product, wrapped
        rows.append(torch.as_strided(A, (A.shape[1],), (A.stride(1),), A.storage_offset() + offset))
    fused_moe(torch.stack(rows) if rows else A, B, C, topk_weights, sorted_token_ids, expert_ids,
              num_tokens_post_padded, mul_routed_weight, top_k, config, compute_type)
