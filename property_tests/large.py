"""The ``large`` mode: an operand past 2**31 elements, where int32 offsets overflow.

A reported bug class of fused MoE kernels computes an element offset
(``row * K``) in int32: it wraps once the token operand holds more than 2**31
elements, and the rows past that point read the wrong memory. No small
problem can show it, and no Hypothesis example of several GiB can be shrunk,
so this mode is one deterministic ragged-M problem per kernel (the token axis):

- ``lhs`` is ``[M, 4096]`` with ``M * 4096 > 2**31`` (M = 2**19 plus two tiles),
  in the smallest floating input dtype the kernel takes; ``N`` = 128; 4 groups, one of
  them straddling the 2**31-th element and one entirely past it;
- values are small integers (generated in chunks, seeded), so the check is
  as strict as the ``exact`` mode; the reference runs in row chunks
  (``gmm_ref`` bounds its temporaries), so its memory is the output's;
- the memory it needs (inputs, the kernel's copy, the framework's copy, the
  outputs) is stated, and the mode is ``n/a`` with that reason where the
  machine has less available, or where a kernel runs interpreted (hours).

It is opt-in: ``gmm-harness check --modes large`` or
``check_mode(adapter, "large")``; the default run and the CI profile leave it out.
"""

from __future__ import annotations

import itertools
import os
from typing import Any

import numpy as np

import gmm_ref
from gmm_kernels import KernelAdapter

__all__ = ["FAMILY", "LIMIT", "available_memory", "large_problem", "memory_needed"]

LIMIT = 2**31
K = 4096
N = 128
_CHUNK_ROWS = 1 << 14


class TooLarge(Exception):
    """The large problem cannot run here; ``str()`` is the reason."""


def available_memory() -> int | None:
    """Bytes of memory available to a new allocation (Linux ``MemAvailable``), or None if unknown."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None


def _shape(tm: int) -> tuple[int, list[int]]:
    """M and the group sizes: a group ending just before row LIMIT // K, one straddling it, one past it."""
    edge = LIMIT // K  # the first row whose first element is the 2**31-th
    m = -(-(edge + 2 * tm) // tm) * tm
    ends = [m // 2, edge - 8, edge + tm, m]
    return m, [ends[0]] + [b - a for a, b in itertools.pairwise(ends)]


def memory_needed(m: int, itemsize: int) -> int:
    """Bytes the large check needs at its peak: the problem's lhs, the kernel's copy and a framework
    copy of it, the comparison of the copy with the original, and the float64 outputs."""
    lhs = m * K * itemsize
    return 3 * lhs + m * K + m * N * (8 + 8 + 8 + 4)


def _pair(adapter: KernelAdapter) -> tuple[np.dtype, np.dtype]:
    """The (input, output) dtype pair with the smallest floating input the kernel takes (an output equal
    to it first)."""
    # the pairs the kernel declares it takes (as the normal mode draws them), else its convention's
    declared = adapter.limits().dtypes or adapter.convention_facts.dtype_pairs
    pairs = [(np.dtype(i), np.dtype(o)) for i, o in
             ((p, p) if isinstance(p, str) else p for p in declared)]
    # floating inputs: the reference of integer inputs multiplies in int64, which NumPy does without BLAS
    floats = [p for p in pairs if p[0].kind in "fV"] or pairs
    return min(floats, key=lambda p: (p[0].itemsize, p[0] != p[1], str(p[0])))


#: the one family the large mode builds its problem in: ragged M, the token axis, where int32 row offsets overflow
FAMILY = "ragged_m"


def large_problem(adapter: KernelAdapter, seed: int = 0) -> gmm_ref.Problem:
    """The large problem for ``adapter``; :class:`TooLarge` with the reason where it cannot run here."""
    if FAMILY not in adapter.families:
        raise TooLarge(f"the large mode builds a ragged-M problem (the token axis, where int32 row offsets "
                       f"overflow); {adapter.name} takes {', '.join(adapter.families)} only")
    why = adapter.large_refusal()
    if why:
        raise TooLarge(why)
    in_dt, out_dt = _pair(adapter)
    tiling = adapter.tiling or adapter.convention_facts.default_tiling
    m, sizes = _shape(int(tiling[0]) if tiling else 128)
    need, have = memory_needed(m, in_dt.itemsize), available_memory()
    if have is not None and need > have:
        raise TooLarge(f"the large problem (lhs [{m}, {K}] {in_dt}, {m * K} elements) needs about "
                       f"{need / 2**30:.1f} GiB; {have / 2**30:.1f} GiB is available here")
    rng = np.random.default_rng(seed)
    lhs = np.empty((m, K), in_dt)
    for r in range(0, m, _CHUNK_ROWS):
        lhs[r:r + _CHUNK_ROWS] = rng.integers(-2, 3, (min(_CHUNK_ROWS, m - r), K), dtype=np.int8)
    rhs = rng.integers(-2, 3, (len(sizes), K, N), dtype=np.int8).astype(in_dt)
    kwargs: dict[str, Any] = dict(out_dtype=out_dt, convention=adapter.convention,
                                  **adapter.convention_facts.policies(FAMILY))
    if adapter.tiling is not None:
        kwargs["tiling"] = adapter.tiling
    problem = gmm_ref.Problem(FAMILY, lhs, rhs, np.array(sizes, np.int32), **kwargs)
    del lhs  # the problem holds its own copy
    # too large to save beside a report: the reproducer rebuilds it (deterministic for the seed)
    resolve = f"gmm_kernels.resolve_kernel({adapter.name!r}, convention={adapter.convention!r})"
    object.__setattr__(problem, "_built_by", (["import gmm_kernels", "from property_tests import large"],
                                              f"large.large_problem({resolve}, seed={seed})"))
    why = adapter.supports(problem)
    if why:
        raise TooLarge(f"{adapter.name} declines the large problem: {why}")
    return problem
