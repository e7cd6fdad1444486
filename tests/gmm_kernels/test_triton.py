"""Triton kernels run here with no step of the user's: where torch sees no GPU the harness sets
``TRITON_INTERPRET=1`` before it imports a kernel's module, and fixes the seven defects of Triton's interpreter
(``gmm_kernels.runtimes.triton_interpreter``), each pinned below by a tiny kernel that shows it without the fix.

The kernels are tests/corpus/triton_gmm.py's: a right bfloat16 grouped matmul in ``torch._grouped_mm``'s
2d x 3d form and two broken copies. Skipped where Triton is not installed (the newest-JAX leg installs no torch).
"""

from __future__ import annotations

import importlib
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("triton", reason="Triton is not installed (gmm-harness[triton]; the newest-JAX leg has none)")

import gmm_ref
from gmm_kernels.runtimes import triton_interpreter
from property_tests.checks.check import check_kernel

if not triton_interpreter.use_if_no_gpu():
    pytest.skip("torch sees a GPU here: these tests check Triton's interpreter, used where there is none",
                allow_module_level=True)

ROOT = Path(__file__).resolve().parents[2]
KERNELS = Path(__file__).resolve().parents[1] / "corpus" / "triton_gmm.py"
SPEC = "tests.corpus.triton_gmm:"
EXAMPLES = 5  # each call costs 50-250 ms in the interpreter


@pytest.fixture
def unfixed():
    """The interpreter as Triton ships it, for one test; fixed again after it."""
    triton_interpreter.unfix()
    yield
    triton_interpreter.fix()


@pytest.mark.parametrize("defect", list(triton_interpreter.DEFECTS))
def test_each_interpreter_defect_shows_without_its_fix_and_not_with_it(defect, unfixed):
    from gmm_kernels.runtimes.triton_probes import PROBES

    assert not PROBES[defect](), f"{defect}: the unpatched interpreter computes what a GPU does; drop its fix?"
    assert defect in triton_interpreter.fix()
    assert PROBES[defect](), f"{defect}: still wrong with the harness's fix"


def test_an_unverified_triton_is_probed_and_its_defects_reported_as_the_interpreters(unfixed, monkeypatch):
    monkeypatch.setattr(triton_interpreter, "VERIFIED", ())
    with pytest.raises(triton_interpreter.InterpreterDefect, match="interpreter's fault, not the kernel's") as info:
        triton_interpreter.fix()
    assert all(name in str(info.value) for name in triton_interpreter.DEFECTS)
    assert triton_interpreter.defects() == list(triton_interpreter.DEFECTS)  # nothing was patched


def test_a_users_triton_kernel_is_checked_as_an_interpreted_one():
    from gmm_kernels import resolve_kernel

    for kernel in (resolve_kernel(SPEC + "grouped_mm"), resolve_kernel(SPEC + "grouped_mm", in_process=True)):
        assert kernel.interpreted() == "Triton's interpreter", kernel
        assert "runs interpreted here (Triton's interpreter)" in kernel.large_refusal()
    plain = resolve_kernel("tests.corpus.broken_kernels:grouped_mm_correct", convention="torch.grouped_mm")
    assert plain.interpreted() is None


@pytest.mark.parametrize("mode", ["exact", "normal", "poisoned", "all_empty"])
def test_a_right_triton_kernel_passes(mode):
    kernels = importlib.import_module(SPEC[:-1])  # TRITON_INTERPRET is set (above), as check_kernel would
    launches = kernels.LAUNCHES[0]  # counted in this process: the kernel is called here (in_process)
    report = check_kernel(SPEC + "grouped_mm", modes=[mode], max_examples=EXAMPLES, in_process=True)
    assert report.ok and report.results[0].examples > 0, report.summary()
    assert mode == "all_empty" or kernels.LAUNCHES[0] > launches, "no problem launched the kernel"


@pytest.mark.parametrize(("kernel", "group"), [
    ("grouped_mm_boundary_off_by_one", r"group \d+ \(rows \[\d+, \d+\)"),
    ("grouped_mm_no_k_tail", r"group \d+ \(rows \[\d+, \d+\)"),
])
def test_a_broken_triton_kernel_is_rejected_naming_the_group(kernel, group):
    with pytest.raises(gmm_ref.Mismatch, match=r"Wrong groups:\n  " + group):
        check_kernel(SPEC + kernel, modes=["exact", "many_groups"], max_examples=EXAMPLES)


