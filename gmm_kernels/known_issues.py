"""Upstream bugs shared by several adapters, each with its repro and the versions it is known on.

An adapter lists its upstream bugs in ``known_issues`` (a tuple of
:class:`gmm_kernels.KnownIssue`, each naming the modes it makes the kernel
fail and the package versions it was seen on). Where one applies, the suite
shows the mode as a strict xfail and the main job as a "known bug" cell that
still shows the caught mismatch; on a version outside the range the bug is not
assumed, so a fix upstream shows as a pass. A failure in a kernel that does not
declare it, whose signature matches one of these (:func:`matching`), says so.
"""

from __future__ import annotations

import dataclasses
import sys
from typing import Any

from gmm_kernels.scope import KnownIssue
from gmm_ref import Problem

__all__ = ["MEGABLOX_EXISTING_OUT_GRAD", "XLA_CPU_NAN_LEAK", "matching", "xla_nan_leak_issues"]

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


def _signatures() -> tuple[KnownIssue, ...]:
    """The upstream bugs a failure can be matched against on this machine."""
    return xla_nan_leak_issues()


def matching(adapter: Any, mode: str, error: BaseException, problem: Problem) -> list[KnownIssue]:
    """The known upstream bugs ``error`` (a failure of ``adapter`` in ``mode`` on ``problem``) matches: same
    mode and mismatch kind, in a jax primitive the kernel calls. Empty for bugs the adapter declares."""
    if adapter.known_issue(mode):
        return []
    kind = getattr(error, "kind", None)
    candidates = [k for k in _signatures() if k.primitive and mode in k.modes and (not k.kind or k.kind == kind)]
    if not candidates:
        return []
    called = adapter.primitives(problem)
    return [k for k in candidates if k.primitive in called]
