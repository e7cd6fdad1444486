"""torch's CPU ``_grouped_mm`` ragged-K NaN leak (``gmm_kernels.known_issues.TORCH_CPU_RAGGED_K_LEAK``).

In bfloat16, where oneDNN runs its AMX matmul, a ragged-K group reads the lhs columns past its K range and
multiplies them by 0: a NaN/Inf there reaches the output. The built-in ``torch.grouped_mm`` adapter declares
the bug for the poisoned mode where a probe sees it, so the verdict is the same on every processor: a known
bug where the leak shows, a pass where it does not. These tests pin the reproducer (the day torch fixes it,
the suite says so), tie the known issue to the probe, show both verdicts on this machine by lowering
oneDNN's instruction set in a subprocess, and check that a user's kernel calling ``torch._grouped_mm`` is
told about the bug when it fails the same way (and one that does not call it is not).
"""

from __future__ import annotations

import importlib.util
import json
import os
import platform
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import gmm_kernels
from gmm_kernels import Status, declare, resolve_kernel
from gmm_kernels.known_issues import TORCH_CPU_RAGGED_K_LEAK, matching, torch_cpu_ragged_k_leak
from gmm_kernels.scope import KnownIssue
from property_tests.checks.check import check_mode

ROOT = Path(__file__).resolve().parents[2]
HAVE_TORCH = importlib.util.find_spec("torch") is not None
needs_torch = pytest.mark.skipif(not HAVE_TORCH, reason="torch is not installed: there is no CPU _grouped_mm to probe")


def _cpu_flags() -> set[str]:
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return set()
    line = next((ln for ln in text.splitlines() if ln.startswith("flags")), "")
    return set(line.partition(":")[2].split())


def _onednn_may_use_amx(env: dict[str, str] | os._Environ = os.environ) -> bool:
    """Whether oneDNN runs its AMX bfloat16 matmul here: the CPU has ``amx_bf16`` and ``ONEDNN_MAX_CPU_ISA``
    (read by oneDNN when it first runs) does not cap it below AMX."""
    isa = env.get("ONEDNN_MAX_CPU_ISA", "").strip().upper()
    return "amx_bf16" in _cpu_flags() and (not isa or isa in ("ALL", "DEFAULT") or "AMX" in isa)


def _x86() -> bool:
    return platform.machine().lower() in ("x86_64", "amd64")


def _reproducer() -> int:
    """The documented minimal reproducer: how many of its 4096 outputs are NaN (0 when right)."""
    import torch

    a = torch.ones(64, 64, dtype=torch.bfloat16)
    a[:, 3:] = float("nan")  # the K padding past offs[-1]: no group reads it
    out = torch._grouped_mm(a, torch.ones(64, 64, dtype=torch.bfloat16), offs=torch.tensor([3], dtype=torch.int32))
    return int(torch.isnan(out).sum())


def _torch_in_known_range() -> bool:
    from importlib import metadata

    from packaging.specifiers import SpecifierSet

    return metadata.version("torch") in SpecifierSet(TORCH_CPU_RAGGED_K_LEAK.versions["torch"])


# ------------------------------------------------------------------------------------------- the pin
@needs_torch
def test_the_minimal_reproducer_leaks_exactly_where_onednn_runs_amx():
    """On an AMX CPU the reproducer leaks (the day it does not, torch fixed it: drop the known issue); on an x86
    CPU without AMX bfloat16, or with oneDNN capped below it, it does not."""
    import torch

    leaked = _reproducer()
    versions = TORCH_CPU_RAGGED_K_LEAK.versions["torch"]
    if _onednn_may_use_amx():
        assert leaked == 2048, (
            f"torch {torch.__version__} fixed its CPU _grouped_mm ragged-K NaN leak on this AMX CPU ({leaked} NaN "
            f"of 4096, was 2048): drop the known issue TORCH_CPU_RAGGED_K_LEAK (gmm_kernels/known_issues.py, "
            f"torch.grouped_mm's known_issues) or bound its versions ({versions}) below {torch.__version__}, "
            "and update docs/conventions.md")
        assert _torch_in_known_range(), (
            f"torch {torch.__version__} still leaks (2048 NaN of 4096) but TORCH_CPU_RAGGED_K_LEAK is known only on "
            f"torch {versions}: extend its versions to cover it (gmm_kernels/known_issues.py)")
    elif _x86():
        assert leaked == 0, (
            f"torch {torch.__version__}'s CPU _grouped_mm leaks ({leaked} NaN of 4096) on an x86 CPU where oneDNN "
            f"does not run AMX bfloat16 (ONEDNN_MAX_CPU_ISA={os.environ.get('ONEDNN_MAX_CPU_ISA', '')!r}, "
            "amx_bf16 not both there): the probe still declares it, but the characterization in "
            "docs/conventions.md and the known issue's text are wrong")
    else:
        pytest.skip(f"the leak is characterized on x86 (oneDNN's AMX matmul), not on {platform.machine()}: here the "
                    f"probe decides ({'leaks' if leaked else 'no leak'})")


