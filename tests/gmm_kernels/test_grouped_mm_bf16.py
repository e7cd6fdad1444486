"""grouped-mm-bf16's Triton kernels (the built-in adapter ``grouped_mm_bf16``): a known upstream bug, pinned.

Its 3d x 2d kernel reads past ``mat_a`` for the columns past ``offs[-1]``: each column's program finds its group
by a binary search of ``offs`` that gives ``G`` for those columns, and loads ``mat_a[G]`` unmasked (0.1.7,
``_grouped_mm_3d2d_kernel``). Those columns are undefined in ``torch._grouped_mm``'s convention, so no output
comparison sees it; the interpreter's checked loads do (``gmm_kernels.runtimes.triton_bounds``), and the adapter
refuses such problems naming the bug (``GMM_BF16_3D2D_TAIL``). The first tests pin it: the day upstream masks the
load, they fail and say to drop the refusal.
"""

from __future__ import annotations

import pytest

pytest.importorskip("triton", reason="Triton is not installed (gmm-harness[triton]; the newest-JAX leg has none)")
pytest.importorskip("grouped_mm_bf16", reason="grouped-mm-bf16 is not installed (gmm-harness[grouped-mm-bf16])")

from gmm_kernels.runtimes import triton_interpreter

if not triton_interpreter.use_if_no_gpu():
    pytest.skip("torch sees a GPU here: this test runs grouped-mm-bf16's kernels on CPU tensors in Triton's "
                "interpreter", allow_module_level=True)


def test_3d2d_reads_past_mat_a_for_the_columns_past_the_last_group():
    import torch
    from grouped_mm_bf16.kernels import grouped_mm_3d2d
    from triton.runtime.errors import InterpreterError

    triton_interpreter.fix()
    a = torch.ones(1, 1, 32, dtype=torch.bfloat16)  # mat_a: one group, M = 1, K = 32
    b = torch.ones(32, 2, dtype=torch.bfloat16)
    out = torch.full((1, 2), -1.0, dtype=torch.bfloat16)
    caught = None
    try:
        grouped_mm_3d2d(a, b, torch.tensor([1], dtype=torch.int32), out)  # column 1 is past offs[-1]
    except InterpreterError as exc:
        caught = str(exc)
    if caught is None:
        pytest.fail("grouped_mm_bf16's 3d2d kernel no longer reads mat_a[G] (past mat_a) for a column past offs[-1]: "
                    "upstream fixed it; drop GMM_BF16_3D2D_TAIL (gmm_kernels/adapters/torch_grouped.py), its note in "
                    "docs/conventions.md and this test")
    assert "OutOfBounds" in caught and "past the end of A_ptr" in caught, caught


def test_the_adapter_refuses_ragged_n_with_a_tail_naming_the_bug_and_takes_the_rest():
    import ml_dtypes
    import numpy as np

    from gmm_kernels import get
    from gmm_ref.conventions import get as convention

    a = np.ones((1, 2, 32), ml_dtypes.bfloat16)  # 3d x 2d: mat_a [G, M, K], mat_b [K, N], offs over N
    b = np.ones((32, 16), ml_dtypes.bfloat16)
    adapter = get("grouped_mm_bf16[3d2d]")
    tail = convention("torch.grouped_mm").reference(a, b, np.array([8], np.int32)).problem
    assert "upstream bug, grouped_mm_bf16/kernels.py _grouped_mm_3d2d_kernel" in adapter.supports(tail)
    assert adapter.limits().tail is False  # the checks draw none
    full = convention("torch.grouped_mm").reference(a, b, np.array([16], np.int32))
    assert adapter.supports(full.problem) is None
    out = adapter.run(full.problem)
    assert (np.asarray(out).astype(np.float32) == 32).all()


def test_unavailable_where_the_interpreter_is_switched_off(monkeypatch):
    from gmm_kernels import get

    monkeypatch.setenv(triton_interpreter.ENV, "0")
    for name in ("grouped_mm_bf16", "grouped_mm_bf16[3d2d]"):
        assert "TRITON_INTERPRET is off" in get(name).available()
    monkeypatch.setenv(triton_interpreter.ENV, "1")
    assert get("grouped_mm_bf16").available() is None


def test_refuses_the_large_modes_full_size_cell_in_the_interpreter():
    """(its strided cells run: test_large_strided.py)"""
    from gmm_kernels import get

    assert "Triton's interpreter" in get("grouped_mm_bf16").large_refusal()
