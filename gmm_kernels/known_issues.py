"""Upstream bugs shared by several adapters, each with its repro and the versions it is known on.

An adapter lists its upstream bugs in ``known_issues`` (a tuple of
:class:`gmm_kernels.KnownIssue`, each naming the modes it makes the kernel
fail and the package versions it was seen on). Where one applies, the plugin's
kernel checks show the mode as a strict xfail and the main job as a "known bug"
cell that still shows the caught mismatch (and a failure where every family of
the mode passed under gmm-ci's examples: the bug is no longer caught); on a version outside the range the bug is not
assumed, so a fix upstream shows as a pass. A bug that shows only on some
machines carries a ``condition``: torch's CPU ragged-K leak
(:data:`TORCH_CPU_RAGGED_K_LEAK`) applies where a probe that runs its reproducer
once per process sees it (AMX bfloat16), so the verdict is the same on every
processor. A failure in a kernel that does not declare it, whose signature
matches one of these (:func:`matching`: a jax primitive or torch operator the
kernel calls, the mismatch kind, the mode), says so.
"""

from __future__ import annotations

import dataclasses
import functools
import sys
from typing import Any

from gmm_kernels.scope import KnownIssue
from gmm_ref import Problem

__all__ = ["MEGABLOX_EXISTING_OUT_GRAD", "TORCH_CPU_RAGGED_K_LEAK", "TORCH_LEAK_REPRODUCERS", "XLA_CPU_BF16_TRANSPOSED",
           "XLA_CPU_NAN_LEAK", "matching", "torch_cpu_ragged_k_leak", "xla_bf16_transposed_issues",
           "xla_cpu_bf16_transposed_dot", "xla_nan_leak_issues"]

#: checked on jax 0.10.2 (Python 3.11) and jax 0.12.0.1 (Python 3.12, the newest there on 2026-11-23)
_SEEN_ON_JAX = {"jax": "<=0.12.0.1"}

XLA_CPU_NAN_LEAK = KnownIssue(
    modes=("poisoned",),
    text=(
        "upstream bug, XLA CPU ragged_dot: a NaN/Inf anywhere in one group's rhs reaches the rows of every "
        "other group and the tail, also when that group is empty (the CPU lowering forms every group's product "
        "over all rows and masks by multiplying with 0, and 0*NaN = NaN). Repro: lax.ragged_dot(ones((4, 2)), "
        "stack([ones((2, 2)), full((2, 2), nan)]), group_sizes=[4, 0]) is all NaN"),
    versions=_SEEN_ON_JAX,
    primitive="ragged_dot_general",
    kind="nonfinite",
)

MEGABLOX_EXISTING_OUT_GRAD = KnownIssue(
    modes=("grad",),
    text=(
        "upstream bug, jax/experimental/pallas/ops/tpu/megablox/ops.py _gmm_bwd: the custom VJP returns the "
        "whole cotangent as the gradient of existing_out, also for the rows gmm overwrote (their true "
        "gradient is 0)"),
    versions=_SEEN_ON_JAX,
)


#: the probe's reproducers, (M, K, N, group K size): the documented one (docs/conventions.md), and a group
#: past one 32-wide K tile, where oneDNN's K-tail handling differs
TORCH_LEAK_REPRODUCERS = ((64, 64, 64, 3), (64, 128, 64, 35))


