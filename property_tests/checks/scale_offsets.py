"""The ``scale`` mode's ``offsets`` cell for a routed MoE kernel: flat slot offsets past 2**31 in its per-slot
output without 2**31 elements (``property_tests.checks.scale_routed``; docs/coverage.md, "Flat offsets past 2**31
without 2**31 elements").

A fused-MoE kernel stores slot ``f = token * top_k + slot`` of its per-slot output ``C [T, top_k, N]`` at
``f * stride_cm`` (vLLM's and SGLang's ``fused_moe_kernel``: ``stride_cm`` is ``C.stride(1)``, and C's first two axes
are taken as one axis of ``T * top_k`` rows). Computed in int32, that product wraps once it passes 2**31 - 1: vLLM
casts the loaded ``sorted_token_ids`` to int64 for it. With C contiguous that takes T * top_k * N > 2**31 elements
(prefill sizes); here C's rows lie :data:`ROW_STRIDE` = 2**26 elements apart, so the 64 slots of a 16-token,
top_k = 4 routing reach 63 * 2**26 (about 4.2e9), slot 32 on past 2**31, with 64 rows of N elements written. C is
the view ``[T, top_k, N]`` with strides ``(top_k * 2**26, 2**26, 1)``: a layout the convention's C may have (the
kernel reads its strides), so a kernel that ignores them fails here too.

The view lies in one torch allocation of :data:`FRONT` + 64 * 2**26 elements (12 GiB of bfloat16) of which only the
rows and their margins are touched: the pages of an allocation no one touches are not committed (Linux), so the
cell costs a few MiB and about 0.1 s of the interpreter (measured on vLLM's kernel). C starts :data:`FRONT` = 2**31
elements into it, so that an offset wrapped in int32 (at least -2**31) still lands inside the allocation: the
write is lost, not a crash (without the front part the interpreted twin segfaults). Before the call every element
of C is NaN (as the convention's C) and :data:`MARGIN` elements on either side of each row are NaN: after it, a
changed margin is a write out of bounds named by its row's token and slot, and a row the kernel did not write
stays NaN, its token, slot and expert named by the routed comparison (``gmm_ref.assert_routed_matches``).

A convention gets the cell where its kernel writes a per-slot output in place as a torch tensor
(``RoutedConvention.out_argument``, ``output="slots"``, ``framework="torch"``) and this machine can reserve the
address space (:func:`refusal` says why not).
"""

from __future__ import annotations

import inspect
from typing import Any

import numpy as np

import gmm_ref
from gmm_kernels import KernelAdapter
from gmm_kernels.sandbox import convert, device, guards, inputs, tamper
from gmm_ref.dtypes import as_numpy

__all__ = ["A_SHAPE", "FRONT", "MARGIN", "ROW_STRIDE", "SHAPE", "check", "refusal"]

#: T x top_k: 64 slots, the flat slot 32 the first whose offset passes 2**31 - 1
SHAPE = (16, 4)
#: T x top_k of the tokens' cell: A's rows (tokens) apart, token 32 the first whose row offset passes 2**31 - 1
A_SHAPE = (48, 2)
#: elements between the starts of two rows of C (``C.stride(1)``)
ROW_STRIDE = 2**26
#: elements of the allocation before C: an offset wrapped in int32 lands in it
FRONT = 2**31
#: NaN elements on either side of each row, checked after the call (a tile written past a row's end)
MARGIN = 4096


def _elements(operand: str = "C") -> int:
    t, k = SHAPE if operand == "C" else A_SHAPE
    return FRONT + (t * k if operand == "C" else t) * ROW_STRIDE


def _tokens_argument(conv: Any) -> str:
    """The argument holding the tokens (``[T, K]``, or gathered ``[T * top_k, K]``): a routed convention's first."""
    return next(iter(inspect.signature(conv.parse).parameters))


def refusal(adapter: KernelAdapter, operand: str = "C") -> str | None:
    """Why ``adapter`` cannot take the cell striding ``operand`` (``"C"``, the per-slot output; ``"A"``, the tokens)
    here (its convention's arguments, or no address space), or None."""
    conv = adapter.convention_facts
    if operand == "C" and (conv.framework != "torch" or conv.out_argument is None or conv.output != "slots"):
        return (f"{adapter.convention} does not write a per-slot [T, top_k, N] torch output in place (the cell "
                "strides its rows)")
    if operand == "A" and (conv.framework != "torch" or conv.backward):
        return f"{adapter.convention} takes no tokens [T, K] as a torch tensor (the cell strides their rows)"
    try:
        import torch
    except ImportError:  # the kernel cannot run here either; its availability says why
        return "torch is not installed: the cell's output is a torch tensor"

    try:  # reserved, not touched: committed page by page where written
        torch.empty(_elements(operand), dtype=torch.bfloat16, device=device.selected())
    except (RuntimeError, MemoryError) as exc:
        return (f"cannot reserve {_elements(operand) * 2 / 2**30:.0f} GiB of address space here: "
                f"{str(exc).splitlines()[0]}")
    return None


