"""The verdict cannot be gamed: each cheating kernel of the corpus is rejected by the default run with a message
saying what it did, and each honest twin passes."""

from __future__ import annotations

import pytest

import gmm_ref
from gmm_kernels import Status
from property_tests.checks.check import check_kernel
from tests.corpus.cheating_kernels import CHEATS, GRAPH_CHEATS, HONEST, INTERMITTENT, TAMPERING, forget_kept_results

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
        forget_kept_results()
        (result,) = check_kernel(fn, convention="torch.grouped_mm", modes=["graph"], seed=seed,
                                 raise_on_failure=False)
        # (checked again in new buffers some calls miss its cache: INTERMITTENT, whose report still says where)
        assert result.status.failure, result
        assert says in result.detail or result.status is Status.INTERMITTENT, result.detail


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


@pytest.mark.parametrize(("fn", "says"), [pytest.param(fn, says, id=fn.__name__) for fn, says in TAMPERING.items()])
def test_tampering_is_its_own_verdict_and_is_undone(fn, says):
    import numpy as np

    from gmm_ref.compare import Comparison

    originals = (gmm_ref.assert_matches_reference, np.allclose, np.testing.assert_allclose,
                 gmm_ref.compare.assert_matches_reference.__code__, Comparison.__dict__.get("ok"))
    (result,) = check_kernel(fn, convention="torch.grouped_mm", modes=["poisoned"], raise_on_failure=False)
    assert result.status is Status.TAMPERED, result
    assert "tampered with the harness during its call" in result.detail and says in result.full_report(), result
    # what it replaced was put back: the checks after it judge with the harness's own functions
    assert (gmm_ref.assert_matches_reference, np.allclose, np.testing.assert_allclose,
            gmm_ref.compare.assert_matches_reference.__code__, Comparison.__dict__.get("ok")) == originals
    assert [r.status for r in check_kernel(HONEST[0], convention="torch.grouped_mm", modes=["exact"])] == \
        [Status.PASSED]


def test_the_json_verdict_is_a_reward(tmp_path):
    """``--json``: each cell's ``verdict`` and the run's, in stable names (docs/threat-model.md)."""
    import json

    from property_tests.cli.document import run_verdict
    from property_tests.cli.main import main

    runs = {}
    for fn in ("patches_the_comparison", "grouped_mm_correct"):
        path = tmp_path / f"{fn}.json"
        module = "tests.corpus.broken_kernels" if fn == "grouped_mm_correct" else "tests.corpus.cheating_kernels"
        code = main(["check", "--kernel", f"{module}:{fn}", "--convention", "torch.grouped_mm", "--modes",
                     "poisoned", "--no-goldens", "--in-process", "--json", str(path)])
        doc = json.loads(path.read_text())
        runs[fn] = (code, doc["verdict"], [c["verdict"] for c in doc["cells"]])
    assert runs["patches_the_comparison"][:2] == (1, "tampered") and "tampered" in runs["patches_the_comparison"][2]
    assert runs["grouped_mm_correct"][:2] == (0, "pass") and set(runs["grouped_mm_correct"][2]) == {"pass"}
    assert run_verdict([{"verdict": "n/a"}]) == "nothing_checked"
    assert run_verdict([{"verdict": "pass"}, {"verdict": "intermittent"}, {"verdict": "n/a"}]) == "intermittent"
    assert run_verdict([{"verdict": "known_bug"}]) == "pass"
    assert {s.verdict for s in Status} == {"pass", "fail", "n/a", "known_bug", "intermittent", "tampered"}
