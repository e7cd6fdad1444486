"""Deliberately broken kernels whose bug shows only at element offsets past 2**31: the large mode's strided cells
(``property_tests.checks.large_strided``) reject each, naming the group and the row; the default modes pass them
(``test_large_strided``). A torch kernel in ``torch._grouped_mm``'s convention (all four forms) that reads its
operands at element offsets computed in int32."""

from __future__ import annotations

from tests.corpus.broken_kernels import grouped_mm_correct


def int32_offsets(x):
    """``x``'s elements read as a kernel computing each one's offset ``sum(index * stride)`` in int32 reads them: at
    that offset wrapped to [-2**31, 2**31) from ``x``'s first element (a wrapped offset lands before it, where the
    large mode's cells leave zeros: its allocation starts 2**31 elements earlier)."""
    storage, at = _wrapped(x)
    return storage[at]


def _wrapped(x):
    """(``x``'s whole storage as a 1-d tensor, each element's place in it at its offset computed in int32)."""
    import torch

    idx = torch.zeros(x.shape, dtype=torch.int64)
    for axis, (extent, stride) in enumerate(zip(x.shape, x.stride(), strict=True)):
        shape = [1] * x.dim()
        shape[axis] = extent
        idx = idx + torch.arange(extent, dtype=torch.int64).reshape(shape) * stride
    storage = torch.empty(0, dtype=x.dtype, device=x.device).set_(x.untyped_storage())
    return storage, x.storage_offset() + (idx + 2**31) % 2**32 - 2**31


def grouped_mm_int32_offsets(mat_a, mat_b, offs=None, bias=None, out_dtype=None):
    """torch._grouped_mm whose element offsets into mat_a and mat_b (a row, a column or a K index times its stride,
    a group times its stride) are computed in int32: past 2**31 - 1 they wrap, and the kernel reads memory before
    the operand (the class of broken_kernels.ragged_dot_int32_row_offsets, github.com/vllm-project/vllm/issues/5938,
    and of grouped-mm-bf16 0.1.7's kernels: gmm_kernels.adapters.torch_grouped.GMM_BF16_INT32_OFFSETS)."""
    return grouped_mm_correct(int32_offsets(mat_a), int32_offsets(mat_b), offs, bias, out_dtype)


def batched_int32_out_offsets(A, B, C, expert_num_tokens, compute_type=None, A_scale=None, B_scale=None, B_zp=None,
                              use_fp8_w8a8=False, use_int8_w8a16=False, use_int4_w4a16=False, config=None,
                              per_act_token_quant=False, block_shape=None):
    """vLLM's batched experts (``vllm.batched_moe``) storing into C at element offsets (an expert times its stride,
    a row times its stride) computed in int32: past 2**31 - 1 the stores land before C, and C keeps what it held
    (vLLM's own kernel types its strides ``tl.int64``)."""
    from tests.corpus.broken_serving import batched_correct

    result = C.clone()
    batched_correct(A, B, result, expert_num_tokens, compute_type, A_scale, B_scale, B_zp, use_fp8_w8a8,
                    use_int8_w8a16, use_int4_w4a16, config, per_act_token_quant, block_shape)
    storage, at = _wrapped(C)
    storage[at] = result
