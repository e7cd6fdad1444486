"""A kernel named ``pkg.module:fn`` runs in a process of its own (``gmm_kernels.sandbox.host``): the judge never
imports it, gives the same verdicts as in one process, and takes nothing from the host but bytes."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import gmm_kernels
import gmm_ref
from gmm_kernels import Status, resolve_kernel
from gmm_kernels.sandbox import wire
from gmm_kernels.sandbox.host import HostCrashed, HostedFunction, hosted_error
from property_tests.checks.check import check_mode

pytest.importorskip("jax")
ROOT = Path(__file__).resolve().parents[2]
HAS_TORCH = importlib.util.find_spec("torch") is not None
needs_torch = pytest.mark.skipif(not HAS_TORCH, reason="torch is not installed: these kernels are torch functions")

JAX_KERNELS = "tests.corpus.broken_kernels:"


def _kernel_module(tmp_path, monkeypatch, name: str, text: str) -> None:
    """A user's kernel module ``name`` in a directory of their own, which the test then runs from."""
    (tmp_path / f"{name}.py").write_text(text)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.chdir(tmp_path)


def _hosted(spec: str, **kw):
    kernel = resolve_kernel(spec, **kw)
    assert isinstance(kernel.fn, HostedFunction), kernel.fn
    return kernel


def test_the_judge_never_imports_a_hosted_kernel(tmp_path, monkeypatch):
    _kernel_module(tmp_path, monkeypatch, "judged_from_afar",
        "import jax\n\ndef ragged(lhs, rhs, group_sizes, precision=None, preferred_element_type=None):\n"
        "    return jax.lax.ragged_dot(lhs, rhs, group_sizes, precision=precision,\n"
        "                              preferred_element_type=preferred_element_type)\n")
    kernel = _hosted("judged_from_afar:ragged", convention="ragged_dot")
    result = check_mode(kernel, "exact", profile="gmm-ci", max_examples=10)
    assert result.status is Status.PASSED and result.examples > 0, result.detail
    assert "judged_from_afar" not in sys.modules


@pytest.mark.parametrize("fn", ["ragged_dot_boundary_off_by_one", "ragged_dot_replays_last_plan",
                                "ragged_dot_tail_not_zeroed", "ragged_dot_correct"])
def test_a_hosted_kernel_gets_the_verdict_it_gets_in_one_process(fn):
    spec = JAX_KERNELS + fn
    mode = "graph" if "plan" in fn else "exact"
    far = check_mode(_hosted(spec, convention="ragged_dot"), mode, profile="gmm-ci")
    near = check_mode(resolve_kernel(spec, convention="ragged_dot", in_process=True), mode, profile="gmm-ci")
    assert far.status is near.status, (far, near)
    assert far.detail.splitlines()[:1] == near.detail.splitlines()[:1], (far.detail, near.detail)
    assert (far.status is Status.PASSED) == (fn == "ragged_dot_correct"), far.detail


@needs_torch
@pytest.mark.parametrize("fn", ["grouped_mm_strides_ignored", "grouped_mm_spanning_tiles_dropped",
                                "grouped_mm_correct"])
def test_a_hosted_torch_kernel_gets_its_verdict_in_the_strided_cells_too(fn):
    spec = JAX_KERNELS + fn
    for mode in ("exact", "strided"):
        far = check_mode(_hosted(spec, convention="torch.grouped_mm"), mode, profile="gmm-ci")
        near = check_mode(resolve_kernel(spec, convention="torch.grouped_mm", in_process=True), mode,
                          profile="gmm-ci")
        assert far.status is near.status, (mode, far.detail[:800], near.detail[:800])
        assert far.detail.splitlines()[:1] == near.detail.splitlines()[:1], (far.detail, near.detail)


@needs_torch
def test_every_cheat_fails_in_its_own_process():
    """Whatever a cheat does to its own process (the harness's functions, the stack), the verdict is the judge's."""
    from tests.corpus import cheating_kernels as ck

    checks = [(fn, "exact", 10) for fn in [*ck.CHEATS, *ck.TAMPERING]]
    checks += [(fn, "poisoned", None) for fn in ck.INTERMITTENT]
    checks += [(fn, "graph", 10) for fn in [*ck.GRAPH_CHEATS, *ck.HONEST]]
    for fn, mode, examples in checks:
        result = check_mode(_hosted(f"tests.corpus.cheating_kernels:{fn.__name__}", convention="torch.grouped_mm"),
                            mode, profile="gmm-ci", max_examples=examples)
        assert result.status.failure is (fn not in ck.HONEST), (fn.__name__, result)


@needs_torch
def test_a_kernel_that_ends_its_process_fails_the_call_and_the_next_gets_a_new_one(tmp_path, monkeypatch):
    _kernel_module(tmp_path, monkeypatch, "ends_itself",
        "import os\nimport torch\n\n"
        "def once(mat_a, mat_b, offs=None, bias=None, out_dtype=None):\n"
        "    if os.path.exists('ended'):\n"
        "        return torch._grouped_mm(mat_a, mat_b, offs=offs, bias=bias, out_dtype=out_dtype)\n"
        "    open('ended', 'w').close()\n"
        "    os._exit(3)\n")
    kernel = _hosted("ends_itself:once", convention="torch.grouped_mm")
    problem = gmm_ref.Problem("ragged_m", np.ones((8, 16), np.float32), np.ones((2, 16, 16), np.float32),
                              np.array([3, 5]), convention="torch.grouped_mm", out_dtype=np.float32)
    with pytest.raises(HostCrashed, match=r"crashed: the kernel's process exited with status 3 during the call"):
        kernel.run(problem)
    np.testing.assert_array_equal(kernel.run(problem), np.full((8, 16), 16, np.float32))  # in a new process
    assert kernel.fn.host.starts == 2


