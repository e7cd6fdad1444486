"""Scaled (quantized) grouped GEMM: operands as codes times block scales.

``model`` holds the quantization model and the exact scaled reference, ``quantizers`` the reference quantizers
(amax-scaled FP8 and int8, MX), ``quantize`` a problem's operands quantized with a kernel's declared format, and
``layouts`` the physical layouts of block scales (docs/scaled.md). The public names are re-exported by ``gmm_ref``.
"""
