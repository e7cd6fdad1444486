"""CUDA graph replay (the ``graph`` mode on a CUDA device, torch conventions).

The kernel's call is captured once in a ``torch.cuda.CUDAGraph`` whose inputs
are device buffers (the operands, group sizes and offsets of the first
problem); each later problem of the mode (one shape, other group sizes) is
written into the same buffers and the graph replayed, and every replay's output
is held to that problem's reference. A kernel that read the sizes on the host
while it was captured (``.item()``, ``.tolist()``, a plan cached on the host)
replays the captured sizes: when the replay's output is the captured sizes'
result, the failure says the replay used stale sizes.

A kernel that cannot be captured (it synchronizes with the host, copies from
pageable memory, allocates in a way capture forbids) raises
:class:`NotCapturable` ("cannot be captured in a CUDA graph: <error>"): the
mode declines its problems with that reason (a refusal: such a kernel cannot be
used in a captured graph, and its replays cannot go stale; its eager calls,
checked before the capture, still pass or fail).

Only arrays are rewritten between replays: a host argument (a Python int such
as DeepGEMM's ``expected_m``, a dtype) keeps its captured value, as in a
serving loop that replays a graph. The replays are judged on their outputs;
writes to the inputs are the eager calls' check (``gmm_kernels.sandbox.inputs``).

The capture (:func:`cuda_capture`) needs a GPU; everything else takes the
capture as an argument (:func:`check_replays`), so that it is checked on the
CPU with a stand-in capture.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any

import numpy as np

from gmm_kernels.sandbox import convert, device, inputs
from gmm_ref import Mismatch, Problem, assert_matches_reference
from gmm_ref.dtypes import as_numpy

__all__ = ["NotCapturable", "buffers", "check_replays", "cuda_capture", "judge_replay", "refill", "replay_each"]

#: ``capture(call) -> (replay, output)``: ``call`` captured once; ``replay()`` runs it again on what its buffers
#: then hold, returning None (the graph writes ``output``, a static tensor) or its own output (a stand-in)
Capture = Callable[[Callable[[], Any]], tuple[Callable[[], Any], Any]]
#: ``on_failure(exc, problem, replay)``: called with a replay's failure before it is raised (to attach a recipe)
OnFailure = Callable[[BaseException, Problem, int], None]


class NotCapturable(Exception):
    """The kernel's call cannot be captured in a CUDA graph; ``str()`` is the reason, naming the error."""


