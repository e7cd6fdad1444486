"""What a shrunk failure's example tells when rerun, or what the harness knows of the kernel: :func:`explain`.

Where a poisoned failure's NaN came from (:func:`name_poison_source`): the region of an operand whose NaN/Inf
reached the output. The poisoned mode places NaN and Inf itself: in every element no group reads (an expert with no
rows, rows past the last group) and in a few elements inside groups, which must stay within their group's output.
Once such a failure is shrunk, its example is rerun with every region's non-finite values made 0 (a control: if the
wrong elements are still non-finite, the kernel made them itself and no region is named), then with every region's
but one: a region whose NaN/Inf alone make wrong output elements non-finite is where they came from (where none does
alone, each region is cleared in turn instead, naming those without which fewer are). A region is the elements of
one operand that one local group's block reads (``gmm_ref.layouts.blocks``), or those no group reads, by the group
of the operand's leading axis where it has one (an expert with no rows), else together (past the last group). A
correct kernel's output never depends on what no group reads, so it is never blamed; the reruns cost nothing on a
passing call (only a failure is explained).

A Triton kernel's float32 failure beyond the bound (:func:`tf32_hint`): ``tl.dot`` of float32 blocks defaults to
TF32 inputs, on a GPU as in the harness's interpreter; the report says how to declare that, or to turn it off.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any

import numpy as np

import gmm_ref
from gmm_kernels import KernelAdapter
from gmm_ref.layouts import blocks
from property_tests.checks import failures, picture, routed_picture

__all__ = ["draw", "explain", "name_poison_source", "regions", "tf32_hint"]

#: the most regions tried (each a call of the kernel)
MAX_REGIONS = 24


def _owners(p: gmm_ref.Problem) -> tuple[np.ndarray, np.ndarray]:
    """For each element of lhs and rhs (as stored), the local group whose block reads it, or -1 for none."""
    lhs = np.arange(p.lhs.size, dtype=np.float64).reshape(p.lhs.shape)
    rhs = np.arange(p.rhs.size, dtype=np.float64).reshape(p.rhs.shape)
    index = p.replace(lhs=lhs, rhs=rhs, out_dtype=np.float64, existing_out=None, existing_policy="overwrite")
    lo, ro = np.full(lhs.size, -1), np.full(rhs.size, -1)
    for blk in blocks(index):
        if blk.b.shape[1] > 0:  # a block producing no output element reads nothing that matters
            lo[blk.a.astype(np.int64).ravel()] = blk.local
        if blk.a.shape[0] > 0:
            ro[blk.b.astype(np.int64).ravel()] = blk.local
    return lo.reshape(lhs.shape), ro.reshape(rhs.shape)


def regions(p: gmm_ref.Problem) -> list[tuple[str, str, np.ndarray]]:
    """The non-finite elements of ``p``'s float operands by region: (operand, the region in words, its mask)."""
    out: list[tuple[str, str, np.ndarray]] = []
    if p.scaled or not any(x.dtype.kind in "fV" and not np.isfinite(x.astype(np.float64)).all()
                           for x in (p.lhs, p.rhs)):
        return out  # nothing placed: nothing to name (the modes other than poisoned)
    groups = p.local_groups
    sizes = None if p.group_sizes is None else np.asarray(p.group_sizes).reshape(-1)
    for operand, arr, owner in zip(("lhs", "rhs"), (p.lhs, p.rhs), _owners(p), strict=True):
        if arr.dtype.kind not in "fV" or p.scaled:
            continue
        bad = ~np.isfinite(arr.astype(np.float64))
        if not bad.any():
            continue
        for local in np.unique(owner[bad]):
            mask = bad & (owner == local)
            if local >= 0:
                out.append((operand, f"{operand} of group {groups[local]}, inside the group (it must reach only that "
                                     f"group's output)", mask))
            elif p.family_facts.is_grouped(operand):
                for g in range(arr.shape[0]):
                    lead = np.zeros(arr.shape, bool)
                    lead[g] = True
                    if (mask & lead).any():
                        size = "" if sizes is None or groups[g] >= sizes.size else \
                            f", {'an expert with no rows' if sizes[groups[g]] == 0 else 'read by no block'}"
                        out.append((operand, f"{operand} of group {groups[g]}{size}", mask & lead))
            else:
                out.append((operand, f"{operand} where no group reads (past the last group, or padding)", mask))
    return out[:MAX_REGIONS]


def _nonfinite(x: Any) -> np.ndarray:
    x = np.asarray(x)
    return ~np.isfinite(x.astype(np.float64)) if x.dtype.kind in "fcV" else np.zeros(x.shape, bool)


