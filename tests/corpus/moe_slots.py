"""Fused-MoE kernels in the per-slot signature with global expert ids (``torch.moe_slots``), as their authors write
them and the loops they test them against: a correct one, and one that mixes global and local expert ids."""

from __future__ import annotations


def _slots(A, B, topk_ids, topk_weights, mul_routed_weight, expert_map, *, local_of):
    import torch

    t, top_k = topk_ids.shape
    out = torch.zeros((t, top_k, B.shape[1]), dtype=torch.float32)
    for i in range(t):
        for j in range(top_k):
            e = local_of(int(topk_ids[i, j]), expert_map)
            if e < 0 or e >= B.shape[0]:
                continue
            row = B[e].float() @ A[i].float()
            out[i, j] = row * float(topk_weights[i, j]) if mul_routed_weight else row
    return out.to(A.dtype)


def moe_slots(A, B, topk_ids, topk_weights, mul_routed_weight, expert_map=None):
    """Right: each slot's global expert through the expert map (-1: another rank's, a zero row)."""
    return _slots(A, B, topk_ids, topk_weights, mul_routed_weight, expert_map,
                  local_of=lambda g, emap: g if emap is None else int(emap[g]))


def moe_slots_global_as_local(A, B, topk_ids, topk_weights, mul_routed_weight, expert_map=None):
    """Wrong: indexes this rank's experts by the global id, the expert map read only to drop another rank's slots
    (right on rank 0 of a contiguous placement, wrong on every other rank and any scattered map)."""
    return _slots(A, B, topk_ids, topk_weights, mul_routed_weight, expert_map,
                  local_of=lambda g, emap: g if emap is None or int(emap[g]) >= 0 else -1)


_PLANS: dict = {}


def moe_slots_plan_cached_by_shape(A, B, topk_ids, topk_weights, mul_routed_weight, expert_map=None):
    """Wrong: the slots' order by expert (a launch plan: sorted token ids, counts per expert) is computed once per
    shape and kept, as a kernel captured in a CUDA graph for a batch size replays it: right on the first routing of
    a shape, wrong on every later one that routes differently."""
    import torch

    key = (tuple(topk_ids.shape), tuple(B.shape))
    if key not in _PLANS:
        _PLANS[key] = topk_ids.clone()
    plan = _PLANS[key]
    t, top_k = topk_ids.shape
    out = torch.zeros((t, top_k, B.shape[1]), dtype=torch.float32)
    for i in range(t):
        for j in range(top_k):
            g = int(plan[i, j])
            e = g if expert_map is None else int(expert_map[g])
            if 0 <= e < B.shape[0]:
                row = B[e].float() @ A[i].float()
                out[i, j] = row * float(topk_weights[i, j]) if mul_routed_weight else row
    return out.to(A.dtype)