def _strided(c: np.ndarray) -> tuple[Any, Any, np.ndarray]:
    """(the allocation, a view in it holding ``c`` whose rows (its last axis) lie :data:`ROW_STRIDE` elements
    apart, the indices of every row's margins)."""
    import torch

    *lead, n = c.shape
    rows = int(np.prod(lead, dtype=np.int64))
    strides = [1, ROW_STRIDE]
    for d in reversed(lead[1:]):
        strides.append(strides[-1] * d)
    base = device.reserve(FRONT + rows * ROW_STRIDE, dtype=convert.torch_dtype(c.dtype))
    view = torch.as_strided(base, c.shape, tuple(reversed(strides)), FRONT)
    view.copy_(convert.to_torch(np.ascontiguousarray(c), device=base.device))
    starts = FRONT + np.arange(rows, dtype=np.int64)[:, None] * ROW_STRIDE
    margins = np.concatenate([starts - MARGIN + np.arange(MARGIN), starts + n + np.arange(MARGIN)], axis=1)
    base[torch.from_numpy(margins.reshape(-1)).to(base.device)] = float("nan")
    return base, view, margins


def _margins_changed(base: Any, margins: np.ndarray, routing: gmm_ref.Routing, kernel: str, operand: str) -> None:
    """``gmm_ref.Mismatch`` naming the first row (token, slot, expert; of the tokens: the token) whose margins the
    kernel wrote."""
    import torch

    held = base[torch.from_numpy(margins.reshape(-1)).to(base.device)].reshape(margins.shape).float().cpu().numpy()
    rows = np.flatnonzero(~np.isnan(held).all(axis=1))
    if rows.size and operand == "A":
        raise gmm_ref.Mismatch(f"token {int(rows[0])}: kernel {kernel} wrote within {MARGIN} elements of this token's "
                               f"row of A, outside it ({rows.size} rows' margins changed)", kind="wrote_out_of_bounds")
    if rows.size:
        f = int(rows[0])
        t, j = divmod(f, routing.top_k)
        raise gmm_ref.Mismatch(f"token {t}, slot {j} (expert {int(routing.topk_ids[t, j])}): kernel {kernel} wrote "
                               f"within {MARGIN} elements of this slot's row of C, outside it ({rows.size} rows' "
                               "margins changed)", kind="wrote_out_of_bounds")


def check(adapter: KernelAdapter, routing: gmm_ref.Routing, mode: Any = None, operand: str = "C") -> None:
    """Run ``adapter`` on ``routing`` with ``operand`` (``"C"``, its per-slot output; ``"A"``, its tokens) strided as
    the module says, its other arguments guarded copies (``gmm_kernels.sandbox.guards``); ``gmm_ref.Mismatch``
    naming the token, slot and expert of the first wrong element (or of a row written past), or for a write past
    another buffer or to an input."""
    __tracebackhide__ = True
    conv = adapter.convention_facts
    numerics = adapter.numerics_for(routing)
    pristine = conv.arguments(routing)
    name = conv.out_argument if operand == "C" else _tokens_argument(conv)
    where = list(inspect.signature(conv.parse).parameters).index(name)
    try:
        with tamper.sealed(routing, adapter.name), guards.call(adapter.name) as call:
            args, kwargs = inputs.fresh(*pristine, convention=conv, guard=call)
            # the tokens as the convention passes them (unsloth's unfused form: already gathered, [T * top_k, K])
            held = conv.out_value(*pristine) if operand == "C" else np.array(
                pristine[0][where] if where < len(pristine[0]) else pristine[1][name])
            base, view, margins = _strided(held)
            args, kwargs = _with(args, kwargs, where, name, view)
            with convert.written_back():
                returned = adapter.invoke(*args, **kwargs)
                device.synchronize()
        call.check()
        # the strided tokens, as an array: a write into them is a modified input
        given = _with(args, kwargs, where, name, as_numpy(view.cpu(), name=name)) if operand == "A" else (args, kwargs)
        inputs.modified(adapter.name, conv, pristine, given)
        _margins_changed(base, margins, routing, adapter.name, operand)
        # its output, as a plain call's (RoutedKernelAdapter.run): what it returns, else what it wrote into C
        if returned is None:  # written into its output argument (strided here in the C cell)
            got = as_numpy(conv.out_value(args, kwargs).cpu(), name=f"output of {adapter.name}")
        else:
            got = as_numpy(returned, name=f"output of {adapter.name}", strict=True)
        out = conv.per_slot(got, *pristine)
        ref = adapter.reference_for(routing)  # once the kernel has returned
        gmm_ref.assert_routed_matches(out, ref, numerics=numerics, kernel=adapter.name, output=conv.output)
    except Exception as exc:
        exc.add_note(f"{routing.describe()}\n{_offsets_note(operand)}")
        raise


def _with(args: tuple, kwargs: dict, where: int, name: str, value: Any) -> tuple[tuple, dict]:
    """A call's ``(args, kwargs)`` with the argument ``name`` (positional at ``where`` if passed so) set to
    ``value``."""
    if where < len(args):
        return (*args[:where], value, *args[where + 1:]), kwargs
    return args, {**kwargs, name: value}


def _offsets_note(operand: str) -> str:
    """How the cell strided ``operand``, and where its offsets pass 2**31 - 1."""
    first = -(-2**31 // ROW_STRIDE)
    if operand == "A":
        t, _ = A_SHAPE
        return (f"A's rows (tokens) were {ROW_STRIDE:,} elements apart (A.stride(0)): token t at t * {ROW_STRIDE:,}, "
                f"past 2**31 - 1 from token {first} on, up to {(t - 1) * ROW_STRIDE:,}: an offset computed in int32 "
                "(token * stride_am) wraps there")
    t, k = SHAPE
    return (f"C's rows were {ROW_STRIDE:,} elements apart (C.stride(1)): flat slot f = token * {k} + slot at "
            f"f * {ROW_STRIDE:,}, past 2**31 - 1 from slot {first} (token {first // k}) on, up to "
            f"{(t * k - 1) * ROW_STRIDE:,}: an offset computed in int32 wraps there")