@needs_torch
def test_the_known_issue_applies_exactly_where_the_probe_sees_the_leak():
    adapter = gmm_kernels.get("torch.grouped_mm")
    leaks = bool(torch_cpu_ragged_k_leak())
    assert leaks == (_reproducer() > 0)  # the probe runs the documented reproducer
    assert TORCH_CPU_RAGGED_K_LEAK in adapter.known_issues
    assert TORCH_CPU_RAGGED_K_LEAK.applies() == (leaks and _torch_in_known_range())
    declared = adapter.known_issue("poisoned")
    assert (declared is not None) == TORCH_CPU_RAGGED_K_LEAK.applies()
    if declared is not None:
        assert declared == TORCH_CPU_RAGGED_K_LEAK.describe() and "_grouped_mm" in declared
    assert all(adapter.known_issue(m) is None for m in ("exact", "normal", "wide", "all_empty", "grad"))
    if _x86():
        assert leaks == _onednn_may_use_amx(), f"probe: {torch_cpu_ragged_k_leak()}, amx_bf16 / ISA: " \
            f"{'amx_bf16' in _cpu_flags()} / {os.environ.get('ONEDNN_MAX_CPU_ISA')!r}"


def test_a_known_issue_condition_decides_where_it_applies():
    calls = []

    def seen() -> bool:
        calls.append(1)
        return True

    assert KnownIssue(("poisoned",), "x", condition=seen).applies() and calls
    assert not KnownIssue(("poisoned",), "x", condition=lambda: False).applies()
    calls.clear()
    assert not KnownIssue(("poisoned",), "x", {"numpy": "<1"}, condition=seen).applies()
    assert not calls  # versions first: no probe where the versions already rule it out
    with pytest.raises(TypeError, match="condition: expected a function"):
        KnownIssue(("poisoned",), "x", condition=True)  # type: ignore[arg-type]


# -------------------------------------------------------------- both verdicts, one machine
_VERDICT = """
import json, sys
import gmm_kernels
from gmm_kernels.known_issues import torch_cpu_ragged_k_leak
from property_tests.checks.check import check_mode
adapter = gmm_kernels.get("torch.grouped_mm")
r = check_mode(adapter, "poisoned", family="ragged_k", profile="gmm-ci")
print(json.dumps({"status": r.status.name, "detail": r.detail, "probe": list(torch_cpu_ragged_k_leak()),
                  "known": adapter.known_issue("poisoned")}))
"""


@needs_torch
@pytest.mark.parametrize("isa", ["AVX2", "AVX512_CORE_BF16", None], ids=["AVX2", "AVX512_CORE_BF16", "this-CPU"])
def test_the_poisoned_ragged_k_verdict_follows_the_processor(isa):
    """Below AMX the adapter's poisoned ragged-K cell passes with no known issue applied; with AMX it is the
    known bug, the mismatch still caught."""
    env = {**os.environ, "JAX_PLATFORMS": "cpu"}
    if isa is not None:
        env["ONEDNN_MAX_CPU_ISA"] = isa
    if isa is None and not _x86():
        pytest.skip(f"the leak is characterized on x86, not on {platform.machine()}")
    proc = subprocess.run([sys.executable, "-c", _VERDICT], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=600, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    if _onednn_may_use_amx(env) and _torch_in_known_range():
        assert got["status"] == "KNOWN_BUG", got
        assert got["probe"] == ["bfloat16"] and got["known"] and "_grouped_mm" in got["known"]
        assert "(caught: group" in got["detail"] and "wrong" in got["detail"], got
    else:
        assert got == {"status": "PASSED", "detail": "", "probe": [], "known": None}, got


def test_no_torch_no_probe_no_known_issue():
    """A test leg without torch: the probe says nothing leaks, nothing applies, and torch is never imported."""
    code = ("import sys; sys.modules['torch'] = None\n"  # an import of torch now fails, as where it is not installed
            "import gmm_kernels\n"
            "from gmm_kernels.known_issues import TORCH_CPU_RAGGED_K_LEAK, torch_cpu_ragged_k_leak\n"
            "assert torch_cpu_ragged_k_leak() == ()\n"
            "assert not TORCH_CPU_RAGGED_K_LEAK.condition()\n"
            "assert gmm_kernels.get('torch.grouped_mm').known_issue('poisoned') is None\n"
            "assert sys.modules['torch'] is None\n"
            "print('ok')\n")
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300,
                          check=False)
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", proc.stderr[-3000:]


