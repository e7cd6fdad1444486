"""gmm_ref: an exact NumPy reference for grouped GEMM over every ragged-axis combination.

Start with :class:`Problem` (the model), :func:`reference` (exact values,
defined-mask, bound) and :func:`assert_matches_reference`; or call a
convention front-end with a kernel's own arguments (:func:`ragged_dot`,
:func:`ragged_dot_general`, :func:`gmm`, :func:`tgmm`, :func:`grouped_mm`,
:func:`te_grouped_gemm`, :func:`te_scaled_grouped_gemm`, :func:`scaled_grouped_mm`, :func:`scaled_grouped_mm_v2`,
:func:`qwix_ragged_dot`, :func:`nvfp4_grouped_mm`, the serving layouts'
:func:`deep_gemm_m_grouped_contiguous`, :func:`deep_gemm_m_grouped_masked`, :func:`vllm_batched_moe`);
:func:`arguments` turns a problem
into its convention's arguments. Scaled (quantized) grouped GEMM: a :class:`Problem` with
``lhs_quant``/``lhs_scales`` (a :class:`Quantization` and its scales), the exact
:func:`scaled_reference` and the MX quantizer :func:`to_mx` (``gmm_ref.scaled.model``). Routed MoE
(tokens gathered per expert by ``topk_ids``): :class:`Routing`, its exact :func:`routed_reference`, its gradients
(:class:`RoutedBackward`: a routing with its cotangent; :func:`routed_gradients`), and the
metadata fused-MoE kernels take (:func:`moe_align_block_size`, :func:`unsloth_routing_indices` and their
validators; docs/routed.md). Needs only
NumPy and ml_dtypes. The semantics are in the repository's docs/ (semantics.md, conventions.md,
numerics.md, scaled.md).
"""

from gmm_ref import conventions, families
from gmm_ref.compare import (
    Comparison,
    Mismatch,
    assert_deterministic,
    assert_matches_reference,
    check,
)
from gmm_ref.conventions import arguments, problem_from_arguments
from gmm_ref.conventions.deep_gemm import deep_gemm_m_grouped_contiguous, deep_gemm_m_grouped_masked
from gmm_ref.conventions.megablox import gmm, tgmm
from gmm_ref.conventions.qwix import qwix_ragged_dot
from gmm_ref.conventions.ragged_dot import RaggedDotDimensionNumbers, ragged_dot, ragged_dot_general
from gmm_ref.conventions.te import te_grouped_gemm, te_scaled_grouped_gemm
from gmm_ref.conventions.torch_grouped import grouped_mm
from gmm_ref.conventions.torch_scaled import scaled_grouped_mm, scaled_grouped_mm_v2
from gmm_ref.conventions.torchao import nvfp4_grouped_mm
from gmm_ref.conventions.vllm import vllm_batched_moe
from gmm_ref.dtypes import as_numpy, round_to, unit_roundoff
from gmm_ref.exact import Reference, reference
from gmm_ref.gradients import Gradients, gradients
from gmm_ref.numerics import Numerics
from gmm_ref.problem import FAMILIES, Problem, as_tiling
from gmm_ref.repro import load_array, load_problem, reproducer, save_problem
from gmm_ref.routed.compare import assert_routed_matches
from gmm_ref.routed.gradients import RoutedBackward, RoutedGradients, routed_gradients
from gmm_ref.routed.metadata import (
    moe_align_block_size,
    unsloth_routing_indices,
    validate_moe_align_block_size,
    validate_unsloth_routing,
)
from gmm_ref.routed.routing import RoutedNumerics, RoutedReference, Routing, routed_reference
from gmm_ref.scaled.model import MXQuantizer, Quantization, scaled_reference, to_mx
from gmm_ref.scaled.quantize import quantize_problem
from gmm_ref.scaled.quantizers import AmaxQuantizer

__all__ = [
    "FAMILIES",
    "AmaxQuantizer",
    "Comparison",
    "Gradients",
    "MXQuantizer",
    "Mismatch",
    "Numerics",
    "Problem",
    "Quantization",
    "RaggedDotDimensionNumbers",
    "Reference",
    "RoutedBackward",
    "RoutedGradients",
    "RoutedNumerics",
    "RoutedReference",
    "Routing",
    "arguments",
    "as_numpy",
    "as_tiling",
    "assert_deterministic",
    "assert_matches_reference",
    "assert_routed_matches",
    "check",
    "conventions",
    "deep_gemm_m_grouped_contiguous",
    "deep_gemm_m_grouped_masked",
    "families",
    "gmm",
    "gradients",
    "grouped_mm",
    "load_array",
    "load_problem",
    "moe_align_block_size",
    "nvfp4_grouped_mm",
    "problem_from_arguments",
    "quantize_problem",
    "qwix_ragged_dot",
    "ragged_dot",
    "ragged_dot_general",
    "reference",
    "reproducer",
    "round_to",
    "routed_gradients",
    "routed_reference",
    "save_problem",
    "scaled_grouped_mm",
    "scaled_grouped_mm_v2",
    "scaled_reference",
    "te_grouped_gemm",
    "te_scaled_grouped_gemm",
    "tgmm",
    "to_mx",
    "unit_roundoff",
    "unsloth_routing_indices",
    "validate_moe_align_block_size",
    "validate_unsloth_routing",
    "vllm_batched_moe",
]
