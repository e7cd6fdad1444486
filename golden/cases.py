"""This repository's golden corpus: small cases, each tied to the convention whose kernels check against it.

Every family (ragged_m, ragged_n, ragged_k, batch) meets the edge classes
(empty groups first / middle / last / in runs / all but one / all, G = 1,
boundaries aligned to no tile, a padded tail past ``sum(group_sizes)``, NaN
poison where no group reads, sharded groups with and without an existing
output) and the dtypes float32, bfloat16, float16 (int8 where the kernel takes
it; one float8 case for the reference). Shapes are few per convention, as
kernels compile once per shape (interpreted Pallas costs about a second each):

- ``ragged_dot``: ``[24, 16] x [G, 16, 8]`` (G = 4; one G = 1);
- ``ragged_dot_general``: ``[2, 16, 8]`` batched mode 1, transposed mode 1,
  mode 2 ``[8, 24] x [24, 8]`` (batched too), mode 3 ``[3, 2, 8, 16]``;
- ``megablox.gmm``: ``[32, 24] x [G, 24, 16]``, tiling (16, 16, 16) (a K remainder);
- ``megablox.tgmm``: ``[16, 32] x [32, 16]``, tiling (16, 16, 16);
- ``torch.grouped_mm``: every operand's last dim times its itemsize a multiple of 16 bytes;
- ``te.grouped_gemm`` (reference only): packed and first/last layouts (TE has no ragged N);
- ``torch.scaled_grouped_mm``: float8_e4m3fn codes with rowwise float32 scales, K and N multiples of 16;
- ``qwix.ragged_dot``: ``[40, 32] x [3, 32, 16]`` QArrays (per row / channel, K tiles of 16, per group);
- ``deep_gemm.*`` (reference only here): ``[M, 256] x [G, 144, 256]`` bf16 or FP8 (1x128 x 128x128 float32
  scales, or 1x128 x 1x128 power-of-two scales), groups at multiples of 128 rows; masked ``[4, 200, 256]``;
- ``vllm.batched_moe`` (reference only here): ``[4, 32, 256] x [4, 48, 256]`` into an existing ``C``, bf16 or
  FP8 per token / in 128x128 blocks.
- ``vllm.fused_moe`` (the routed family, ``golden.routed``): tokens ``[T, K]``, experts ``[E, N, K]``, the
  per-slot output ``[T, top_k, N]``; ``(K, N)`` of ``(16, 8)`` (within one 32-wide tile) or ``(40, 40)`` (past
  one); top_k 1, 2 and 8; experts no slot routes to; an ``expert_map`` with other ranks' experts; T = 1.
- ``sglang.fused_moe`` and ``unsloth.grouped_gemm`` (routed, per slot): two cases each;
- unsloth's backward kernels (routed, each with its cotangent ``dY [T, top_k, N]``, ``golden.routed``): the
  per-slot input gradient of ``unsloth.grouped_gemm_dX`` (bf16 with a token listing one expert twice, float32
  exact) and the experts' gradient of ``unsloth.grouped_gemm_dW`` (fp16 with experts no slot routes to, T = 1
  exact) and of ``unsloth.grouped_gemm_dW_accumulate`` (bf16, added into a seeded existing gradient);
- ``torch.moe_slots`` (routed, per slot, the router's global ids): bf16 weighted through a scattered expert map,
  float32 top_k 4 exact and unweighted;
- ``torch.moe_experts`` (routed, the combined ``[T, N]`` output): bf16 top_k 8 with a peaked router and tokens whose
  slots repeat one expert (what a combine summing in bf16 loses), float32 top_k 4, fp16 with an ``expert_map`` and
  poison, T = 1 with exact values.

Tags name the edge classes a case covers (``python -m golden list``).
"""

from __future__ import annotations

from golden.case import Case

__all__ = ["CASES"]