# ------------------------------------------------------------------------------------ user kernels
@declare("torch.grouped_mm", families=["ragged_k"], dtypes=["bfloat16->bfloat16"], zero_extents=["m"])
def my_gmm(mat_a, mat_b, offs=None, bias=None, out_dtype=None):
    """A user's kernel in torch.grouped_mm's convention that calls torch's own."""
    import torch

    return torch._grouped_mm(mat_a, mat_b, offs=offs, out_dtype=out_dtype)


@declare("torch.grouped_mm", families=["ragged_k"], dtypes=["bfloat16->bfloat16"], zero_extents=["m"])
def my_masking_gmm(mat_a, mat_b, offs=None, bias=None, out_dtype=None):
    """Ragged K by masking: every group multiplies the whole K range by a 0/1 mask, and 0 * NaN = NaN. Its
    own NaN leak, with the same signature, in a kernel that never calls _grouped_mm."""
    import torch

    a, b = mat_a.float(), mat_b.float()
    k = torch.arange(a.shape[1])
    outs, start = [], 0
    for end in offs.tolist():
        mask = ((k >= start) & (k < end)).float()
        outs.append((a * mask) @ (b * mask[:, None]))
        start = end
    return torch.stack(outs).to(mat_a.dtype)


@needs_torch
def test_a_user_kernel_calling_torch_grouped_mm_cites_the_leak_where_it_shows():
    adapter = resolve_kernel(my_gmm)
    result = check_mode(adapter, "poisoned", family="ragged_k", profile="gmm-ci")
    if not TORCH_CPU_RAGGED_K_LEAK.condition():
        assert result.status is Status.PASSED, result.detail  # no leak here: the same kernel is right
        return
    assert result.status is Status.FAILED, result  # the user's kernel: a failure, with the citation
    assert "matches a known upstream bug of aten._grouped_mm" in result.detail, result.detail
    notes = "\n".join(getattr(result.error, "__notes__", []))
    assert TORCH_CPU_RAGGED_K_LEAK.describe() in notes, notes[-2000:]
    assert result.error.kind == "nonfinite"


@needs_torch
def test_a_user_kernel_that_does_not_call_grouped_mm_is_not_cited():
    adapter = resolve_kernel(my_masking_gmm)
    result = check_mode(adapter, "poisoned", family="ragged_k", profile="gmm-ci")
    assert result.status is Status.FAILED and result.error.kind == "nonfinite", result
    assert "upstream" not in result.detail, result.detail
    assert "_grouped_mm" not in "\n".join(getattr(result.error, "__notes__", []))


@needs_torch
def test_a_torch_kernel_reports_the_operators_it_calls():
    import gmm_ref

    lhs = np.ones((32, 8), np.float32)
    p = gmm_ref.Problem("ragged_k", lhs, np.ones((8, 16), np.float32), np.array([3, 5]),
                        convention="torch.grouped_mm")
    assert "aten._grouped_mm" in resolve_kernel(my_gmm).primitives(p)
    assert "aten._grouped_mm" not in resolve_kernel(my_masking_gmm).primitives(p)
    assert "aten._grouped_mm" in gmm_kernels.get("torch.grouped_mm").primitives(p)
    # a declared known issue is never matched again (the adapter's own cell says it)
    err = gmm_ref.Mismatch("x", kind="nonfinite")
    assert matching(gmm_kernels.get("torch.grouped_mm"), "poisoned", err, p) == []
    assert matching(resolve_kernel(my_gmm), "poisoned", err, p) == (
        [TORCH_CPU_RAGGED_K_LEAK] if TORCH_CPU_RAGGED_K_LEAK.condition() else [])
    assert matching(resolve_kernel(my_gmm), "exact", err, p) == []
