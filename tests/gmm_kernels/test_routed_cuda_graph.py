"""The routed graph mode on a CUDA device (``gmm_kernels.sandbox.routed_graph``): one capture, replays with new
routings written into its buffers, each judged; a replay of the captured routing named; a call that cannot be
captured declined with its error.

Here the capture is a stand-in on the CPU (the call run again on the refilled buffers: a faithful graph for a kernel
that reads its routing on the device); ``test_routed_graph_replay_on_cuda`` captures real graphs where torch sees a
GPU.
"""

from __future__ import annotations

import pytest

import gmm_kernels
from gmm_kernels import Status
from gmm_kernels.sandbox import cuda_graph, device, routed_graph
from property_tests.checks.check import check_mode

torch = pytest.importorskip("torch")
GPU = torch.cuda.is_available()

_first_read: dict[int, tuple] = {}


def _moe_experts(hidden_states, weight, topk_ids, topk_weights, expert_map=None):
    """torch.moe_experts, right: ``[T, N]``, each token's local slots weighted and summed in float32."""
    t, top_k = topk_ids.shape
    local = topk_ids.long() if expert_map is None else expert_map.long()[topk_ids.long()]
    y = torch.einsum("enk,tk->ten", weight.float(), hidden_states.float())  # every token through every local expert
    out = torch.zeros((t, weight.shape[1]), dtype=torch.float32, device=hidden_states.device)
    for j in range(top_k):
        e = local[:, j]
        took = y[torch.arange(t, device=e.device), e.clamp(min=0)] * topk_weights[:, j:j + 1].float()
        out += torch.where((e >= 0)[:, None], took, torch.zeros_like(took))
    return out.to(hidden_states.dtype)


def correct(hidden_states, weight, topk_ids, topk_weights, expert_map=None):
    return _moe_experts(hidden_states, weight, topk_ids, topk_weights, expert_map)


def reads_ids_once_per_buffer(hidden_states, weight, topk_ids, topk_weights, expert_map=None):
    """Broken under a CUDA graph: reads ``topk_ids`` on the host the first time it sees their buffer and keeps that
    copy (what a capture bakes in of a host read: a count per expert, sorted ids kept by shape); right for every
    fresh buffer."""
    ids = _first_read.setdefault(topk_ids.data_ptr(), (topk_ids, topk_ids.clone()))[1]  # held: no address reuse
    return _moe_experts(hidden_states, weight, ids, topk_weights, expert_map)


def _stand_in(call):
    """A capture on the CPU: the call once (the warm-up), replays run it again on what the buffers hold."""
    call()
    return call, None


@pytest.fixture
def on_cuda_here(monkeypatch):
    """The checks take the CUDA path (device.on_cuda) with tensors on the CPU and the stand-in capture; the replays
    made are counted."""
    monkeypatch.setattr(device, "_selected", "cpu")
    monkeypatch.setattr(device, "on_cuda", lambda: True)
    monkeypatch.setattr(device, "synchronize", lambda: None)
    monkeypatch.setattr(cuda_graph, "cuda_capture", _stand_in)
    _first_read.clear()
    captured = []
    real = routed_graph.check_routed_replays

    def counted(adapter, routings, **kwargs):
        captured.append(len(routings))
        return real(adapter, routings, **kwargs)

    monkeypatch.setattr(routed_graph, "check_routed_replays", counted)
    return captured


def _wrap(fn):
    return gmm_kernels.wrap(fn, "torch.moe_experts", name=f"{__name__}:{fn.__name__}")


def test_replays_of_a_kernel_reading_its_routing_on_the_device_pass(on_cuda_here):
    result = check_mode(_wrap(correct), "graph", max_examples=8)
    assert result.status is Status.PASSED, result.full_report()
    assert on_cuda_here and set(on_cuda_here) == {4}  # every example captured once and replayed with 4 routings


def test_the_same_kernel_passes_the_graph_mode_eagerly_without_a_gpu():
    assert check_mode(_wrap(reads_ids_once_per_buffer), "graph", max_examples=8).status is Status.PASSED


def test_a_replay_that_used_the_captured_routing_is_named(on_cuda_here):
    result = check_mode(_wrap(reads_ids_once_per_buffer), "graph", max_examples=8)
    assert result.status.failure, result.detail
    report = result.full_report()
    assert "of a CUDA graph captured with one routing used the captured routing" in report, report
    assert "replay " in report and "routed_graph" in report


def test_a_call_that_cannot_be_captured_is_declined_with_the_error(on_cuda_here, monkeypatch):
    def refuses(call):
        raise cuda_graph.NotCapturable("cannot be captured in a CUDA graph: RuntimeError: operation not permitted "
                                       "when stream is capturing")

    monkeypatch.setattr(cuda_graph, "cuda_capture", refuses)
    # the design's cells 2 and 3 (routings of tokens, replayed; cell 1's T = 0 is one call, nothing to replay)
    result = check_mode(_wrap(correct), "graph", max_examples=3)
    assert result.status is Status.PASSED and result.examples == 1, result.detail  # T = 0 alone was checked
    assert on_cuda_here == [4, 4]  # the two others were declined at their capture


@pytest.mark.skipif(not GPU, reason="torch sees no CUDA device here: a CUDA graph needs one")
def test_routed_graph_replay_on_cuda(monkeypatch):
    from property_tests import check_kernel

    assert check_kernel(correct, convention="torch.moe_experts", modes=["graph"], max_examples=6,
                        device="cuda").ok
    _first_read.clear()
    report = check_kernel(reads_ids_once_per_buffer, convention="torch.moe_experts", modes=["graph"],
                          max_examples=6, device="cuda", raise_on_failure=False)
    assert not report.ok and "used the captured routing" in report.results[0].full_report()
