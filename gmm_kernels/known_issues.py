"""Upstream bugs shared by several adapters, each with its repro.

An adapter lists the modes a bug makes it fail in ``known_issues``: the suite
shows them as strict xfails (a fix upstream turns them into failures to
remove) and the main job as "known bug" cells that still show the caught mismatch.
"""

from __future__ import annotations

import sys

__all__ = ["XLA_CPU_NAN_LEAK", "xla_nan_leak_issues"]

XLA_CPU_NAN_LEAK = (
    "upstream bug, XLA CPU ragged_dot (jax 0.10.2): a NaN/Inf anywhere in one group's rhs reaches the "
    "rows of every other group and the tail, also when that group is empty (the CPU lowering forms "
    "every group's product over all rows and masks by multiplying with 0, and 0*NaN = NaN). Repro: "
    "lax.ragged_dot(ones((4, 2)), stack([ones((2, 2)), full((2, 2), nan)]), group_sizes=[4, 0]) is all NaN"
)


def xla_nan_leak_issues(via: str = "") -> dict[str, str]:
    """``known_issues`` of a kernel computed by XLA's ragged_dot (``via``: how it gets there).

    Empty unless jax is imported and runs on CPU (the only backend the bug was seen on).
    """
    jax = sys.modules.get("jax")
    if jax is None:
        import importlib.util

        if importlib.util.find_spec("jax") is None:
            return {}
        import jax
    if jax.default_backend() != "cpu":
        return {}
    return {"poisoned": XLA_CPU_NAN_LEAK + (f"; {via}" if via else "")}