@functools.cache
def torch_cpu_ragged_k_leak() -> tuple[str, ...]:
    """The input dtypes (of ``bfloat16``, ``float16``) in which torch's CPU ``_grouped_mm`` leaks a NaN from the
    K padding into a ragged-K output on this machine: :data:`TORCH_LEAK_REPRODUCERS` run once per process
    (a few milliseconds; what oneDNN runs depends on the processor and on ``ONEDNN_MAX_CPU_ISA``, read when
    oneDNN first runs). Empty where torch is not installed (never imported then), has no ``_grouped_mm``, or
    does not leak."""
    try:
        import torch
    except ImportError:  # not installed (nothing was imported), or blocked
        return ()
    if not hasattr(torch, "_grouped_mm"):
        return ()
    leaked = []
    for name in ("bfloat16", "float16"):
        dtype = getattr(torch, name)
        for m, k, n, size in TORCH_LEAK_REPRODUCERS:
            a = torch.ones(m, k, dtype=dtype)
            a[:, size:] = float("nan")  # the K padding: no group reads it
            try:
                out = torch._grouped_mm(a, torch.ones(k, n, dtype=dtype),
                                        offs=torch.tensor([size], dtype=torch.int32))
            except Exception:  # noqa: BLE001 - a torch that refuses the reproducer does not show the leak
                continue
            if bool(torch.isnan(out).any()):
                leaked.append(name)
                break
    return tuple(leaked)


def _torch_cpu_ragged_k_leaks() -> bool:
    """:data:`TORCH_CPU_RAGGED_K_LEAK`'s condition: torch's CPU path runs (the selected device is the CPU,
    ``gmm_kernels.sandbox.device``) and the probe sees the leak on this machine."""
    from gmm_kernels.sandbox import device

    return device.cpu_only() and bool(torch_cpu_ragged_k_leak())


TORCH_CPU_RAGGED_K_LEAK = KnownIssue(
    modes=("poisoned",),
    text=(
        "upstream bug, torch CPU _grouped_mm, ragged K (2d x 2d) in bfloat16 where oneDNN runs its AMX matmul (a CPU "
        "with amx_bf16, ONEDNN_MAX_CPU_ISA not below AVX512_CORE_AMX): a group of odd K size >= 3 (or of many even "
        "sizes above 32) reads the lhs columns just past its K range and multiplies them by 0, so a NaN/Inf in the "
        "padding past offs[-1] (or in the next group's first columns) reaches its output; finite values there "
        "change nothing. Repro: a = ones(64, 64, bfloat16); a[:, 3:] = nan; torch._grouped_mm(a, ones(64, 64, "
        "bfloat16), offs=tensor([3], int32)) has 2048 NaN of 4096 outputs (docs/conventions.md)"),
    versions={"torch": ">=2.13,<=2.14.1"},  # checked on 2.13.0+cpu and 2.14.1+cu130 (CPU path), both oneDNN 3.12.0
    primitive="aten._grouped_mm",
    kind="nonfinite",
    condition=_torch_cpu_ragged_k_leaks,
)


def _jax_on_cpu() -> bool:
    jax = sys.modules.get("jax")
    if jax is None:
        import importlib.util

        if importlib.util.find_spec("jax") is None:
            return False
        import jax
    return jax.default_backend() == "cpu"


def xla_nan_leak_issues(via: str = "") -> tuple[KnownIssue, ...]:
    """``known_issues`` of a kernel computed by XLA's ragged_dot (``via``: how it gets there).

    Empty unless jax runs on CPU (the only backend the bug was seen on).
    """
    if not _jax_on_cpu():
        return ()
    if not via:
        return (XLA_CPU_NAN_LEAK,)
    return (dataclasses.replace(XLA_CPU_NAN_LEAK, text=f"{XLA_CPU_NAN_LEAK.text}; {via}"),)


