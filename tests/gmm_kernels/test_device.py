"""A device for every torch convention (``gmm_kernels.sandbox.device``): the option, where tensors are made, the copies
written back for the input checks, the refusals chosen by device, and the device in the report.

This machine may have no GPU: what needs one is in ``test_graph_replay_cuda`` (skipped, with its reason, where
torch sees none); the device logic is checked here through the CPU and through CPU "device copies".
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest

import gmm_ref
from gmm_kernels.sandbox import convert, device
from gmm_kernels.scope import Scope
from property_tests.checks.check import check_kernel
from property_tests.cli.request import WorkRequest

torch = pytest.importorskip("torch")
ROOT = Path(__file__).resolve().parents[2]
#: kernels built on torch._grouped_mm on CPU take no K = 0 or N = 0 and no float32 output from bfloat16 inputs
TORCH = Scope(zero_extents=("m",), dtypes=["float32->float32", "bfloat16->bfloat16", "float16->float16"])
GPU = torch.cuda.is_available()


@pytest.fixture(autouse=True)
def _restore_selection(monkeypatch):
    monkeypatch.setattr(device, "_selected", device._selected)  # each test's selection is undone after it


# ------------------------------------------------------------------------------------------------ the option
@pytest.mark.parametrize("bad", ["gpu", "cuda:", "cuda:-1", "cuda:x", "cpu:0", "", 3, None])
def test_a_malformed_device_is_an_error_naming_the_option_and_the_forms(bad):
    with pytest.raises(ValueError, match=r"--gmm-device: expected auto, cpu, cuda or cuda:N .*got"):
        device.resolve(bad, option="--gmm-device")


@pytest.mark.parametrize(("text", "expected"), [("auto", "cpu"), ("cpu", "cpu"), (" CPU ", "cpu")])
def test_auto_and_cpu_resolve_to_the_cpu_where_torch_sees_no_gpu(monkeypatch, text, expected):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert device.resolve(text) == expected


def test_cuda_where_torch_sees_none_and_an_index_past_the_devices_are_errors(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    for text in ("cuda", "cuda:0"):
        with pytest.raises(ValueError, match=rf"--device: '{text}' asked for, but torch sees no CUDA device"):
            device.resolve(text)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 1)
    assert (device.resolve("auto"), device.resolve("cuda"), device.resolve("cuda:0")) == ("cuda:1", "cuda:1",
                                                                                          "cuda:0")
    with pytest.raises(ValueError, match=r"--device: expected cuda:N with N below 2 \(torch sees 2 CUDA devices\), "
                                         r"got 'cuda:2'"):
        device.resolve("cuda:2")


def _cli(tmp_path: Path, *argv: str, kernels: str = "", command: str = "check") -> subprocess.CompletedProcess:
    (tmp_path / "devkernels.py").write_text(kernels)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), str(ROOT)])}
    return subprocess.run([sys.executable, "-m", "property_tests.cli.main", command, *argv], capture_output=True,
                          text=True, timeout=600, cwd=tmp_path, env=env)


@pytest.mark.parametrize("command", ["check", "coverage"])
def test_the_cli_takes_a_bad_device_as_a_usage_error(tmp_path, command):
    proc = _cli(tmp_path, "--kernel", "torch.grouped_mm", "--device", "gpu", command=command)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert f"gmm-harness {command}: error: --device: expected auto, cpu, cuda or cuda:N (N a CUDA device index), " \
           "got 'gpu'" in proc.stderr


@pytest.mark.skipif(GPU, reason="torch sees a CUDA device here: --device cuda is no usage error")
def test_the_cli_takes_cuda_without_a_gpu_as_a_usage_error(tmp_path):
    proc = _cli(tmp_path, "--kernel", "torch.grouped_mm", "--device", "cuda")
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "--device: 'cuda' asked for, but torch sees no CUDA device here" in proc.stderr


def _pytest(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    (tmp_path / "test_probe.py").write_text("def test_probe():\n    pass\n")
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:xdist",
                           str(tmp_path / "test_probe.py"), *args], capture_output=True, text=True, timeout=120,
                          cwd=tmp_path)


def test_the_plugin_takes_a_bad_device_as_a_usage_error(tmp_path):
    proc = _pytest(tmp_path, "--gmm-device=tpu")
    assert proc.returncode == 4, proc.stdout + proc.stderr
    assert "--gmm-device: expected auto, cpu, cuda or cuda:N" in proc.stderr
    if not GPU:
        proc = _pytest(tmp_path, "--gmm-device=cuda:0")
        assert proc.returncode == 4 and "--gmm-device: 'cuda:0' asked for, but torch sees no CUDA device" \
            in proc.stderr, proc.stdout + proc.stderr


def test_check_kernel_takes_a_device_and_names_the_argument():
    with pytest.raises(ValueError, match="device: expected auto, cpu, cuda or cuda:N"):
        check_kernel("torch.grouped_mm", device="gpu")


def test_the_device_travels_to_the_workers_in_the_request():
    request = WorkRequest(kernels=("torch.grouped_mm",), device="cuda:1")
    assert WorkRequest.from_json(json.loads(json.dumps(request.to_json()))).device == "cuda:1"
    assert WorkRequest.from_json({"kernels": []}).device == "cpu"  # a request written before it: the CPU


# ------------------------------------------------------------------------------------- tensors on the device
ON_DEVICE = textwrap.dedent('''
    import torch
    from gmm_kernels.sandbox import device
    from tests.corpus.broken_kernels import grouped_mm_correct

    def _check(**tensors):
        where = torch.device(device.selected())
        wrong = {n: str(t.device) for n, t in tensors.items() if isinstance(t, torch.Tensor) and t.device != where}
        if wrong:
            raise AssertionError(f"tensors not on the selected device {where}: {wrong}")

    def on_device(mat_a, mat_b, offs=None, bias=None, out_dtype=None):
        _check(mat_a=mat_a, mat_b=mat_b, offs=offs)
        return grouped_mm_correct(mat_a, mat_b, offs, bias, out_dtype)

    def on_cuda_only(mat_a, mat_b, offs=None, bias=None, out_dtype=None):
        """Broken here: a kernel that wants its operands on a CUDA device."""
        if mat_a.device.type != "cuda":
            raise AssertionError(f"mat_a on {mat_a.device}, not a CUDA device")
        return grouped_mm_correct(mat_a, mat_b, offs, bias, out_dtype)
''')


def test_a_user_torch_kernel_gets_its_tensors_on_the_device_the_report_names(tmp_path):
    out = tmp_path / "run.json"
    proc = _cli(tmp_path, "--kernel", "devkernels:on_device", "--kernel", "devkernels:on_cuda_only",
                "--convention", "torch.grouped_mm", "--device", "cpu", "--modes", "exact", "--max-examples", "2",
                "--families", "ragged_m", "--no-goldens", "--json", str(out), kernels=ON_DEVICE)
    text = proc.stdout
    assert proc.returncode == 1, text + proc.stderr  # the kernel that wants CUDA fails, naming its device
    assert "devices: torch conventions on cpu (--device cpu)\n" in text
    header = next(line for line in text.splitlines() if line.startswith("kernel "))
    assert header.split("|")[2].strip() == "device"
    rows = {line.split("|")[0].strip(): [c.strip() for c in line.split("|")] for line in text.splitlines()
            if line.startswith("devkernels:")}
    assert rows["devkernels:on_device"][2] == "cpu" and rows["devkernels:on_device"][3].startswith("pass (2")
    assert rows["devkernels:on_cuda_only"][3].startswith("FAIL") and "mat_a on cpu, not a CUDA device" in text
    doc = json.loads(out.read_text())
    assert [(k["name"], k["device"]) for k in doc["kernels"]] == [("devkernels:on_device", "cpu"),
                                                                  ("devkernels:on_cuda_only", "cpu")]


def test_a_jax_kernel_is_reported_on_jax_default_device():
    from gmm_kernels import get

    assert device.of(get("jax.ragged_dot")) == device.jax_device() == "cpu"  # JAX_PLATFORMS=cpu in the tests
    device.select("cpu")
    assert device.of(get("torch.grouped_mm")) == "cpu"


def test_a_harness_allocated_output_is_made_on_the_device():
    from tests.corpus.broken_serving import contiguous_correct

    seen = set()

    def kernel(a, b, d, grouped_layout, **kw):
        seen.update(str(t.device) for t in (a, b, d, grouped_layout) if isinstance(t, torch.Tensor))
        return contiguous_correct(a, b, d, grouped_layout, **kw)

    assert check_kernel(kernel, convention="deep_gemm.m_grouped_contiguous", modes=["exact"], max_examples=3,
                        device="cpu").ok
    assert seen == {"cpu"}


# ------------------------------------------------------------------ device copies: margins, and written back
def test_a_device_copy_of_a_view_carries_its_whole_buffer_and_takes_the_same_view():
    buf = np.full((6, 9), np.nan, ml_dtypes.bfloat16)  # a guard region: NaN margins around the operand
    buf[1:5, 2:7] = np.arange(20, dtype=np.float32).reshape(4, 5)
    view = buf[1:5, 2:7]
    t = convert.device_copy(view, "cpu")
    assert t.shape == view.shape and t.stride() == (9, 1) and t.storage_offset() == 11
    assert np.array_equal(gmm_ref.as_numpy(t).astype(np.float32), view.astype(np.float32))
    whole = torch.as_strided(t, (6, 9), (9, 1), 0)  # the margins travelled with it
    assert torch.isnan(whole[0]).all() and torch.isnan(whole[:, 8]).all()
    t.zero_()  # a copy: the host is untouched outside written_back
    assert view.astype(np.float32).sum() == 190


def test_device_copies_are_written_back_and_views_of_one_buffer_share_one_copy():
    buf = np.arange(12, dtype=np.float32)
    left, right = buf[:6].reshape(2, 3), buf[6:]
    with convert.written_back():
        a, b = convert.device_copy(left, "cpu"), convert.device_copy(right, "cpu")
        a[0, 0] = -1.0
        b[-1] = -2.0
        assert a.untyped_storage().data_ptr() == b.untyped_storage().data_ptr()
        assert buf[0] == 0  # not yet: the device's copy is written back when the call ends
    assert buf[0] == -1.0 and buf[-1] == -2.0 and buf[1:11].tolist() == list(range(1, 11))


def _as_device_copies(monkeypatch):
    """torch tensors made as a CUDA device's are (copies, written back), on the CPU."""
    def to_torch(x, dev=None):
        return x if x is None or isinstance(x, torch.Tensor) else convert.device_copy(np.asarray(x), "cpu")

    monkeypatch.setattr(convert, "to_torch", to_torch)


