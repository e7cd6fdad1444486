"""vLLM's batched experts Triton kernel (the built-in adapter ``vllm.batched_moe``), read from vLLM's wheel.

The loader's failures need no wheel (small stand-in wheels are written here); the kernel's checks need vLLM
0.33.0's wheel (``scripts/setup.sh`` downloads it; the skip reason says the command) and run it in Triton's
interpreter. The broken twin is the wheel's own kernel with one line changed (a stand-in wheel holding the edited
source): it must be rejected, naming the groups it gets wrong.
"""

from __future__ import annotations

import zipfile

import numpy as np
import pytest

pytest.importorskip("torch", reason="vLLM's kernel takes torch tensors (gmm-harness[torch])")
pytest.importorskip("triton", reason="Triton is not installed (gmm-harness[triton]; the newest-JAX leg has none)")

import gmm_ref
from gmm_kernels import Status, get
from gmm_kernels.adapters import vllm as adapter
from gmm_kernels.runtimes import triton_interpreter
from property_tests.checks.check import check_kernel

if not triton_interpreter.use_if_no_gpu():
    pytest.skip("torch sees a GPU here (or TRITON_INTERPRET is off): these tests run vLLM's kernel on CPU tensors "
                "in Triton's interpreter", allow_module_level=True)

WHEEL = adapter.find_wheel()
needs_wheel = pytest.mark.skipif(WHEEL is None, reason=f"no vLLM {adapter.WHEEL_VERSION} wheel here; get it with: "
                                                      f"{adapter.DOWNLOAD}")


def _wheel(path, members):
    with zipfile.ZipFile(path, "w") as z:
        for name, text in members.items():
            z.writestr(name, text)
    return str(path)


def _members(**edits):
    """The wheel's two source files, each with ``old -> new`` replacements (every one must apply)."""
    with zipfile.ZipFile(WHEEL) as z:
        texts = {m: z.read(m).decode() for m in (adapter.KERNEL_MEMBER, adapter.UTILS_MEMBER)}
    for old, new in edits.values():
        assert texts[adapter.KERNEL_MEMBER].count(old) == 1, old
        texts[adapter.KERNEL_MEMBER] = texts[adapter.KERNEL_MEMBER].replace(old, new)
    return texts


UTILS_OK = "import torch\n\ndef normalize_batched_scales_shape(scales, num_experts):\n    return scales\n"
KERNEL_STUB = ("import triton\n\n@triton.jit\ndef moe_mmk(x):\n    pass\n\n@triton.jit\ndef expert_triton_kernel(x):\n"
               "    pass\n\ndef invoke_moe_batched_triton_kernel(A):\n    return {body}\n\n"
               "@triton.jit\ndef batched_triton_kernel(x):\n    pass\n")


@pytest.mark.parametrize(("members", "text"), [
    ({}, f"has no {adapter.UTILS_MEMBER}"),
    ({adapter.UTILS_MEMBER: UTILS_OK}, f"has no {adapter.KERNEL_MEMBER}"),
    ({adapter.UTILS_MEMBER: UTILS_OK, adapter.KERNEL_MEMBER: "def moe_mmk():\n    pass\n"},
     "has no top-level function expert_triton_kernel, batched_triton_kernel, invoke_moe_batched_triton_kernel"),
    ({adapter.UTILS_MEMBER: UTILS_OK, adapter.KERNEL_MEMBER: KERNEL_STUB.format(body="current_platform")},
     "read names this loader does not provide: current_platform"),
    ({adapter.UTILS_MEMBER: "def normalize_batched_scales_shape(:\n", adapter.KERNEL_MEMBER: ""},
     "utils.py does not parse here"),
])
def test_a_wheel_of_another_layout_is_named(tmp_path, members, text):
    wheel = _wheel(tmp_path / "vllm-0.33.0-py3-none-any.whl", members)
    with pytest.raises(adapter.WheelLayoutError) as info:
        adapter.load_kernel(wheel)
    assert text in str(info.value) and wheel in str(info.value)


def test_a_file_that_is_no_wheel_is_named(tmp_path):
    bad = tmp_path / "vllm-0.33.0-x.whl"
    bad.write_text("not a zip")
    with pytest.raises(adapter.WheelLayoutError, match="is not a readable wheel"):
        adapter.load_kernel(str(bad))


