"""grouped-mm-bf16's Triton kernels (the built-in adapter ``grouped_mm_bf16``): what the adapter's checks cannot see.

Its 3d x 2d kernel reads past ``mat_a`` for the columns past ``offs[-1]``: each column's program finds its group
by a binary search of ``offs`` that gives ``G`` for those columns, and loads ``mat_a[G]`` unmasked (0.1.7,
``_grouped_mm_3d2d_kernel``). Those columns are undefined in ``torch._grouped_mm``'s convention, so no mode fails
on it and no known issue is declared; on a GPU it is an out-of-bounds read (docs/conventions.md). The first two
tests pin it (the second through the adapter, where mat_a's guard region makes those columns NaN): the day upstream
masks the load, they fail and say to drop the note.
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

    triton_interpreter.fix()
    full = torch.ones(2, 1, 32, dtype=torch.bfloat16)
    full[1] = 2  # the memory just past mat_a
    a = full[:1]  # mat_a: one group, M = 1, K = 32
    b = torch.ones(32, 2, dtype=torch.bfloat16)
    out = torch.full((1, 2), -1.0, dtype=torch.bfloat16)
    grouped_mm_3d2d(a, b, torch.tensor([1], dtype=torch.int32), out)
    assert out[0, 0].item() == 32  # column 0, in the group: right
    assert out[0, 1].item() == 64, (
        "grouped_mm_bf16's 3d2d kernel no longer reads mat_a[G] (past mat_a) for a column past offs[-1]: "
        f"upstream fixed it (column 1 = {out[0, 1].item()}); drop the note in docs/conventions.md and this test")


def test_the_guard_regions_see_that_read_in_the_columns_the_convention_leaves_undefined():
    """The adapter's runs give mat_a a NaN guard (gmm_kernels.sandbox.guards): the columns past offs[-1] come out NaN,
    read from past mat_a, and pass, being undefined; the defined columns are right. The day upstream masks the
    load, they stop being NaN and this fails: drop the note in docs/conventions.md with the test above."""
    import ml_dtypes
    import numpy as np

    import gmm_ref
    from gmm_kernels import get
    from gmm_ref.conventions import get as convention

    a = np.ones((1, 2, 32), ml_dtypes.bfloat16)  # 3d x 2d: mat_a [G, M, K], mat_b [K, N], offs over N
    b = np.ones((32, 16), ml_dtypes.bfloat16)
    ref = convention("torch.grouped_mm").reference(a, b, np.array([8], np.int32))
    adapter = get("grouped_mm_bf16[3d2d]")
    out = adapter.run(ref.problem).astype(np.float32)
    assert (out[:, :8] == 32).all()
    assert np.isnan(out[:, 8:]).all(), (
        f"grouped_mm_bf16's 3d2d kernel no longer reads past mat_a for the columns past offs[-1] ({out[:, 8:]}): "
        "upstream fixed it; drop the note in docs/conventions.md and the tests that pin it")
    gmm_ref.assert_matches_reference(out.astype(ml_dtypes.bfloat16), ref, numerics=adapter.numerics_for(ref.problem))


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