def doubles_mat_a_first(mat_a, mat_b, offs=None, bias=None, out_dtype=None):
    """Broken: doubles mat_a in place, then computes correctly from it."""
    mat_a.mul_(2)
    return torch._grouped_mm(mat_a, mat_b, offs=offs, out_dtype=out_dtype) / 2


def correct(mat_a, mat_b, offs=None, bias=None, out_dtype=None):
    return torch._grouped_mm(mat_a, mat_b, offs=offs, out_dtype=out_dtype)


def test_a_kernel_writing_to_its_device_copies_is_reported(monkeypatch):
    _as_device_copies(monkeypatch)
    with pytest.raises(gmm_ref.Mismatch) as info:
        check_kernel(doubles_mat_a_first, convention="torch.grouped_mm", modes=["exact"], scope=TORCH,
                     max_examples=5)
    assert info.value.kind == "modified_input" and "  mat_a: " in str(info.value)
    assert check_kernel(correct, convention="torch.grouped_mm", modes=["exact"], scope=TORCH, max_examples=5).ok
    # without the copies written back the write would go unseen: what catches it is the copy back
    monkeypatch.setattr(convert, "written_back", contextlib.nullcontext)
    assert check_kernel(doubles_mat_a_first, convention="torch.grouped_mm", modes=["exact"], scope=TORCH,
                        max_examples=5).ok


