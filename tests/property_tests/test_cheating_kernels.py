"""The verdict cannot be gamed: each cheating kernel of the corpus is rejected by the default run with a message
saying what it did, and each honest twin passes."""

from __future__ import annotations

import pytest

import gmm_ref
from gmm_kernels import Status
from property_tests.checks.check import check_kernel
from tests.corpus.cheating_kernels import CHEATS, GRAPH_CHEATS, HONEST, INTERMITTENT

pytest.importorskip("torch", reason="the cheating kernels are torch.grouped_mm kernels")

MODES = ["poisoned", "graph"]  # two modes keep each case a few seconds; the default run has them all


@pytest.mark.parametrize(("fn", "says"), [pytest.param(fn, says, id=fn.__name__) for fn, says in CHEATS.items()])
def test_cheat_is_rejected(fn, says):
    with pytest.raises(gmm_ref.Mismatch) as info:
        check_kernel(fn, convention="torch.grouped_mm", modes=MODES)
    assert says in str(info.value), str(info.value)


@pytest.mark.parametrize(("fn", "says"), [pytest.param(fn, says, id=fn.__name__) for fn, says in GRAPH_CHEATS.items()])
def test_cheat_keyed_by_address_is_rejected_every_time(fn, says):
    for seed in (None, 1, 2):  # caught whatever the examples, not by the allocator's luck
        (result,) = check_kernel(fn, convention="torch.grouped_mm", modes=["graph"], seed=seed,
                                 raise_on_failure=False)
        assert result.status is Status.FAILED, result
        assert says in result.detail, result.detail


@pytest.mark.parametrize("fn", HONEST, ids=lambda fn: fn.__name__)
def test_honest_twin_passes(fn):
    report = check_kernel(fn, convention="torch.grouped_mm", modes=MODES)
    assert [r.status for r in report] == [Status.PASSED] * len(MODES), report


@pytest.mark.parametrize("fn", INTERMITTENT, ids=lambda fn: fn.__name__)
def test_intermittent_kernel_is_reported_as_intermittent(fn):
    report = check_kernel(fn, convention="torch.grouped_mm", modes=["poisoned"], raise_on_failure=False)
    (result,) = report
    assert result.status is Status.INTERMITTENT, result
    assert not report.ok and report.failures == (result,)
    failed, made = map(int, result.detail.split(" calls of the same problem")[0].split()[1::2])
    assert 0 < failed < made, result.detail
    text = result.full_report()
    assert "Intermittent: the same problem failed" in text
    assert "until a call fails" in text and "raises the same report" not in text
    assert "stale group sizes" not in text


def test_intermittent_failure_raises_as_a_failure():
    with pytest.raises(gmm_ref.Mismatch, match=r"Intermittent: the same problem failed [0-9]+ of [0-9]+ calls"):
        check_kernel(INTERMITTENT[0], convention="torch.grouped_mm", modes=["poisoned"])