RD = dict(convention="ragged_dot", family="ragged_m", m=24, k=16, n=8)
RDG_M = dict(convention="ragged_dot_general", family="ragged_m", m=16, k=8, n=8)
RDG_K = dict(convention="ragged_dot_general", family="ragged_k", m=8, k=24, n=8)
GMM = dict(convention="megablox.gmm", family="ragged_m", m=32, k=24, n=16, tiling=(16, 16, 16))
TGMM = dict(convention="megablox.tgmm", family="ragged_k", m=16, k=32, n=16, tiling=(16, 16, 16))
TM = dict(convention="torch.grouped_mm")
TE = dict(convention="te.grouped_gemm")
QW = dict(convention="qwix.ragged_dot", family="ragged_m", m=40, k=32, n=16, out_dtype="float32")
TSC = dict(convention="torch.scaled_grouped_mm", dtype="float8_e4m3fn", out_dtype="bfloat16")
DGC = dict(convention="deep_gemm.m_grouped_contiguous", family="padded_contiguous", k=256, n=144,
           rhs_transposed=True, alignment=128, dtype="float8_e4m3fn", out_dtype="bfloat16", tiling=(128, 128, 128))
DGM = dict(convention="deep_gemm.m_grouped_masked", family="masked", m=200, k=256, n=144, rhs_transposed=True,
           dtype="float8_e4m3fn", out_dtype="bfloat16", tiling=(128, 128, 128))
MOE = dict(convention="vllm.fused_moe", family="routed")
SGLANG_MOE = dict(convention="sglang.fused_moe", family="routed")
UNSLOTH = dict(convention="unsloth.grouped_gemm", family="routed")
UNSLOTH_DX = dict(convention="unsloth.grouped_gemm_dX", family="routed")
UNSLOTH_DW = dict(convention="unsloth.grouped_gemm_dW", family="routed")
TORCH_MOE = dict(convention="torch.moe_experts", family="routed", mul_routed_weight=True)
TORCH_SLOTS = dict(convention="torch.moe_slots", family="routed")
VB = dict(convention="vllm.batched_moe", family="masked", m=32, k=256, n=48, rhs_transposed=True,
          dtype="float8_e4m3fn", out_dtype="bfloat16", tiling=(16, 128, 32))