# --------------------------------------------------------------------------------- refusals chosen by device
def test_the_cpu_only_refusals_apply_only_where_the_cpu_path_runs(monkeypatch):
    from gmm_kernels import get

    k = get("torch.grouped_mm")
    bf16, f32 = np.dtype(ml_dtypes.bfloat16), np.dtype(np.float32)
    device.select("cpu")
    assert "CPU _grouped_mm refuses out_dtype float32" in k.dtype_refusal(bf16, bf16, f32)
    assert device.cpu_only() and device.cuda_only("DeepGEMM") == ("DeepGEMM runs on CUDA devices only; the selected "
                                                                  "device is cpu (--device)")
    monkeypatch.setattr(device, "_selected", "cuda:0")  # the selection a GPU machine makes (nothing runs here)
    assert k.dtype_refusal(bf16, bf16, f32) is None
    assert not device.cpu_only() and device.cuda_only("DeepGEMM") is None
    from gmm_kernels.known_issues import TORCH_CPU_RAGGED_K_LEAK

    assert not TORCH_CPU_RAGGED_K_LEAK.applies()  # torch's CPU bug, where its CPU path does not run


@pytest.mark.parametrize(("version", "cpu_path"), [("2.11.0+cu130", False), ("2.12.1", False), ("2.13.0+cpu", True),
                                                     ("2.14.1+cu130", True)])