def test_an_exception_from_the_host_keeps_its_name_base_and_traceback():
    exc = hosted_error({"type": "CompilationError", "module": "triton.compiler.errors", "base": "RuntimeError",
                        "message": "at 3:4: bad", "traceback": 'File "k.py", line 3, in kernel\n'})
    assert isinstance(exc, RuntimeError) and type(exc).__name__ == "CompilationError"
    assert type(exc).__module__ == "triton.compiler.errors" and str(exc) == "at 3:4: bad"
    assert 'File "k.py", line 3, in kernel' in exc.__notes__[0]
    mismatch = hosted_error({"type": "Mismatch", "module": "gmm_ref.compare", "mismatch": True,
                             "kind": "tampered", "message": "kernel k tampered"})
    assert isinstance(mismatch, gmm_ref.Mismatch) and mismatch.kind == "tampered"
    assert isinstance(hosted_error({"type": "ValueError", "module": "builtins", "base": "ValueError"}), ValueError)
    assert isinstance(hosted_error("junk"), RuntimeError)
    # the same exception twice is of one type: Hypothesis tells failures apart by type, and a steady failure
    # rebuilt as a new class every call would look like several, and flaky
    again = hosted_error({"type": "CompilationError", "module": "triton.compiler.errors", "base": "RuntimeError",
                          "message": "at 3:4: bad"})
    assert type(again) is type(exc)


def test_nothing_the_host_sends_builds_anything_but_arrays_and_the_harness_records():
    frames = [bytearray(8)]
    with pytest.raises(wire.HostError, match="not numeric"):
        wire.decode_array({"dtype": "O", "shape": [1]}, list(frames))
    with pytest.raises(wire.HostError, match="8 bytes for an array of"):
        wire.decode_array({"dtype": "float32", "shape": [4]}, list(frames))
    assert wire.decode_array({"dtype": "bfloat16", "shape": [4]}, list(frames)).dtype.name == "bfloat16"
    with pytest.raises(wire.HostError, match="not one of the harness's records"):
        wire.decode_record({"$record": "os:system", "fields": {}})
    with pytest.raises(wire.HostError, match="unknown fields"):
        wire.decode_record({"$record": "gmm_ref.numerics:Numerics", "fields": {"__class__": 1}})
    scope = gmm_ref.Numerics(accumulate="float32", flush_subnormals=True)
    assert wire.decode_record(json.loads(json.dumps(wire.encode_record(scope)))) == scope


def test_a_message_larger_than_allowed_is_refused():
    r, w = os.pipe()
    try:
        wire.send(w, {"x": 1}, [b"12345678"])
        with pytest.raises(wire.HostError, match="at most 4"):
            wire.receive(r, limit=4)
    finally:
        os.close(r)
        os.close(w)


@needs_torch
@pytest.mark.slow
def test_a_hosted_kernel_cannot_write_the_workers_report(tmp_path):
    """The main job's worker reports to a descriptor of a file named nowhere and is not dumpable: a kernel in its
    host process can neither open it nor forge a pass there."""
    log = tmp_path / "forgery.log"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
           "GMM_TEST_FORGERY_LOG": str(log)}
    env.pop("GMM_HARNESS_EXAMPLE_DB", None)
    proc = subprocess.run([sys.executable, "-m", "property_tests.cli.main", "check", "--kernel",
                           "tests.corpus.cheating_kernels:forges_the_workers_report", "--convention",
                           "torch.grouped_mm", "--modes", "exact,normal", "--max-examples", "5", "--no-goldens"],
                          capture_output=True, text=True, timeout=900, cwd=tmp_path, env=env)
    tried = log.read_text().splitlines()
    assert tried and not any(t.endswith("forged") for t in tried), tried
    assert any(t.endswith("PermissionError") for t in tried), tried
    assert proc.returncode == 1, proc.stdout[-3000:] + proc.stderr[-3000:]
    row = next(line for line in proc.stdout.splitlines() if line.startswith("tests.corpus.cheating_kernels"))
    assert "pass" not in row and "FAIL" in row, row


def test_a_routed_kernel_declares_its_numerics_in_either_process(tmp_path, monkeypatch):
    """``declare`` takes a routed convention's RoutedNumerics (or its product's Numerics), and the kernel is held to
    them whether it runs here or in a process of its own."""
    _kernel_module(tmp_path, monkeypatch, "routed_decl",
        "import gmm_kernels\nimport gmm_ref\n\n\n"
        "@gmm_kernels.declare('vllm.fused_moe', numerics=gmm_ref.RoutedNumerics(weight='bfloat16'))\n"
        "def fused(*args, **kwargs):\n    raise NotImplementedError\n\n\n"
        "@gmm_kernels.declare('vllm.fused_moe', numerics=gmm_ref.Numerics(accumulate='float32'))\n"
        "def product_only(*args, **kwargs):\n    raise NotImplementedError\n")
    for in_process in (True, False):
        assert resolve_kernel("routed_decl:fused", in_process=in_process).numerics == \
            gmm_ref.RoutedNumerics(weight="bfloat16")
        assert resolve_kernel("routed_decl:product_only", in_process=in_process).numerics == \
            gmm_ref.RoutedNumerics(product=gmm_ref.Numerics(accumulate="float32"))
    with pytest.raises(TypeError, match=r"numerics: expected a gmm_ref\.RoutedNumerics"):
        gmm_kernels.declare("vllm.fused_moe", numerics="float32")
