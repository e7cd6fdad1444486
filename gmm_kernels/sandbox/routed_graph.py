"""CUDA graph replay of a routed MoE kernel (the routed ``graph`` mode on a CUDA device, torch conventions).

Serving engines capture the fused-MoE kernel once per decode batch size and replay it every step with that step's
routing written into the captured buffers. Here the kernel's call is captured once on the first routing's
arguments (device tensors: the tokens, experts, ``topk_ids``, weights and the convention's metadata, such as
vLLM's ``sorted_token_ids`` and ``expert_ids``, whose sizes depend on the shape alone), then each routing of the
same shape is written into those buffers and the graph replayed, every replay held to its own routed reference.
A kernel that read the routing on the host while it was captured (a count per expert, ``num_tokens_post_padded``
as an int, a plan kept by shape) replays the captured one: when the replay's output is the captured routing's
result, the failure says so.

A call that cannot be captured, or a convention whose arguments change size with the routing (no buffer can take
the next one), raises ``cuda_graph.NotCapturable``: the mode declines the example with that reason, its eager
calls still judged. The capture is an argument, as in ``cuda_graph.check_replays``, so the CPU tests give a
stand-in.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import numpy as np

from gmm_kernels.sandbox import convert, cuda_graph, device, inputs
from gmm_ref import Mismatch, assert_routed_matches
from gmm_ref.dtypes import as_numpy

__all__ = ["check_routed_replays", "judge_routed_replay"]

#: ``on_failure(exc, replay)``: called with a replay's failure (1-based) before it is raised
OnFailure = Callable[[BaseException, int], None]


def _matches(adapter: Any, out: np.ndarray, routing: Any) -> bool:
    try:
        assert_routed_matches(out, adapter.reference_for(routing), numerics=adapter.numerics_for(routing),
                              kernel=adapter.name, output=adapter.convention_facts.output)
    except Mismatch:
        return False
    return True


def judge_routed_replay(adapter: Any, out: np.ndarray, routing: Any, captured: Any, replay: int) -> None:
    """Hold a replay's output to ``routing``'s reference; a ``gmm_ref.Mismatch`` naming the replay, and, where the
    output is what the captured routing's ids (with their weights, or with the new ones) give instead, saying the
    replay used the captured routing."""
    __tracebackhide__ = True
    try:
        assert_routed_matches(out, adapter.reference_for(routing), numerics=adapter.numerics_for(routing),
                              kernel=adapter.name, output=adapter.convention_facts.output)
    except Mismatch as exc:
        old_ids = dataclasses.replace(routing, topk_ids=captured.topk_ids)
        stale = not np.array_equal(routing.topk_ids, captured.topk_ids) and any(
            _matches(adapter, out, r) for r in (old_ids, dataclasses.replace(old_ids,
                                                                             topk_weights=captured.topk_weights)))
        if stale:
            raise Mismatch(f"{adapter.name}: replay {replay} of a CUDA graph captured with one routing used the "
                           "captured routing: its output is the captured topk_ids' result on the new tokens (the "
                           "kernel read the routing or its counts on the host while it was captured: .item(), "
                           ".tolist(), metadata kept by shape)", kind="stale_graph") from exc
        exc.add_note(f"replay {replay} of a CUDA graph captured with the routing of call 1, replayed with new "
                     "topk_ids and weights written into its buffers")
        raise


def check_routed_replays(adapter: Any, routings: tuple[Any, ...], capture: Any = None,
                         on_failure: OnFailure | None = None) -> None:
    """Capture ``adapter``'s call on ``routings[0]``'s arguments (device tensors), then for each routing write its
    arguments into those buffers, replay and judge (:func:`judge_routed_replay`). ``capture``:
    ``cuda_graph.cuda_capture`` (None) or a stand-in; ``on_failure``: see :data:`OnFailure`."""
    __tracebackhide__ = True
    conv = adapter.convention_facts
    hosts = [inputs.fresh(*conv.arguments(r)) for r in routings]
    static_args, static_kw = convert.to_framework("torch", *hosts[0])
    try:  # every routing's arguments must fit the first one's buffers
        pairs = [cuda_graph.buffers((static_args, static_kw), h) for h in hosts]
    except ValueError as exc:
        raise cuda_graph.NotCapturable(f"cannot be replayed with a new routing of one shape: {exc}") from exc

    def call() -> Any:
        out = adapter.invoke(*static_args, **static_kw)
        return conv.out_value(static_args, static_kw) if out is None and conv.out_argument is not None else out

    replay, out = (capture or cuda_graph.cuda_capture)(call)
    for i, (routing, host, pair) in enumerate(zip(routings, hosts, pairs, strict=True)):
        try:
            cuda_graph.refill(pair)
            result = replay()
            device.synchronize()
            got = as_numpy(out if result is None else result, name=f"output of {adapter.name}", strict=True)
            judge_routed_replay(adapter, conv.per_slot(got, *host), routing, routings[0], i + 1)
        except Exception as exc:
            exc.add_note("found by replaying one captured CUDA graph with each routing in turn "
                         "(gmm_kernels.sandbox.routed_graph); a reproducer's eager calls may pass")
            if on_failure is not None:
                on_failure(exc, i + 1)
            raise
