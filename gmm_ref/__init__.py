"""gmm_ref: an exact NumPy reference for grouped GEMM over every ragged-axis combination.

Start with :class:`Problem` (the model), :meth:`Problem.reference` (exact
values, defined-mask, bound) and :func:`assert_matches_reference`; or call a
convention front-end with a kernel's own arguments (:func:`ragged_dot`,
:func:`ragged_dot_general`, :func:`gmm`, :func:`tgmm`, :func:`grouped_mm`,
:func:`te_grouped_gemm`). Needs only NumPy and ml_dtypes.
"""

from gmm_ref.compare import Mismatch, assert_matches_reference, check
from gmm_ref.conventions import (
    CONVENTIONS,
    RaggedDotDimensionNumbers,
    arguments,
    expressible,
    gmm,
    grouped_mm,
    problem_from_arguments,
    ragged_dot,
    ragged_dot_general,
    te_grouped_gemm,
    tgmm,
)
from gmm_ref.dtypes import round_to, unit_roundoff
from gmm_ref.gradients import Gradients, gradients
from gmm_ref.numerics import Numerics
from gmm_ref.problem import FAMILIES, Problem
from gmm_ref.reference import Reference, compute
from gmm_ref.repro import reproducer

__all__ = [
    "CONVENTIONS",
    "FAMILIES",
    "Gradients",
    "Mismatch",
    "Numerics",
    "Problem",
    "RaggedDotDimensionNumbers",
    "Reference",
    "arguments",
    "assert_matches_reference",
    "check",
    "compute",
    "expressible",
    "gmm",
    "gradients",
    "grouped_mm",
    "problem_from_arguments",
    "ragged_dot",
    "ragged_dot_general",
    "reproducer",
    "round_to",
    "te_grouped_gemm",
    "tgmm",
    "unit_roundoff",
]
