"""The ``large`` mode: element offsets past 2**31, where int32 offsets overflow.

A reported bug class of fused MoE kernels computes an element offset
(``row * K``) in int32: it wraps once the product passes 2**31 - 1, and the
rows past that point read (or write) the wrong memory. No small contiguous
problem shows it, and no Hypothesis example of several GiB can be shrunk, so
this mode checks cells built for the kernel, each one deterministic problem:

- the strided cells (``property_tests.checks.large_strided``): a small problem with
  one operand (or the output a kernel writes in place) handed as a view whose
  rows or groups lie 2**26 or 2**30 elements apart inside one lazily committed
  allocation: the offsets pass 2**31 while a few MiB are touched. For the
  conventions whose arguments carry strides (``torch.grouped_mm``) or whose
  kernel writes an output buffer in place (vLLM's batched experts), interpreted
  kernels included;
- the full-size cell: one ragged-M problem (the token axis) whose ``lhs`` is
  ``[M, 4096]`` with ``M * 4096 > 2**31`` (M = 2**19 plus two tiles), in the
  smallest floating input dtype the kernel takes; ``N`` = 128; 4 groups, one
  of them straddling the 2**31-th element and one entirely past it. Values are
  small integers (generated in chunks, seeded), so the check is as strict as
  the ``exact`` mode; the reference runs in row chunks (``gmm_ref`` bounds its
  temporaries). The memory it needs (inputs, the kernel's copy, the
  framework's copy, the outputs) is stated, and the cell is left out with that
  figure where the machine has less (:func:`allowed_memory`:
  ``$GMM_LARGE_MEMORY`` GiB caps it), or where a kernel runs interpreted
  (hours).

A cell the kernel cannot take is left out with its reason (``pass (2; 2/3
cells)``); none: ``n/a`` with the reasons. It is opt-in: ``gmm-harness check
--modes large`` or ``check_mode(adapter, "large")``; the default run and the CI
profile leave it out, and check the strided cells alone as the ``strided`` mode.
"""

from __future__ import annotations

import itertools
import os
from typing import Any

import numpy as np

import gmm_ref
from gmm_kernels import KernelAdapter
from property_tests.checks import failures, large_strided

__all__ = ["FAMILY", "FULL", "LIMIT", "MEMORY_ENV", "allowed_memory", "available_memory", "large_problem",
           "memory_needed", "run_cells"]

LIMIT = 2**31
K = 4096
N = 128
_CHUNK_ROWS = 1 << 14


#: caps the memory the full-size cell may use here (GiB; default: what the machine has available)
MEMORY_ENV = "GMM_LARGE_MEMORY"


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


def allowed_memory() -> tuple[int | None, str]:
    """(bytes the full-size cell may use here, or None if unknown; how a report says it): what is available
    (:func:`available_memory`), capped by ``$GMM_LARGE_MEMORY`` GiB where set (a machine others share)."""
    have, words = available_memory(), "available here"
    cap = os.environ.get(MEMORY_ENV, "").strip()
    if cap:
        try:
            limit = int(float(cap) * 2**30)
        except ValueError:
            raise ValueError(f"{MEMORY_ENV}: expected the GiB the large mode's full-size cell may use, got "
                             f"{cap!r}") from None
        if have is None or limit < have:
            have, words = limit, f"allowed here ({MEMORY_ENV})"
    return have, words


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
    (need, (have, words)) = memory_needed(m, in_dt.itemsize), allowed_memory()
    if have is not None and need > have:
        raise TooLarge(f"the large problem (lhs [{m}, {K}] {in_dt}, {m * K} elements) needs about "
                       f"{need / 2**30:.1f} GiB; {have / 2**30:.1f} GiB is {words}")
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
    object.__setattr__(problem, "_built_by", (["import gmm_kernels", "from property_tests.checks import large"],
                                              f"large.large_problem({resolve}, seed={seed})"))
    why = adapter.supports(problem)
    if why:
        raise TooLarge(f"{adapter.name} declines the large problem: {why}")
    return problem


#: how the full-size cell is named in a result's note
FULL = f"{FAMILY} lhs [M, {K}] past 2**31 elements"


def _out_of_memory(exc: BaseException) -> bool:
    return isinstance(exc, MemoryError) or "RESOURCE_EXHAUSTED" in str(exc) or "out of memory" in str(exc).lower()


def run_cells(adapter: KernelAdapter, mode: Any, family: str | None, check: Any) -> tuple[int, dict[str, list[str]]]:
    """Check the strided cells (``large_strided.run_cells``) and the full-size cell (``check(adapter, problem,
    mode)``, in the ragged-M family) ``adapter`` can take; (cells checked, {why: cells left out for it}).
    :class:`TooLarge` with the reasons where it takes none; the first failing cell's exception otherwise (the
    full-size cell's without its 4 GiB problem: its note says how to rebuild it)."""
    __tracebackhide__ = True
    if adapter.routed:
        raise TooLarge(mode.routed_why)
    checked, left_out = large_strided.run_cells(adapter, family)
    if not large_strided.cells(adapter):
        left_out.setdefault(f"no strided cell: {large_strided.none_why(adapter)}", []).append("strided cells")
    if family in (None, FAMILY):
        try:
            problem = large_problem(adapter)
        except TooLarge as exc:
            left_out.setdefault(str(exc), []).append(FULL)
        else:
            rebuild = problem._built_by[1]  # type: ignore[attr-defined]
            try:
                check(adapter, problem, mode)
            except Exception as exc:
                failures.forget(exc)  # the report keeps its text, not the 4 GiB problem
                if not _out_of_memory(exc):
                    exc.add_note(f"The large mode's full-size cell ({FULL}). Rebuild: {rebuild}")
                    raise
                # a machine's limit, not a verdict: the kernel needs more memory than is here
                left_out.setdefault(f"the kernel ran out of memory here: {failures.one_line(exc)}", []).append(FULL)
            else:
                checked += 1
            del problem
    else:
        left_out.setdefault(f"built in the {FAMILY} family only (the token axis)", []).append(FULL)
    if not checked:
        raise TooLarge(f"{adapter.name} takes none of the large cells: " + "; ".join(
            f"{', '.join(c)} ({why})" for why, c in left_out.items()))
    return checked, left_out