def _without_interpreter(cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """``python ARGS`` in a fresh process whose environment leaves TRITON_INTERPRET unset (what a process that
    has not set it yet sees)."""
    env = {k: v for k, v in os.environ.items() if k != triton_interpreter.ENV}
    return subprocess.run([sys.executable, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=600,
                          check=False)


def _user_package(tmp_path: Path) -> dict[str, str]:
    (tmp_path / "userpkg").mkdir()
    (tmp_path / "userpkg" / "__init__.py").write_text("")
    (tmp_path / "userpkg" / "gmm.py").write_text(KERNELS.read_text())
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "GMM_")) and k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.pathsep.join([str(tmp_path), str(ROOT)])
    return env


def test_the_main_job_checks_a_triton_kernel_with_no_step_of_the_users(tmp_path):
    env = _user_package(tmp_path)  # no TRITON_INTERPRET: the harness sets it
    done = subprocess.run([sys.executable, "-m", "property_tests.cli.main", "check",
                           "--kernel", "userpkg.gmm:grouped_mm",
                           "--convention", "torch.grouped_mm", "--modes", "exact,normal", "--no-goldens",
                           "--max-examples", str(EXAMPLES)],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600, check=False)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "pass" in done.stdout and "FAIL" not in done.stdout, done.stdout


def test_the_plugin_runs_your_own_tests_triton_kernels_in_the_fixed_interpreter(tmp_path):
    """gmm_harness = true, no --gmm-kernel: the plugin's pytest_configure sets the variable before collection
    imports the kernel, and the interpreter is fixed once collection is done (the kernel uses tl.range)."""
    env = _user_package(tmp_path)
    (tmp_path / "pytest.ini").write_text("[pytest]\ngmm_harness = true\n")
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "test_mine.py").write_text(
        "import torch\n"
        "from userpkg.gmm import grouped_mm\n\n\n"  # imported at collection, after the plugin's pytest_configure
        "def test_it_matches_torch():\n"
        "    a = torch.randint(-3, 4, (40, 32)).bfloat16()  # small integers: every sum exact\n"
        "    b = torch.randint(-3, 4, (2, 32, 16)).bfloat16()\n"
        "    offs = torch.tensor([17, 40], dtype=torch.int32)\n"
        "    assert torch.equal(grouped_mm(a, b, offs), torch._grouped_mm(a, b, offs))\n")
    done = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "tests"], cwd=tmp_path,
                          env=env, capture_output=True, text=True, timeout=600, check=False)
    assert done.returncode == 0 and "1 passed" in done.stdout, done.stdout[-3000:] + done.stderr[-3000:]


def test_a_kernel_imported_before_the_interpreter_was_set_is_a_clear_error(tmp_path):
    env = _user_package(tmp_path)
    script = ("import userpkg.gmm\n"  # @triton.jit runs without TRITON_INTERPRET: compiled for a GPU
              "from property_tests.checks.check import check_kernel\n"
              "check_kernel(userpkg.gmm.grouped_mm, modes=['exact'], max_examples=1)\n")
    done = subprocess.run([sys.executable, "-c", script], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=600, check=False)
    assert done.returncode == 1
    assert "ValueError: userpkg.gmm: _grouped_mm_kernel, _touch_rows: a Triton kernel was compiled for a GPU" \
        in done.stderr
    assert "Set TRITON_INTERPRET=1" in done.stderr, done.stderr[-3000:]


def test_a_no_driver_error_is_explained_and_others_are_not():
    outer = ValueError("the kernel failed")
    outer.__cause__ = RuntimeError("0 active drivers ([]). There should only be one.")
    assert "TRITON_INTERPRET=1" in str(triton_interpreter.explain(outer))
    assert triton_interpreter.explain(RuntimeError("out of memory")) is None