def test_torch_grouped_mm_needs_213_for_its_cpu_path_and_not_on_cuda(monkeypatch, version, cpu_path):
    from gmm_kernels import get

    k = get("torch.grouped_mm")
    monkeypatch.setattr(torch, "__version__", version)
    device.select("cpu")
    reason = k._unavailable()
    assert (reason is None) == cpu_path
    if not cpu_path:
        assert f"torch {version}'s _grouped_mm has no CPU path (torch >= 2.13 has one)" in reason
    monkeypatch.setattr(device, "_selected", "cuda:0")  # the GPU image's torch 2.11 runs its CUDA path
    assert k._unavailable() is None


def test_the_shards_merge_keeps_each_kernels_device():
    from property_tests.cli.document import KernelEntry, _unique

    merged = _unique([KernelEntry("k", "c", device="cpu"), KernelEntry("k", "c", device="cuda:0"),
                      KernelEntry("j", "c"), KernelEntry("k", "c", device="cpu")])
    assert merged == [KernelEntry("k", "c", device="cpu, cuda:0"), KernelEntry("j", "c")]


def test_the_golden_cli_takes_a_bad_device_as_a_usage_error(capsys):
    from golden.cli import main

    assert main(["check", "--kernel", "torch.grouped_mm", "--device", "gpu"]) == 2
    assert "--device: expected auto, cpu, cuda or cuda:N" in capsys.readouterr().err


def test_a_torch_golden_is_made_on_the_selected_device(monkeypatch):
    from gmm_kernels import get
    from golden.producers import kernel_producer

    device.select("cpu")
    assert kernel_producer(get("torch.grouped_mm"))["platform"].endswith("/cpu")


@pytest.mark.skipif(GPU, reason="torch sees a CUDA device here: a worker asked for cuda:0 would select it")
def test_a_worker_selects_the_device_of_its_request(tmp_path):
    """The worker selects the request's device as it is (not its own auto): asked for cuda:0 on a machine without
    one, its setup ends with that error, before any cell."""
    from property_tests.cli.shards import TableCell

    request = WorkRequest(kernels=("torch.grouped_mm",), modes=("exact",), device="cuda:0",
                          cells=(TableCell("torch.grouped_mm", "ragged_m", "exact"),))
    (tmp_path / "request.json").write_text(json.dumps(request.to_json()))
    events = tmp_path / "events"
    proc = subprocess.run([sys.executable, "-m", "property_tests.cli.worker", str(tmp_path / "request.json"),
                           str(events)], capture_output=True, text=True, timeout=300, cwd=ROOT)
    ended = [json.loads(line) for line in events.read_text().splitlines()]
    assert proc.returncode == 1 and ended[-1]["event"] == "error", ended
    assert "the request's device: 'cuda:0' asked for, but torch sees no CUDA device" in ended[-1]["text"]


def test_the_plugin_header_names_each_kernels_device(tmp_path):
    (tmp_path / "pytest.ini").write_text("[pytest]\ngmm_harness = true\n")
    (tmp_path / "test_mine.py").write_text("def test_mine(gmm_kernel):\n    pass\n")
    proc = _pytest(tmp_path, "-v", "--gmm-device=cpu", "--gmm-kernel=jax.ragged_dot", str(tmp_path / "test_mine.py"))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "gmm kernel jax.ragged_dot (ragged_dot) on cpu: available" in proc.stdout


def test_the_table_has_a_device_column_where_the_devices_are_known():
    from gmm_kernels import Status
    from property_tests.cli.table import CellOutcome, Table, render

    table = Table()
    table.plan([("k", "ragged_m", "exact")])
    table.add(("k", "ragged_m", "exact"), CellOutcome(Status.PASSED, examples=2))
    assert "device" not in render(table.as_rows(), ["exact"]).splitlines()[0]  # shards written before it: none
    table.devices = {"k": "cuda:0"}
    head, _, row, *_ = render(table.as_rows(), ["exact"]).splitlines()
    assert [c.strip() for c in head.split("|")] == ["kernel", "family", "device", "exact"]
    assert [c.strip() for c in row.split("|")] == ["k", "ragged_m", "cuda:0", "pass (2)"]
