"""Routed MoE: tokens gathered per expert by ``topk_ids``, one grouped GEMM per expert, scattered back.

``routing`` holds the model (:class:`~gmm_ref.routed.routing.Routing`) and its exact reference, ``metadata`` the
routing metadata fused-MoE kernels take (built as their libraries build it, and validated), ``gradients`` the
routed backward, and ``compare`` names the token, slot and expert a routed kernel got wrong (docs/routed.md).
The public names are re-exported by ``gmm_ref``.
"""