@pytest.mark.parametrize("name", ["vllm.fused_moe", "unsloth.grouped_gemm"])
def test_a_wheel_kernel_run_directly_gets_the_interpreters_fixes(name, tmp_path):
    """A script that resolves a wheel's kernel and runs it (no available() first) computes what a GPU would: the
    launcher fixes the interpreter (bfloat16 dots and elementwise ops on raw bits were ~1e10 off without it)."""
    from gmm_kernels import resolve_kernel

    if resolve_kernel(name).available() is not None:
        pytest.skip(f"{name}: {resolve_kernel(name).available()}")
    script = (
        "import numpy as np, ml_dtypes, gmm_ref\n"
        "from gmm_kernels import resolve_kernel\n"
        "from gmm_kernels.runtimes import triton_interpreter\n"
        "triton_interpreter.use_if_no_gpu()\n"
        f"k = resolve_kernel({name!r})\n"
        "rng = np.random.default_rng(0)\n"
        "bf = ml_dtypes.bfloat16\n"
        "tokens = rng.integers(-2, 3, (6, 16)).astype(bf)\n"
        "experts = rng.integers(-2, 3, (4, 8, 16)).astype(bf)\n"
        "ids = np.array([[0, 1], [1, 2], [2, 3], [3, 0], [0, 2], [1, 3]], np.int32)\n"
        "w = rng.choice(np.array([-1.0, 1.0, 2.0], np.float32), ids.shape)\n"
        "r = gmm_ref.Routing(tokens, experts, ids, w, mul_routed_weight=True, out_dtype=bf)\n"
        "out = k.run(r)\n"
        "gmm_ref.assert_routed_matches(out, gmm_ref.routed_reference(r), numerics=k.numerics_for(r), kernel=k.name)\n"
        "print('OK')\n")
    done = _without_interpreter(tmp_path, "-c", script)
    assert done.returncode == 0 and "OK" in done.stdout, done.stdout[-3000:] + done.stderr[-3000:]


def test_every_routed_triton_kernel_says_it_runs_interpreted_before_available_sets_the_interpreter(tmp_path):
    """The scale cells and the default run's examples read interpreted(): off CUDA a Triton kernel's answer is
    the same whether or not available() has set TRITON_INTERPRET yet."""
    import torch

    if torch.cuda.is_available():
        pytest.skip("torch sees a GPU here: the kernels run compiled")
    script = ("from gmm_kernels import resolve_kernel\n"
              "for name in ('vllm.fused_moe', 'sglang.fused_moe', 'unsloth.grouped_gemm', 'torch.moe_experts'):\n"
              "    print(name, resolve_kernel(name).interpreted())\n")
    done = _without_interpreter(tmp_path, "-c", script)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.splitlines() == [f"{n} Triton's interpreter" for n in
                                        ("vllm.fused_moe", "sglang.fused_moe", "unsloth.grouped_gemm")] + [
        "torch.moe_experts None"], done.stdout


def test_triton_imported_before_the_interpreter_was_set_makes_a_wheel_kernel_na_with_the_reason(tmp_path):
    """A library imported earlier (ejkernel imports triton) made Triton's own @triton.jit helpers for a GPU: every
    interpreted kernel then raised "Cannot call @triton.jit'd outside of the scope of a kernel", a failure that was
    the process's, not the kernel's. The kernel is n/a with the reason instead."""
    script = ("import os, triton\n"  # imported with the interpreter off, as ejkernel's import does
              "os.environ['TRITON_INTERPRET'] = '1'\n"
              "from gmm_kernels import resolve_kernel\n"
              "print(resolve_kernel('vllm.fused_moe').available())\n")
    done = _without_interpreter(tmp_path, "-c", script)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "Triton was imported before TRITON_INTERPRET=1 was set" in done.stdout, done.stdout
    assert triton_interpreter.imported_too_early() is None  # this process set it first (the plugin does)


def test_the_golden_command_checks_interpreted_kernels_after_a_library_imported_triton(tmp_path):
    """`python -m golden check` runs every kernel in one process: ejkernel's (which imports triton) before vLLM's
    interpreted one. It sets the interpreter before any kernel library is imported; vLLM's case failed without."""
    done = _without_interpreter(tmp_path, "-m", "golden", "check", "--cases", "gmm-bf16-aligned*,moe-vllm-f32-t1*")
    out = done.stdout + done.stderr
    assert done.returncode == 0, out[-3000:]
    assert "PASSED      ejkernel.grouped_matmul[xla] :: gmm-bf16-aligned" in out, out[-3000:]
    assert "PASSED      vllm.fused_moe :: moe-vllm-f32-t1" in out, out[-3000:]