def test_the_loader_runs_only_the_named_functions_keeping_their_lines(tmp_path):
    text = KERNEL_STUB.format(body="A") + "\nraise SystemExit('the rest of the module is not run')\n"
    wheel = _wheel(tmp_path / "w.whl", {adapter.UTILS_MEMBER: UTILS_OK, adapter.KERNEL_MEMBER: text})
    module = adapter.load_kernel(wheel)
    assert module.invoke_moe_batched_triton_kernel(3) == 3
    code = module.invoke_moe_batched_triton_kernel.__code__
    assert code.co_filename == f"{wheel}/{adapter.KERNEL_MEMBER}" and code.co_firstlineno == 11


def test_unavailable_without_a_wheel_says_how_to_get_one(tmp_path, monkeypatch):
    monkeypatch.setenv(adapter.WHEEL_ENV, str(tmp_path))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    reason = get("vllm.batched_moe").available()
    assert "no vLLM 0.33.0 wheel found" in reason and "pip download --no-deps" in reason


def test_unavailable_where_the_interpreter_is_switched_off(monkeypatch):
    monkeypatch.setenv(triton_interpreter.ENV, "0")
    assert "TRITON_INTERPRET is off" in get("vllm.batched_moe").available()


def test_refuses_the_large_modes_full_size_cell_in_the_interpreter():
    """(its strided cells run: test_large_strided.py)"""
    assert "Triton's interpreter" in get("vllm.batched_moe").large_refusal()


@needs_wheel
def test_the_wheels_kernel_is_interpreted_and_agrees_with_the_reference():
    from triton.runtime.interpreter import InterpretedFunction

    triton_interpreter.fix()
    module = adapter.load_kernel(WHEEL)
    assert isinstance(module.batched_triton_kernel, InterpretedFunction)
    kernel = get("vllm.batched_moe")
    assert kernel.available() is None
    rng = np.random.default_rng(0)
    for dtype, (e, m, k, n), counts in (("bfloat16", (3, 40, 144, 48), [5, 0, 40]),
                                        ("float16", (2, 17, 16, 32), [17, 16]),
                                        ("float32", (1, 1, 272, 16), [1])):
        dt = np.dtype(dtype) if dtype != "bfloat16" else gmm_ref.conventions.vllm.BF16
        a = rng.standard_normal((e, m, k)).astype(dt)
        b = rng.standard_normal((e, n, k)).astype(dt)
        c = np.full((e, m, n), 7, dt)
        problem = gmm_ref.conventions.get("vllm.batched_moe").parse(a, b, c, np.array(counts, np.int32))
        out = kernel.run(problem)
        gmm_ref.assert_matches_reference(out, kernel.reference_for(problem), numerics=kernel.numerics_for(problem))
        for g, count in enumerate(counts):
            assert (np.asarray(out[g, count:], np.float32) == 7).all(), "rows past the count keep C"


BROKEN = {
    # every expert's A read from expert 0's matrix
    "a_expert_stride": ("a_ptr = a_ptr + expert_id * stride_ae + cta_m_start * stride_am",
                        "a_ptr = a_ptr + cta_m_start * stride_am"),
    # every expert computes all max_tokens rows: the rows past its count are written
    "ignores_expert_num_tokens": ("e_num_tokens = tl.load(expert_num_tokens + expert_id)",
                                  "e_num_tokens = max_num_tokens + 0 * tl.load(expert_num_tokens + expert_id)"),
}


@needs_wheel
@pytest.mark.parametrize("bug", sorted(BROKEN))
def test_the_wheels_kernel_with_one_line_broken_is_rejected(bug, tmp_path, monkeypatch):
    broken = _wheel(tmp_path / f"vllm-{bug}.whl", _members(bug=BROKEN[bug]))
    monkeypatch.setenv(adapter.WHEEL_ENV, broken)
    with pytest.raises(gmm_ref.Mismatch) as info:
        check_kernel("vllm.batched_moe", modes=["normal"], profile="gmm-ci")
    message = str(info.value)
    assert "Wrong groups:" in message and "group " in message.split("Wrong groups:")[1]
    assert "Problem(" in "\n".join(getattr(info.value, "__notes__", [])), "the failure carries a reproducer"


@needs_wheel
def test_the_unbroken_wheel_passes(monkeypatch):
    monkeypatch.setenv(adapter.WHEEL_ENV, WHEEL)
    report = check_kernel("vllm.batched_moe", modes=["normal"], profile="gmm-ci")
    assert [r.status for r in report] == [Status.PASSED]


def test_the_set_up_downloads_the_version_the_adapter_reads():
    from pathlib import Path

    setup = (Path(__file__).resolve().parents[2] / "scripts" / "setup.sh").read_text()
    assert f"VLLM_VERSION={adapter.WHEEL_VERSION}\n" in setup
