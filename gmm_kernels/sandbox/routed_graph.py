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

from gmm_kernels.sandbox import cuda_graph, inputs
from gmm_ref import Mismatch, assert_routed_matches

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
    arguments into those buffers, replay and judge (``cuda_graph.replay_each``, :func:`judge_routed_replay`).
    ``capture``: ``cuda_graph.cuda_capture`` (None) or a stand-in; ``on_failure``: see :data:`OnFailure`."""
    __tracebackhide__ = True
    conv = adapter.convention_facts
    hosts = [inputs.fresh(*conv.arguments(r)) for r in routings]

    def judge(got: np.ndarray, i: int) -> None:
        judge_routed_replay(adapter, conv.per_slot(got, *hosts[i]), routings[i], routings[0], i + 1)

    cuda_graph.replay_each(adapter, hosts, judge, capture or cuda_graph.cuda_capture,
                           None if on_failure is None else lambda exc, i: on_failure(exc, i + 1),
                           "a new routing of one shape", "found by replaying one captured CUDA graph with each "
                           "routing in turn (gmm_kernels.sandbox.routed_graph); a reproducer's eager calls may pass")