BLOCK_POINTERS = '''
import triton
import triton.language as tl


@triton.jit
def _copy(x, y, n, BLOCK: tl.constexpr):
    p = tl.make_block_ptr(x, (n,), (1,), (0,), (BLOCK,), (0,))
    q = tl.make_block_ptr(y, (n,), (1,), (0,), (BLOCK,), (0,))
    tl.store(q, tl.load(p, boundary_check=(0,)), boundary_check=(0,))


def grouped_mm(mat_a, mat_b, offs=None, bias=None, out_dtype=None):
    _copy[(1,)](mat_a, mat_a, 4, BLOCK=4)
    return None
'''


TENSOR_DESCRIPTORS = '''
import torch
import triton
import triton.language as tl


@triton.jit
def _copy(x, y, m, n, BM: tl.constexpr, BN: tl.constexpr):
    dx = tl.make_tensor_descriptor(x, shape=[m, n], strides=[n, 1], block_shape=[BM, BN])
    dy = tl.make_tensor_descriptor(y, shape=[m, n], strides=[n, 1], block_shape=[BM, BN])
    pid = tl.program_id(0)
    for j in range(0, n, BN):
        dy.store([pid * BM, j], dx.load([pid * BM, j]))


def grouped_mm(mat_a, mat_b, offs=None, bias=None, out_dtype=None):
    """torch._grouped_mm of mat_a copied through tensor descriptors (where they take it: 16-byte rows)."""
    a = mat_a.contiguous()
    if a.dim() == 2 and a.numel() and (a.shape[1] * a.element_size()) % 16 == 0:
        copy = torch.empty_like(a)
        _copy[(triton.cdiv(a.shape[0], 8),)](a, copy, a.shape[0], a.shape[1], BM=8, BN=8)
        a = copy
    return torch._grouped_mm(a, mat_b, offs=offs, out_dtype=out_dtype)
'''


def test_a_kernel_with_tensor_descriptors_runs_with_its_accesses_checked(tmp_path, monkeypatch):
    """A descriptor's load and store reach the checked accesses with keyword arguments (the interpreter's own call)."""
    from gmm_kernels import Scope

    (tmp_path / "td_kernel.py").write_text(TENSOR_DESCRIPTORS)
    monkeypatch.syspath_prepend(str(tmp_path))
    scope = Scope(zero_extents=("m",), dtypes=["float32->float32", "bfloat16->bfloat16"], families=["ragged_m"])
    report = check_kernel("td_kernel:grouped_mm", convention="torch.grouped_mm", modes=["exact"], max_examples=6,
                          scope=scope, raise_on_failure=False)
    assert report.ok, report.summary()
    assert all(r.examples > 0 for r in report), report.summary()


@pytest.mark.parametrize("in_process", [True, False])
def test_a_kernel_with_block_pointers_is_refused_by_name_where_triton_removed_them(tmp_path, monkeypatch, in_process):
    import triton.language as tl

    from gmm_kernels import resolve_kernel

    if "removed" not in (tl.make_block_ptr.__doc__ or ""):
        pytest.skip("this Triton has block pointers: the kernel runs")
    (tmp_path / "bp_kernel.py").write_text(BLOCK_POINTERS)
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(ValueError, match=r"bp_kernel: _copy uses block pointers \(tl.make_block_ptr, tl.advance\), "
                                         r"which Triton .* removed in favour of tl.make_tensor_descriptor"):
        resolve_kernel("bp_kernel:grouped_mm", convention="torch.grouped_mm", in_process=in_process)


def test_an_undeclared_triton_kernel_is_held_to_tf32_products_in_float32_and_a_declared_one_to_its_own():
    import numpy as np

    from gmm_kernels import Scope, resolve_kernel
    from tests.corpus import triton_gmm

    triton_interpreter.use_if_no_gpu()
    p = gmm_ref.Problem("ragged_m", np.ones((4, 16), np.float32), np.ones((1, 16, 8), np.float32), [4],
                        convention="torch.grouped_mm")
    undeclared = resolve_kernel(triton_gmm._launch, convention="torch.grouped_mm")
    assert undeclared.interpreted() and str(undeclared.numerics_for(p).multiply) == "bfloat16"
    exact = gmm_ref.Numerics(accumulate="float32")
    declared = resolve_kernel(triton_gmm._launch, convention="torch.grouped_mm", scope=Scope(numerics=exact))
    assert declared.numerics_for(p).multiply is None