def name_poison_source(adapter: KernelAdapter, exc: BaseException, mode: str,
                       run: Callable[[gmm_ref.Problem], Any] | None = None) -> None:
    """Add a note to the shrunk poisoned failure ``exc`` naming the region(s) whose NaN/Inf reached the wrong output
    elements; leave it alone where none does (the kernel made its NaN itself, or the rerun fails)."""
    if not isinstance(exc, gmm_ref.Mismatch) or getattr(exc, "output", None) is None:
        return
    problem = failures.recipe_problem(exc, None)
    bad = exc.comparison.bad
    if not isinstance(problem, gmm_ref.Problem) or bad is None or bad.shape != np.shape(exc.output):
        return
    wrong = bad & _nonfinite(exc.output)
    if not wrong.any():
        return
    run = run if run is not None else adapter.run
    parts = regions(problem)

    def rerun(cleared: list[tuple[str, str, np.ndarray]]) -> np.ndarray | None:
        arrays = {"lhs": problem.lhs.copy(), "rhs": problem.rhs.copy()}
        for operand, _, mask in cleared:
            arrays[operand][mask] = 0
        try:
            with np.errstate(all="ignore"):
                out = np.asarray(run(problem.replace(**arrays)))
        except Exception:  # noqa: BLE001 - a rerun that fails tells nothing
            return None
        return out if out.shape == wrong.shape else None

    total = int(np.count_nonzero(wrong))
    found: list[str] = []
    control = rerun(parts)  # every region cleared: a wrong element still non-finite was not placed there
    if control is None or (wrong & _nonfinite(control)).any():
        return
    for i, (_, words, mask) in enumerate(parts):  # each region alone, the others cleared: enough to poison?
        out = rerun(parts[:i] + parts[i + 1:])
        if out is not None and (reached := int(np.count_nonzero(wrong & _nonfinite(out)))):
            found.append(f"{words}: {int(np.count_nonzero(mask))} NaN/Inf placed there; alone, they make {reached} "
                         f"of the {total} wrong elements non-finite")
    if not found:  # none alone: those without which fewer are
        for part in parts:
            out = rerun([part])
            if out is not None and (cured := int(np.count_nonzero(wrong & ~_nonfinite(out)))):
                found.append(f"{part[1]}: {int(np.count_nonzero(part[2]))} NaN/Inf placed there; with them made 0, "
                             f"{cured} of the {total} wrong elements are finite")
    if found:
        failures.poisoned_from(exc, [f.split(":")[0] for f in found])
        failures.note(exc, "Where the NaN/Inf came from (the example rerun with the NaN/Inf of every region but one "
                           "made 0):\n"
                      + "\n".join(f"  - {f}" for f in found))


def tf32_hint(adapter: KernelAdapter, exc: BaseException, mode: str) -> None:
    """A note on a wrong-values failure of float32 inputs by a kernel that runs Triton (interpreted here): its
    ``tl.dot`` multiplies float32 blocks in TF32 unless told otherwise, and its declared numerics say exact
    products."""
    problem = failures.recipe_problem(exc, None)
    if not isinstance(exc, gmm_ref.Mismatch) or exc.kind != "values" or problem is None:
        return
    tokens = problem.lhs if isinstance(problem, gmm_ref.Problem) else getattr(problem, "tokens", None)
    if tokens is None or str(tokens.dtype) != "float32" or "Triton" not in (adapter.interpreted() or ""):
        return
    numerics = (failures.recipe(exc) or {}).get("numerics")
    product = getattr(numerics, "product", numerics)  # a routed kernel's: its product's
    if product is None or getattr(product, "multiply", None) is not None:  # judged as TF32 products already
        return
    failures.note(exc, "This kernel runs Triton's tl.dot and is held to exact float32 products (its declared "
                       "numerics), but on float32 blocks tl.dot's default input_precision is TF32 (10 mantissa bits a "
                       "product), on a GPU as in the harness's interpreter. Pass input_precision=\"ieee\" to tl.dot, "
                       "or declare TF32 products: numerics=gmm_ref.Numerics(multiply=\"bfloat16\") (a sound stand-in "
                       "for TF32; --numerics accumulate=float32,multiply=bfloat16), the default of an undeclared "
                       "Triton kernel.")


def draw(adapter: KernelAdapter, exc: BaseException, mode: str) -> None:
    """A picture of a wrong output (``property_tests.checks.picture``; a routed kernel's:
    ``property_tests.checks.routed_picture``), named in a note of ``exc``."""
    problem = failures.recipe_problem(exc, None)
    out, bad = getattr(exc, "output", None), getattr(getattr(exc, "comparison", None), "bad", None)
    if problem is None or out is None or bad is None or bad.shape != np.shape(out) or not np.any(bad):
        return
    numerics = (failures.recipe(exc) or {}).get("numerics") or adapter.numerics_for(problem)
    if isinstance(problem, gmm_ref.Problem):
        path = picture.save(out, adapter.reference_for(problem), numerics, bad)
        layout = "group boundaries blue, tiles gray"
    elif isinstance(problem, gmm_ref.Routing):
        output = adapter.convention_facts.output
        path = routed_picture.save(out, adapter.reference_for(problem), numerics, bad, output)
        layout = routed_picture.words(output)
    else:
        return
    failures.note(exc, f"{picture.NOTE} (wrong elements orange to dark red by error over the bound, NaN/Inf purple, "
                       f"undefined gray; {layout}): {path}")


def explain(adapter: KernelAdapter, exc: BaseException, mode: str) -> None:
    """Every note this module adds to the shrunk failure ``exc`` of ``adapter`` in ``mode``."""
    name_poison_source(adapter, exc, mode)
    tf32_hint(adapter, exc, mode)
    with contextlib.suppress(OSError):  # no writable place for it: the report stands without
        draw(adapter, exc, mode)