CASES: list[Case] = [
    # ---------------------------------------------------------------- ragged_dot (lax, mode 1)
    Case("rd-f32-empty-first-middle", **RD, group_sizes=[0, 7, 0, 17], seed=1,
         tags=("empty_first", "empty_middle", "unaligned")),
    Case("rd-f32-tail-poison", **RD, group_sizes=[5, 3, 9, 2], poison=True, seed=2,
         tags=("tail", "poison", "unaligned")),
    Case("rd-f32-all-empty", **RD, group_sizes=[0, 0, 0, 0], seed=3, tags=("all_empty", "tail")),
    Case("rd-f32-exact-all-but-one-empty", **RD, group_sizes=[0, 0, 24, 0], kind="int", int_range=4,
         seed=4, tags=("all_but_one_empty", "exact")),
    Case("rd-f32-g1-tail", convention="ragged_dot", family="ragged_m", m=24, k=16, n=8,
         group_sizes=[17], seed=5, tags=("g1", "tail")),
    Case("rd-bf16-empty-last-run", **RD, dtype="bfloat16", group_sizes=[11, 13, 0, 0], seed=6,
         tags=("empty_last", "empty_run")),
    Case("rd-bf16-f32out-tail", **RD, dtype="bfloat16", out_dtype="float32", group_sizes=[1, 0, 18, 0],
         seed=7, tags=("tail", "empty_middle", "empty_last")),
    Case("rd-f16-tail", **RD, dtype="float16", group_sizes=[6, 6, 6, 3], seed=8, tags=("tail",)),
    Case("rd-int8-empty-middle", **RD, dtype="int8", group_sizes=[3, 0, 10, 8], kind="int", int_range=100,
         seed=9, tags=("empty_middle", "tail", "exact")),
    # ------------------------------------------------------------------- ragged_dot_general
    Case("rdg-m-f32-batch-sizes", **RDG_M, batch_shape=(2,), group_sizes=[[5, 0, 7], [0, 0, 16]], seed=20,
         tags=("batch_dims", "tail", "empty_middle", "all_but_one_empty")),
    Case("rdg-m-bf16-transposed", **RDG_M, dtype="bfloat16", out_dtype="float32", lhs_transposed=True,
         rhs_transposed=True, group_sizes=[4, 0, 9], poison=True, seed=21,
         tags=("transposed", "tail", "poison", "empty_middle")),
    Case("rdg-k-bf16-tail-poison", **RDG_K, dtype="bfloat16", out_dtype="float32", group_sizes=[0, 9, 0, 10],
         poison=True, seed=22, tags=("empty_first", "empty_middle", "tail", "poison")),
    Case("rdg-k-f16-batch-transposed", **RDG_K, dtype="float16", batch_shape=(2,), lhs_transposed=True,
         group_sizes=[[7, 0, 17, 0], [0, 12, 0, 12]], seed=23,
         tags=("batch_dims", "transposed", "empty_middle", "empty_last", "empty_first")),
    Case("rdg-k-f32-all-empty", **RDG_K, group_sizes=[0, 0, 0, 0], seed=24, tags=("all_empty", "tail")),
    Case("rdg-k-int8", **RDG_K, dtype="int8", group_sizes=[11, 0, 13, 0], kind="int", int_range=120, seed=25,
         tags=("empty_middle", "empty_last", "exact")),
    Case("rdg-batch-f32", convention="ragged_dot_general", family="batch", m=8, k=16, n=8, groups=3,
         batch_shape=(2,), seed=26, tags=("batch_dims",)),
    Case("rdg-batch-bf16-exact", convention="ragged_dot_general", family="batch", m=8, k=16, n=8, groups=3,
         dtype="bfloat16", kind="int", int_range=3, seed=27, tags=("exact",)),
    # ---------------------------------------------------------------------- megablox gmm
    Case("gmm-f32-tail-unaligned", **GMM, group_sizes=[5, 0, 11, 9], seed=40,
         tags=("tail", "unaligned", "empty_middle")),
    Case("gmm-f32-all-empty-existing", **GMM, group_sizes=[0, 0, 0, 0], existing=True, seed=41,
         tags=("all_empty", "tail", "existing")),
    Case("gmm-f32-exact-poison", **GMM, group_sizes=[0, 13, 14, 0], kind="int", int_range=3, poison=True,
         seed=42, tags=("exact", "poison", "tail", "empty_first", "empty_last")),
    Case("gmm-bf16-aligned", **GMM, dtype="bfloat16", group_sizes=[0, 16, 3, 13], seed=43,
         tags=("empty_first", "unaligned")),
    Case("gmm-bf16-f32out-transposed", **GMM, dtype="bfloat16", out_dtype="float32", rhs_transposed=True,
         group_sizes=[7, 7, 7, 7], seed=44, tags=("transposed", "tail", "unaligned")),
    Case("gmm-f32-sharded-poison", **GMM, group_sizes=[6, 10, 0, 9], group_offset=1, num_local_groups=2,
         poison=True, seed=45, tags=("sharded", "tail", "empty_middle", "poison")),
    Case("gmm-f32-sharded-existing", **GMM, group_sizes=[6, 10, 0, 9], group_offset=1, num_local_groups=2,
         existing=True, seed=46, tags=("sharded", "existing", "tail")),
    Case("gmm-bf16-sharded-existing-last", **GMM, dtype="bfloat16", group_sizes=[9, 0, 12, 5],
         group_offset=2, num_local_groups=2, existing=True, seed=47, tags=("sharded", "existing", "tail")),
    # --------------------------------------------------------------------- megablox tgmm
    Case("tgmm-f32-empty-tail", **TGMM, group_sizes=[0, 9, 0, 13], seed=60,
         tags=("empty_first", "empty_middle", "tail", "unaligned")),
    Case("tgmm-f32-all-empty", **TGMM, group_sizes=[0, 0, 0, 0], seed=61, tags=("all_empty", "tail")),
    Case("tgmm-bf16-f32out", **TGMM, dtype="bfloat16", out_dtype="float32", group_sizes=[10, 0, 22, 0],
         seed=62, tags=("empty_middle", "empty_last", "unaligned")),
    Case("tgmm-bf16-exact", **TGMM, dtype="bfloat16", group_sizes=[3, 29, 0, 0], kind="int", int_range=2,
         seed=63, tags=("exact", "empty_run")),
    Case("tgmm-f32-sharded-existing", **TGMM, group_sizes=[7, 0, 11, 8], group_offset=1, num_local_groups=2,
         existing=True, seed=64, tags=("sharded", "existing", "empty_middle", "tail")),
    Case("tgmm-f32-sharded-poison", **TGMM, group_sizes=[7, 5, 11, 8], group_offset=2, num_local_groups=2,
         poison=True, seed=65, tags=("sharded", "tail", "poison")),
    # ----------------------------------------------------------------- torch._grouped_mm
    Case("torch-m-f32-tail", **TM, family="ragged_m", m=24, k=16, n=8, group_sizes=[0, 9, 0, 11], seed=80,
         tags=("empty_first", "empty_middle", "tail", "unaligned")),
    Case("torch-k-bf16-all-empty", **TM, family="ragged_k", m=8, k=24, n=8, dtype="bfloat16",
         group_sizes=[0, 0, 0], seed=81, tags=("all_empty", "tail")),
    Case("torch-m-f16-aligned", **TM, family="ragged_m", m=24, k=16, n=8, dtype="float16",
         group_sizes=[8, 16, 0, 0], seed=82, tags=("empty_run", "empty_last")),
    Case("torch-n-bf16-tail-poison", **TM, family="ragged_n", m=8, k=16, n=24, dtype="bfloat16",
         group_sizes=[8, 0, 13], poison=True, seed=83, tags=("tail", "poison", "empty_middle", "unaligned")),
    Case("torch-n-f32-exact", **TM, family="ragged_n", m=8, k=16, n=24, group_sizes=[5, 19, 0],
         kind="int", int_range=5, seed=84, tags=("exact", "empty_last", "unaligned")),
    Case("torch-k-f16-unaligned", **TM, family="ragged_k", m=8, k=24, n=8, dtype="float16",
         group_sizes=[0, 10, 14], seed=85, tags=("empty_first", "unaligned")),
    Case("torch-k-f32-aligned-tail", **TM, family="ragged_k", m=8, k=24, n=8, group_sizes=[8, 0, 8],
         seed=86, tags=("empty_middle", "tail")),
    Case("torch-batch-f32", **TM, family="batch", m=8, k=16, n=8, groups=3, seed=87, tags=()),
    # K = 64: two 1x32 blocks, so a kernel that quantizes to MXFP8 inside (torchao) has a golden too
    Case("torch-m-bf16-k64-tail", **TM, family="ragged_m", m=40, k=64, n=16, dtype="bfloat16",
         group_sizes=[0, 13, 19], seed=89, tags=("empty_first", "tail", "unaligned")),
    Case("torch-batch-bf16-exact", **TM, family="batch", m=8, k=16, n=8, groups=3, dtype="bfloat16",
         kind="int", int_range=3, seed=88, tags=("exact",)),
    # ------------------------------------------------- torch._scaled_grouped_mm (rowwise FP8)
    Case("tsc-m-e4m3-tail-poison", **TSC, family="ragged_m", m=40, k=32, n=16, group_sizes=[0, 13, 0, 19],
         poison=True, seed=120, tags=("scaled", "empty_first", "empty_middle", "tail", "poison", "unaligned")),
    Case("tsc-m-e4m3-exact", **TSC, family="ragged_m", m=40, k=32, n=16, group_sizes=[8, 16, 16, 0],
         kind="int", int_range=3, seed=121, tags=("scaled", "exact", "empty_last")),
    Case("tsc-n-e4m3-unaligned", **TSC, family="ragged_n", m=8, k=32, n=48, group_sizes=[17, 0, 30],
         seed=122, tags=("scaled", "empty_middle", "tail", "unaligned")),
    Case("tsc-k-e4m3-empty", **TSC, family="ragged_k", m=8, k=48, n=16, group_sizes=[0, 21, 27],
         seed=123, tags=("scaled", "empty_first", "unaligned")),
    Case("tsc-batch-e4m3", **TSC, family="batch", m=8, k=32, n=16, groups=3, seed=124, tags=("scaled",)),
    # the MXFP8 form: e8m0 scales per 32 of K, each group's block padded to 128 rows and swizzled
    Case("tsc-m-mxfp8-tail", **TSC, family="ragged_m", m=40, k=96, n=16, group_sizes=[0, 13, 19], quant=1, seed=125,
         tags=("scaled", "mxfp8", "empty_first", "tail", "unaligned")),
    Case("tsc-k-mxfp8-partial-blocks", **TSC, family="ragged_k", m=8, k=112, n=16, group_sizes=[40, 0, 64],
         quant=1, seed=126, tags=("scaled", "mxfp8", "empty_middle", "partial_block")),
    # ------------------------------------------------------ qwix.ragged_dot (QArray operands)
    Case("qwix-e4m3-row-tail", **QW, dtype="float8_e4m3fn", group_sizes=[11, 0, 17], quant=0, seed=130,
         tags=("scaled", "empty_middle", "tail", "unaligned")),
    Case("qwix-e4m3-k-tiles", **QW, dtype="float8_e4m3fn", group_sizes=[0, 20, 12], quant=1, seed=131,
         tags=("scaled", "empty_first", "unaligned")),
    Case("qwix-int8-per-group", **QW, dtype="int8", kind="int", int_range=100, group_sizes=[16, 0, 0],
         quant=2, seed=132, tags=("scaled", "exact", "empty_run", "empty_last", "tail")),
    Case("qwix-int4-k-tiles", **QW, dtype="int4", kind="int", int_range=7, group_sizes=[0, 23, 9], quant=1,
         seed=133, tags=("scaled", "int4", "empty_first", "unaligned")),
    # ------------------------------------- torchao NVFP4 (packed e2m1 codes, e4m3 scales per 16 of K)
    Case("tao-nvfp4-tail", convention="torchao.nvfp4_grouped_mm", family="ragged_m", m=40, k=64, n=16,
         dtype="float4_e2m1fn", out_dtype="bfloat16", rhs_transposed=True, group_sizes=[0, 13, 19], seed=160,
         tags=("scaled", "nvfp4", "empty_first", "tail", "unaligned")),
    Case("tao-nvfp4-f32-exact", convention="torchao.nvfp4_grouped_mm", family="ragged_m", m=40, k=32, n=8,
         dtype="float4_e2m1fn", out_dtype="float32", rhs_transposed=True, group_sizes=[21, 0, 19], kind="int",
         int_range=4, seed=161, tags=("scaled", "nvfp4", "exact", "empty_middle")),
    # torch's NVFP4 form (F.scaled_grouped_mm): e4m3 blocks per 16 of K times each group's float32 global scales
    Case("tsc2-nvfp4-global-tail", convention="torch.scaled_grouped_mm_v2", family="ragged_m", m=40, k=64, n=16,
         dtype="float4_e2m1fn", out_dtype="bfloat16", rhs_transposed=True, group_sizes=[0, 13, 19], seed=162,
         tags=("scaled", "nvfp4", "global_scale", "empty_first", "tail", "unaligned")),
    # -------------------------------------- DeepGEMM m-grouped contiguous / masked, vLLM batched (serving layouts)
    # groups at multiples of 128 rows (-1 padding rows, or the psum form's cumulative ends), K in 128-wide blocks
    Case("dg-contig-bf16-padding", **{**DGC, "dtype": "bfloat16"}, m=400, group_sizes=[0, 127, 1, 129], poison=True,
         seed=140, tags=("padded", "empty_first", "edge_off_by_one", "poison")),
    Case("dg-contig-e4m3-sm90", **DGC, m=384, group_sizes=[128, 0, 129], seed=141,
         tags=("scaled", "padded", "aligned", "empty_middle")),
    Case("dg-contig-e4m3-sm100-exact", **DGC, m=300, group_sizes=[5, 40], quant=1, kind="int", int_range=3,
         seed=142, tags=("scaled", "padded", "exact", "power_of_two_scales")),
    Case("dg-psum-e4m3-sm90", **{**DGC, "convention": "deep_gemm.m_grouped_contiguous_psum"}, m=384,
         group_sizes=[1, 0, 200], seed=143, tags=("scaled", "padded", "psum", "empty_middle")),
    Case("dg-masked-bf16", **{**DGM, "dtype": "bfloat16"}, group_sizes=[0, 130, 200, 7], poison=True, seed=144,
         tags=("masked", "empty_first", "poison")),
    Case("dg-masked-e4m3-sm90", **DGM, group_sizes=[200, 0, 1, 128], seed=145,
         tags=("scaled", "masked", "empty_middle", "full_group")),
    Case("vllm-batched-bf16", **{**VB, "dtype": "bfloat16"}, group_sizes=[0, 5, 32, 17], existing=True, poison=True,
         seed=150, tags=("masked", "existing", "poison")),
    Case("vllm-batched-e4m3-block", **VB, group_sizes=[3, 0, 32, 31], existing=True, quant=2, seed=151,
         tags=("scaled", "masked", "existing", "blocks")),
    Case("vllm-batched-e4m3-per-token", **VB, group_sizes=[32, 1, 0, 9], existing=True, quant=1, seed=152,
         tags=("scaled", "masked", "existing", "per_token")),
    # ------------------------------------------- vLLM's fused MoE (routed: gather, grouped GEMM, weighted scatter)
    Case("moe-vllm-bf16-top2-tiles", **MOE, m=12, k=40, n=40, groups=8, top_k=2, dtype="bfloat16",
         mul_routed_weight=True, seed=200, tags=("routed", "top_k_2", "weighted", "unaligned")),
    Case("moe-vllm-f16-top1-empty-experts", **MOE, m=5, k=16, n=8, groups=16, top_k=1, dtype="float16", seed=201,
         tags=("routed", "top_k_1", "empty_expert")),
    Case("moe-vllm-f32-top8-exact", **MOE, m=6, k=16, n=8, groups=12, top_k=8, kind="int", int_range=2,
         mul_routed_weight=True, seed=202, tags=("routed", "top_k_8", "exact", "weighted")),
    Case("moe-vllm-bf16-expert-map-poison", **MOE, m=9, k=16, n=8, groups=8, top_k=2, dtype="bfloat16",
         expert_map=[-1, 0, -1, 1, 2, -1, 3, -1], mul_routed_weight=True, poison=True, seed=203,
         tags=("routed", "expert_map", "foreign", "poison", "weighted")),
    Case("moe-vllm-f32-t1", **MOE, m=1, k=40, n=40, groups=60, top_k=2, seed=204,
         tags=("routed", "t1", "empty_expert", "unaligned")),
    # ------------------------------------------- SGLang's fused MoE (local ids, -1 for another rank's expert)
    Case("moe-sglang-bf16-top2-expert-map", **SGLANG_MOE, m=10, k=40, n=40, groups=8, top_k=2, dtype="bfloat16",
         expert_map=[0, -1, 1, 2, -1, 3, 4, -1], mul_routed_weight=True, poison=True, seed=210,
         tags=("routed", "top_k_2", "expert_map", "foreign", "poison", "weighted", "unaligned")),
    Case("moe-sglang-f16-top8-even-k", **SGLANG_MOE, m=4, k=32, n=8, groups=12, top_k=8, dtype="float16",
         seed=211, tags=("routed", "top_k_8", "empty_expert")),
    # ------------------------------------------- unsloth's grouped GEMM (its form follows from the routing)
    Case("moe-unsloth-bf16-permute-y-fused-weight", **UNSLOTH, m=7, k=32, n=24, groups=8, top_k=2,
         dtype="bfloat16", mul_routed_weight=True, seed=220, tags=("routed", "top_k_2", "weighted")),
    Case("moe-unsloth-f32-permute-x-exact", **UNSLOTH, m=6, k=48, n=40, groups=9, top_k=4, kind="int",
         int_range=2, seed=221, tags=("routed", "top_k_4", "exact", "empty_expert")),
    # ------------------- unsloth's backward: the per-slot input gradient dX and the experts' gradient dW (with dY)
    Case("moe-unsloth-dx-bf16-top2-repeat", **UNSLOTH_DX, m=9, k=32, n=48, groups=8, top_k=2, dtype="bfloat16",
         repeat_tokens=(3,), seed=240, tags=("routed", "backward", "top_k_2", "repeated_expert")),
    Case("moe-unsloth-dx-f32-top4-exact", **UNSLOTH_DX, m=5, k=16, n=16, groups=6, top_k=4, kind="int",
         int_range=2, seed=241, tags=("routed", "backward", "top_k_4", "exact")),
    Case("moe-unsloth-dw-f16-top2-empty-experts", **UNSLOTH_DW, m=7, k=40, n=8, groups=12, top_k=2,
         dtype="float16", seed=246, tags=("routed", "backward", "top_k_2", "empty_expert", "unaligned")),
    Case("moe-unsloth-dw-f32-t1-exact", **UNSLOTH_DW, m=1, k=48, n=24, groups=12, top_k=4, kind="int",
         int_range=2, seed=243, tags=("routed", "backward", "t1", "top_k_4", "exact", "empty_expert")),
    Case("moe-unsloth-dw-accumulate-bf16-top2", convention="unsloth.grouped_gemm_dW_accumulate", family="routed",
         m=8, k=40, n=8, groups=6, top_k=2, dtype="bfloat16", seed=244,
         tags=("routed", "backward", "existing", "top_k_2", "unaligned")),
    # --------------------------- torch MoE experts: the combined [T, N] output, the weighted sum of each token's slots
    Case("moe-torch-bf16-top8-peaked-repeats", **TORCH_MOE, m=10, k=40, n=24, groups=16, top_k=8, dtype="bfloat16",
         router="peaked", repeat_tokens=(2, 7), seed=230,
         tags=("routed", "combined", "top_k_8", "peaked", "repeated_expert", "weighted", "unaligned")),
    Case("moe-torch-f32-top4", **TORCH_MOE, m=7, k=16, n=8, groups=6, top_k=4, seed=231,
         tags=("routed", "combined", "top_k_4", "weighted")),
    Case("moe-torch-f16-expert-map-poison", **TORCH_MOE, m=9, k=16, n=8, groups=8, top_k=2, dtype="float16",
         expert_map=[-1, 0, 1, -1, 2, -1, -1, 3], poison=True, seed=233,
         tags=("routed", "combined", "top_k_2", "expert_map", "foreign", "poison", "weighted")),
    Case("moe-torch-f32-t1-exact", **TORCH_MOE, m=1, k=8, n=4, groups=32, top_k=4, kind="int", int_range=2, seed=234,
         tags=("routed", "combined", "t1", "top_k_4", "exact", "empty_expert", "weighted")),
    # ------------------------------- torch MoE slots: per slot, the router's global ids through a scattered expert map
    Case("moe-slots-bf16-scattered-map-weighted", **TORCH_SLOTS, m=9, k=16, n=8, groups=8, top_k=2,
         dtype="bfloat16", mul_routed_weight=True, expert_map=[-1, 2, -1, 0, -1, 1, -1, -1], seed=240,
         tags=("routed", "top_k_2", "expert_map", "foreign", "weighted")),
    Case("moe-slots-f32-top4-unweighted", **TORCH_SLOTS, m=7, k=16, n=8, groups=6, top_k=4, kind="int",
         int_range=3, seed=241, tags=("routed", "top_k_4", "exact")),
    # ---------------------------------------------------- TransformerEngine (reference only)
    Case("te-m-f32-lhs-last-packed", **TE, family="ragged_m", m=24, k=8, n=8, lhs_transposed=True,
         packed=True, group_sizes=[5, 0, 19], seed=100, tags=("packed", "transposed", "empty_middle")),
    Case("te-m-bf16-rhs-transposed", **TE, family="ragged_m", m=24, k=8, n=8, dtype="bfloat16",
         rhs_transposed=True, group_sizes=[0, 11, 13], seed=101, tags=("transposed", "empty_first")),
    Case("te-k-f16-lhs-first", **TE, family="ragged_k", m=8, k=24, n=8, dtype="float16",
         lhs_transposed=True, group_sizes=[12, 12, 0], seed=102, tags=("transposed", "empty_last")),
    Case("te-k-bf16-lhs-last-packed", **TE, family="ragged_k", m=8, k=24, n=8, dtype="bfloat16",
         out_dtype="float32", packed=True, group_sizes=[9, 0, 15], seed=103, tags=("packed", "empty_middle")),
    Case("te-k-f32-first-last-packed", **TE, family="ragged_k", m=8, k=24, n=8, lhs_transposed=True,
         rhs_transposed=True, packed=True, group_sizes=[24, 0, 0], seed=104,
         tags=("packed", "transposed", "all_but_one_empty")),
    # FP8 (per-group tensor scale_inv, empty group first: after it a scale pointer must still move) and MXFP8
    Case("te-fp8-tensor-empty-first", convention="te.scaled_grouped_gemm", family="ragged_m", m=32, k=64, n=16,
         dtype="float8_e4m3fn", out_dtype="bfloat16", rhs_transposed=True, group_sizes=[0, 13, 0, 19], seed=106,
         tags=("scaled", "empty_first", "empty_middle", "unaligned")),
    Case("te-mxfp8-empty-middle", convention="te.scaled_grouped_gemm", family="ragged_m", m=48, k=96, n=16,
         dtype="float8_e4m3fn", out_dtype="float32", rhs_transposed=True, group_sizes=[17, 0, 31], quant=1,
         seed=107, tags=("scaled", "mxfp8", "empty_middle", "unaligned")),
    Case("te-m-fp8-out-e5m2", **TE, family="ragged_m", m=16, k=8, n=8, dtype="float8_e4m3fn",
         out_dtype="float8_e5m2", group_sizes=[7, 9], seed=105, tags=("fp8",)),
]
