"""The opt-in ``large`` mode's full-size cell: an operand past 2**31 elements, within stated memory (its strided
cells, a few MiB each: ``test_large_strided.py``).

The full-size checks need about 16 GiB and a few minutes; they run with
``GMM_LARGE=1`` (and ``gmm-harness check --modes large``), and skip naming
that otherwise. The rest is checked at any size.
"""

from __future__ import annotations

import gc
import os

import numpy as np
import pytest

from gmm_kernels import FunctionAdapter, Status, get
from property_tests.checks import large
from property_tests.checks.check import check_kernel, check_mode
from tests.corpus.broken_kernels import ragged_dot_correct, ragged_dot_int32_row_offsets

FULL = os.environ.get("GMM_LARGE") == "1"
full_size = pytest.mark.skipif(not FULL, reason="the large mode's full-size cell needs about 16 GiB and minutes: set "
                                                 "GMM_LARGE=1")


def test_the_large_shape_puts_group_boundaries_around_the_2_31st_element():
    m, sizes = large._shape(128)
    ends = np.cumsum(sizes)
    starts = ends - sizes
    assert m * large.K > large.LIMIT and ends[-1] == m and m % 128 == 0
    straddles = [(s * large.K < large.LIMIT < e * large.K) for s, e in zip(starts, ends, strict=True)]
    assert straddles.count(True) == 1, "one group holds the 2**31-th element"
    assert starts[-1] * large.K > large.LIMIT, "the last group lies entirely past it"


def test_the_memory_it_needs_is_stated_and_too_little_is_a_named_skip(monkeypatch):
    monkeypatch.setattr(large, "available_memory", lambda: 2**30)
    r = check_mode(FunctionAdapter(ragged_dot_correct, "ragged_dot"), "large")
    assert r.status is Status.UNSUPPORTED
    assert "needs about" in r.detail and "1.0 GiB is available here" in r.detail and "bfloat16" in r.detail


def test_the_memory_cap_is_stated(monkeypatch):
    monkeypatch.setenv(large.MEMORY_ENV, "2")
    r = check_mode(FunctionAdapter(ragged_dot_correct, "ragged_dot"), "large")
    assert r.status is Status.UNSUPPORTED and "2.0 GiB is allowed here (GMM_LARGE_MEMORY)" in r.detail, r


def test_interpreted_kernels_and_other_families_say_why_not():
    r = check_mode(get("megablox.gmm"), "large")
    assert r.status is Status.UNSUPPORTED and "interpreted" in r.detail
    r = check_mode(get("megablox.tgmm"), "large")
    assert r.status is Status.UNSUPPORTED and "ragged-M" in r.detail


def test_the_large_mode_is_opt_in():
    report = check_kernel(ragged_dot_correct, convention="ragged_dot", modes=["exact"])
    assert "large" not in report.by_check()
    with pytest.raises(ValueError, match="unknown mode 'huge'"):
        check_kernel(ragged_dot_correct, convention="ragged_dot", modes=["huge"])


@full_size
def test_int32_offsets_are_caught_past_2_31_elements_and_nowhere_else():
    broken = FunctionAdapter(ragged_dot_int32_row_offsets, "ragged_dot")
    small = check_kernel(broken, modes=["exact", "normal"], raise_on_failure=False)
    assert small.ok, "below 2**31 elements the int32 offsets are right"
    r = check_mode(broken, "large")
    assert r.status is Status.FAILED, r
    assert "group 2" in str(r.error) or "group 3" in str(r.error)
    del r
    gc.collect()  # the broken kernel's outputs go before the twin's problem is built
    good = check_mode(FunctionAdapter(ragged_dot_correct, "ragged_dot"), "large")
    assert good.status is Status.PASSED, good


@full_size
@pytest.mark.parametrize("name", ["jax.ragged_dot", "torch.grouped_mm"])
def test_built_in_kernels_pass_the_large_mode(name):
    adapter = get(name)
    why = adapter.available()
    if why:
        pytest.skip(f"{name} unavailable: {why}")
    r = check_mode(adapter, "large")
    if "ran out of memory" in r.detail:  # XLA CPU lowers ragged_dot densely: G x M x K temporaries (34 GB)
        pytest.skip(f"{name}: {r.detail}")
    assert r.status is Status.PASSED and large.FULL not in r.detail, r  # the full-size cell ran
