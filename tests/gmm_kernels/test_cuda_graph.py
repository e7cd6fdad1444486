"""The graph mode on a CUDA device (``gmm_kernels.sandbox.cuda_graph``): one capture, replays with other group sizes
written into its buffers, each judged; stale sizes named; a call that cannot be captured declined with its error.

Here the capture is a stand-in on the CPU (the call run again on the refilled buffers: a faithful graph for a kernel
that reads its sizes on the device); ``test_graph_replay_on_cuda`` captures real graphs where torch sees a GPU.
"""

from __future__ import annotations

import contextlib

import numpy as np
import pytest

import gmm_ref
from gmm_kernels import Status
from gmm_kernels.sandbox import cuda_graph, device, recycle
from gmm_kernels.scope import Scope
from property_tests.checks.check import check_kernel, check_mode

torch = pytest.importorskip("torch")
from tests.corpus.broken_kernels import grouped_mm_correct  # noqa: E402 - needs torch

TORCH = Scope(zero_extents=("m",), dtypes=["float32->float32", "bfloat16->bfloat16", "float16->float16"])
GPU = torch.cuda.is_available()

_first_read: dict[int, tuple] = {}


def reads_sizes_once_per_buffer(mat_a, mat_b, offs=None, bias=None, out_dtype=None):
    """Broken under a CUDA graph: reads offs on the host the first time it sees their buffer and keeps that copy
    (what a capture bakes in of a host read: .tolist(), .item(), a plan); right for every fresh buffer."""
    if offs is not None:
        offs = _first_read.setdefault(offs.data_ptr(), (offs, offs.clone()))[1]  # the buffer held: no address reuse
    return torch._grouped_mm(mat_a, mat_b, offs=offs, out_dtype=out_dtype)


def correct(mat_a, mat_b, offs=None, bias=None, out_dtype=None):
    return torch._grouped_mm(mat_a, mat_b, offs=offs, out_dtype=out_dtype)


def _stand_in(call):
    """A capture on the CPU: the call once (the warm-up), replays run it again on what the buffers hold."""
    call()
    return call, None


def _refuses(call):
    raise cuda_graph.NotCapturable("cannot be captured in a CUDA graph: RuntimeError: operation not permitted "
                                   "when stream is capturing")


@pytest.fixture
def on_cuda_here(monkeypatch):
    """The checks take the CUDA path (device.on_cuda) with tensors on the CPU and the stand-in capture."""
    monkeypatch.setattr(device, "_selected", "cpu")
    monkeypatch.setattr(device, "on_cuda", lambda: True)
    monkeypatch.setattr(device, "synchronize", lambda: None)
    monkeypatch.setattr(cuda_graph, "cuda_capture", _stand_in)
    _first_read.clear()


def test_replays_of_a_kernel_reading_its_sizes_on_the_device_pass(on_cuda_here):
    assert check_kernel(correct, convention="torch.grouped_mm", modes=["graph"], scope=TORCH, max_examples=4).ok


@pytest.fixture
def fresh_buffers(monkeypatch):
    """The graph mode's eager calls in fresh buffers, not the same ones (``sandbox.recycle``): this kernel keeps what
    it read by address, which the same buffers show eagerly; here only the capture's replays should show it."""
    monkeypatch.setattr(recycle, "recycling", contextlib.nullcontext)


def test_a_replay_that_used_the_captured_sizes_is_named_stale(on_cuda_here, fresh_buffers):
    result = check_mode(gmm_kernels_wrap(reads_sizes_once_per_buffer), "graph", family="ragged_m", max_examples=6)
    # (checked again in new buffers, some calls read fresh sizes: FAIL or INTERMITTENT, the report the same)
    assert result.status.failure, result.detail
    report = result.full_report()
    assert "of a CUDA graph captured with group sizes [" in report and "used stale sizes" in report, report


def test_the_same_kernel_passes_without_a_graph_in_fresh_buffers(monkeypatch, fresh_buffers):
    """Its eager calls in fresh buffers are right: what fails it above is the replay of one capture."""
    monkeypatch.setattr(device, "_selected", "cpu")
    _first_read.clear()
    result = check_mode(gmm_kernels_wrap(reads_sizes_once_per_buffer), "graph", family="ragged_m", max_examples=6)
    assert result.status is Status.PASSED, result.detail