@functools.cache
def xla_cpu_bf16_transposed_dot() -> bool:
    """Whether XLA on this CPU accumulates a bfloat16 ``ragged_dot_general`` (``preferred_element_type``
    bfloat16) in bfloat16 when a transpose of its output is in the same jit (:data:`XLA_CPU_BF16_TRANSPOSED`):
    its reproducer run once per process (a few milliseconds), the transposed product against the once-rounded
    float32 sum. False where jax is not installed (never imported then) or does not run on CPU."""
    if not _jax_on_cpu():
        return False
    import jax
    import jax.numpy as jnp
    import ml_dtypes
    import numpy as np
    from jax import lax

    rng = np.random.default_rng(3)
    ct = rng.standard_normal((2, 4, 9)).astype(ml_dtypes.bfloat16)  # [B, M, N]
    rhs = rng.standard_normal((1, 2, 4, 9)).astype(ml_dtypes.bfloat16)  # [G, B, K, N]
    dn = lax.RaggedDotDimensionNumbers(dot_dimension_numbers=(((2,), (3,)), ((0,), (1,))),
                                       lhs_ragged_dimensions=(1,), rhs_group_dimensions=(0,))

    def transposed(c: Any, r: Any, g: Any) -> Any:
        return jnp.transpose(lax.ragged_dot_general(c, r, g, dn, preferred_element_type=jnp.bfloat16), (0, 2, 1))

    got = np.asarray(jax.jit(transposed)(ct, rhs, np.full((2, 1), 4, np.int32)), np.float64)
    once = np.einsum("bmn,bkn->bkm", ct.astype(np.float64), rhs[0].astype(np.float64)).astype(np.float32)
    return not np.array_equal(got, once.astype(ml_dtypes.bfloat16).astype(np.float64))


XLA_CPU_BF16_TRANSPOSED = KnownIssue(
    modes=("grad",),
    text=(
        "upstream bug, XLA CPU (jaxlib 0.12): a bfloat16 lax.ragged_dot_general with preferred_element_type "
        "bfloat16 whose output is transposed in the same jit (as jax.vjp's transpose rule makes d/dlhs of a "
        "transposed lhs) accumulates in bfloat16, each add rounded, where the same product without the transpose "
        "(and jax 0.10) sums in float32 and rounds once: errors of several bfloat16 units in the last place. "
        "Repro: ct = default_rng(3).standard_normal((2, 4, 9)), rhs = ....standard_normal((1, 2, 4, 9)), both "
        "bfloat16; jit(lambda c, r: transpose(ragged_dot_general(c, r, full((2, 1), 4), dims: contract 2 with 3, "
        "batch 0 with 1, ragged 1, group 0; preferred_element_type=bfloat16), (0, 2, 1))) is off the once-rounded "
        "float32 sum by up to 0.042, the untransposed one by 0.012 (gmm_kernels.known_issues."
        "xla_cpu_bf16_transposed_dot runs it)"),
    versions={"jax": ">=0.12,<=0.12.0.1"},  # seen on 0.12.0.1 (Python 3.12), not on 0.10.2
    primitive="ragged_dot_general",
    kind="values",
    condition=xla_cpu_bf16_transposed_dot,
)


def xla_bf16_transposed_issues() -> tuple[KnownIssue, ...]:
    """``known_issues`` of a kernel whose jitted backward transposes a bfloat16 ``ragged_dot_general`` (jax's
    VJP of ``lax.ragged_dot_general``): :data:`XLA_CPU_BF16_TRANSPOSED` where jax runs on CPU."""
    return (XLA_CPU_BF16_TRANSPOSED,) if _jax_on_cpu() else ()


def _signatures() -> tuple[KnownIssue, ...]:
    """The upstream bugs a failure can be matched against on this machine (one with a ``condition`` only
    where it shows: :func:`matching` asks it last)."""
    return (*xla_nan_leak_issues(), *xla_bf16_transposed_issues(), TORCH_CPU_RAGGED_K_LEAK)


def matching(adapter: Any, mode: str, error: BaseException, problem: Problem) -> list[KnownIssue]:
    """The known upstream bugs ``error`` (a failure of ``adapter`` in ``mode`` on ``problem``) matches: same
    mode and mismatch kind, in a jax primitive or torch operator the kernel calls (``adapter.primitives``),
    where the bug shows on this machine (its ``condition``, asked only then, so a jax kernel's failure never
    imports torch). Empty for bugs the adapter declares."""
    if adapter.known_issue(mode):
        return []
    kind = getattr(error, "kind", None)
    candidates = [k for k in _signatures() if k.primitive and mode in k.modes and (not k.kind or k.kind == kind)]
    if not candidates:
        return []
    called = adapter.primitives(problem)
    return [k for k in candidates if k.primitive in called and (k.condition is None or k.condition())]