def _describe(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    return f"{type(exc).__name__}: {text[:300]}" if text else type(exc).__name__


def cuda_capture(call: Callable[[], Any]) -> tuple[Callable[[], None], Any]:
    """``call`` warmed up on a side stream, then captured in a ``torch.cuda.CUDAGraph`` on the selected device;
    :class:`NotCapturable` if the capture fails."""
    import torch

    where = device.torch_device()
    stream = torch.cuda.Stream(device=where)
    stream.wait_stream(torch.cuda.current_stream(where))
    with torch.cuda.stream(stream):  # torch's rule: a warm-up off the capturing stream (lazy init, autotuning)
        call()
    torch.cuda.current_stream(where).wait_stream(stream)
    torch.cuda.synchronize(where)
    graph = torch.cuda.CUDAGraph()
    try:
        with torch.cuda.graph(graph):
            out = call()
    except Exception as exc:
        with contextlib.suppress(Exception):  # a graph that never captured has little to free
            graph.reset()
        raise NotCapturable(f"cannot be captured in a CUDA graph: {_describe(exc)}") from exc
    return graph.replay, out


def buffers(static: Any, host: Any) -> list[tuple[Any, np.ndarray]]:
    """The pairs (device tensor, host array) of a call's arguments walked together (``static``: what the graph
    was captured with; ``host``: another problem's NumPy arguments, same structure); ValueError naming the
    first argument whose shape or dtype differs (a replay writes into the same buffers)."""
    if isinstance(host, np.ndarray):
        shape = tuple(getattr(static, "shape", ()))
        dtype = convert.torch_dtype(host.dtype)
        if shape != host.shape or getattr(static, "dtype", None) != dtype:
            raise ValueError(f"a replay's argument of shape {host.shape} {host.dtype} does not fit the captured "
                             f"buffer {shape} {getattr(static, 'dtype', None)}")
        return [(static, host)]
    if isinstance(host, dict):
        return [pair for k in host for pair in buffers(static[k], host[k])]
    if isinstance(host, tuple):
        if not isinstance(static, tuple) or len(static) != len(host):
            raise ValueError(f"a replay's arguments do not match the captured ones: {len(host)} values, not "
                             f"{len(static) if isinstance(static, tuple) else 1}")
        return [pair for s, h in zip(static, host, strict=True) for pair in buffers(s, h)]
    return []


def refill(pairs: list[tuple[Any, np.ndarray]]) -> None:
    """Each host array written into its device buffer (same shape; the buffer keeps its address)."""
    for tensor, array in pairs:
        tensor.copy_(convert.to_torch(np.ascontiguousarray(array), tensor.device))


def judge_replay(adapter: Any, out: Any, problem: Problem, captured: Problem, replay: int) -> None:
    """Hold a replay's output to ``problem``'s reference; a ``gmm_ref.Mismatch`` naming the replay, and, when the
    output is what the captured sizes give (and those give another result), saying the replay used stale sizes."""
    __tracebackhide__ = True
    sizes, then = np.asarray(problem.group_sizes).tolist(), np.asarray(captured.group_sizes).tolist()
    try:
        assert_matches_reference(out, adapter.reference_for(problem), numerics=adapter.numerics_for(problem),
                                 kernel=adapter.name)
    except Mismatch as exc:
        stale = sizes != then
        if stale:
            try:
                assert_matches_reference(out, adapter.reference_for(captured), numerics=adapter.numerics_for(captured),
                                         kernel=adapter.name)
            except Mismatch:
                stale = False
        if stale:
            raise Mismatch(f"{adapter.name}: replay {replay} of a CUDA graph captured with group sizes {then} used "
                           f"stale sizes: written {sizes} into the captured buffers, its output is the captured "
                           f"sizes' result (the kernel read the sizes on the host while it was captured: .item(), "
                           f".tolist(), a cached plan)", kind="stale_graph") from exc
        exc.add_note(f"replay {replay} of a CUDA graph captured with group sizes {then}, replayed with {sizes}")
        raise


def replay_each(adapter: Any, hosts: list[tuple[tuple, dict]], judge: Callable[[np.ndarray, int], None],
                capture: Capture, on_failure: Callable[[BaseException, int], None] | None, what: str,
                found_by: str) -> None:
    """Capture ``adapter``'s call on ``hosts[0]`` (its convention's arguments, NumPy) as device tensors on the
    selected device, then for each host ``i`` write its arguments into those buffers, replay, and ``judge(output as
    NumPy, i)``. :class:`NotCapturable` where some host's arguments do not fit the first one's buffers (``what``: the
    replays' arguments, in words) or the capture fails; a replay's failure gets the note ``found_by`` and goes to
    ``on_failure(exc, i)`` before it is raised. The kernel gets tensors, which its adapter passes through
    (``gmm_kernels.sandbox.convert.to_torch``)."""
    __tracebackhide__ = True
    facts = adapter.convention_facts
    static_args, static_kw = convert.to_framework("torch", *hosts[0])
    try:  # every replay's arguments must fit the captured buffers
        pairs = [buffers((static_args, static_kw), h) for h in hosts]
    except ValueError as exc:
        raise NotCapturable(f"cannot be replayed with {what}: {exc}") from exc

    def call() -> Any:
        out = adapter.invoke(*static_args, **static_kw)
        return facts.out_value(static_args, static_kw) if out is None and facts.out_argument is not None else out

    replay, out = capture(call)
    for i, pair in enumerate(pairs):
        try:
            refill(pair)
            result = replay()
            device.synchronize()
            judge(as_numpy(out if result is None else result, name=f"output of {adapter.name}", strict=True), i)
        except Exception as exc:
            exc.add_note(found_by)
            if on_failure is not None:
                on_failure(exc, i)
            raise


def check_replays(adapter: Any, problems: tuple[Problem, ...], capture: Capture = cuda_capture,
                  on_failure: OnFailure | None = None) -> None:
    """Capture ``adapter``'s call on ``problems[0]``'s arguments, then replay it with each problem's written into its
    buffers and judge each (:func:`replay_each`, :func:`judge_replay`). ``capture``: how the call is captured
    (:data:`Capture`; the CPU tests give a stand-in); ``on_failure``: see :data:`OnFailure`."""
    __tracebackhide__ = True
    hosts = [inputs.fresh(*adapter.convention_facts.arguments(adapter._own(p))) for p in problems]
    replay_each(adapter, hosts, lambda got, i: judge_replay(adapter, got, problems[i], problems[0], i + 1), capture,
                None if on_failure is None else lambda exc, i: on_failure(exc, problems[i], i + 1),
                "other group sizes of one shape", "found by replaying one captured CUDA graph "
                "(gmm_kernels.sandbox.cuda_graph.check_replays); a reproducer's eager calls may pass")