def test_the_same_kernel_fails_eagerly_in_the_same_buffers(monkeypatch):
    """The graph mode's eager calls reuse the first call's buffers (same addresses): a read kept by address shows."""
    monkeypatch.setattr(device, "_selected", "cpu")
    _first_read.clear()
    result = check_mode(gmm_kernels_wrap(reads_sizes_once_per_buffer), "graph", family="ragged_m", max_examples=6)
    assert result.status.failure, result.detail


def test_a_call_that_cannot_be_captured_is_declined_with_the_error(on_cuda_here, monkeypatch):
    monkeypatch.setattr(cuda_graph, "cuda_capture", _refuses)
    result = check_mode(gmm_kernels_wrap(correct), "graph", family="ragged_m", max_examples=3)
    assert result.status is Status.UNSUPPORTED, result.detail
    assert "cannot be captured in a CUDA graph: RuntimeError: operation not permitted" in result.detail


def gmm_kernels_wrap(fn):
    from gmm_kernels import wrap

    return wrap(fn, "torch.grouped_mm", scope=TORCH)


def test_a_replay_must_fit_the_captured_buffers():
    static = (torch.zeros(4, 3), {"offs": torch.zeros(2, dtype=torch.int32)})
    pairs = cuda_graph.buffers(static, (np.ones((4, 3), np.float32), {"offs": np.array([1, 4], np.int32)}))
    assert [tuple(h.shape) for _, h in pairs] == [(4, 3), (2,)]
    cuda_graph.refill(pairs)
    assert static[0].sum().item() == 12 and static[1]["offs"].tolist() == [1, 4]
    with pytest.raises(ValueError, match=r"shape \(5, 3\) float32 does not fit the captured buffer"):
        cuda_graph.buffers(static, (np.ones((5, 3), np.float32), {"offs": np.array([1, 4], np.int32)}))


def test_judge_replay_names_stale_sizes_and_other_mismatches():
    rng = np.random.default_rng(0)
    lhs, rhs = rng.integers(-3, 4, (6, 4)).astype(np.float32), rng.integers(-3, 4, (2, 4, 5)).astype(np.float32)
    captured = gmm_ref.Problem("ragged_m", lhs, rhs, np.array([2, 4], np.int32), convention="torch.grouped_mm")
    now = captured.replace(group_sizes=np.array([5, 1], np.int32))
    k = gmm_kernels_wrap(correct)
    cuda_graph.judge_replay(k, gmm_ref.reference(now).exact.astype(np.float32), now, captured, 2)  # right: passes
    with pytest.raises(gmm_ref.Mismatch, match=r"replay 2 of a CUDA graph captured with group sizes \[2, 4\] used "
                                               r"stale sizes: written \[5, 1\]") as info:
        cuda_graph.judge_replay(k, gmm_ref.reference(captured).exact.astype(np.float32), now, captured, 2)
    assert info.value.kind == "stale_graph"
    with pytest.raises(gmm_ref.Mismatch) as info:
        cuda_graph.judge_replay(k, np.zeros((6, 5), np.float32) + 7, now, captured, 3)
    assert "replay 3 of a CUDA graph captured with group sizes [2, 4], replayed with [5, 1]" in "\n".join(
        getattr(info.value, "__notes__", []))


@pytest.mark.skipif(not GPU, reason="torch sees no CUDA device here: a CUDA graph needs one")
def test_graph_replay_on_cuda(monkeypatch):
    monkeypatch.setattr(device, "_selected", device._selected)
    _first_read.clear()
    scope = Scope(zero_extents=("m",), dtypes=["bfloat16->bfloat16"])
    assert check_kernel(correct, convention="torch.grouped_mm", modes=["graph"], scope=scope, max_examples=6,
                        device="cuda").ok
    report = check_kernel(reads_sizes_once_per_buffer, convention="torch.grouped_mm", modes=["graph"], scope=scope,
                          max_examples=6, device="cuda", raise_on_failure=False)
    assert not report.ok and "used stale sizes" in report.results[0].detail
    # a host read of the sizes (offs.tolist()) synchronizes: the call cannot be captured, the mode declines it
    report = check_kernel(grouped_mm_correct, convention="torch.grouped_mm", modes=["graph", "exact"], scope=scope,
                          max_examples=4, device="cuda", raise_on_failure=False)
    graph = report.results[0]
    assert graph.status is Status.UNSUPPORTED and "cannot be captured in a CUDA graph" in graph.detail
