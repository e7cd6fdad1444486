"""The harness checks itself: each deliberately broken kernel is rejected, each correct twin passes.

Every rejection must name the wrong group (or the tail) and carry a reproducer.
"""

from __future__ import annotations

import pytest

import gmm_ref
from gmm_kernels import Status
from property_tests.checks.check import check_kernel
from tests.corpus.broken_kernels import BROKEN, BROKEN_GRADIENTS, CORRECT

CASES = [pytest.param(conv, fn, id=f"{fn.__name__}-{conv}") for conv, fns in BROKEN.items() for fn in fns]


def _framework(convention):
    """The package a convention's kernels take tensors of (its ``framework``)."""
    return gmm_ref.conventions.get(convention).framework


@pytest.mark.parametrize(("convention", "fn"), CASES)
def test_broken_kernel_is_rejected(convention, fn):
    pytest.importorskip(_framework(convention), reason=f"{convention} kernels take its tensors")
    with pytest.raises(gmm_ref.Mismatch) as info:
        check_kernel(fn, convention=convention, profile="gmm-ci")  # the bar: the gmm-ci profile rejects it
    message = str(info.value)
    if info.value.kind == "raised":  # it names the problem that provoked it, group sizes included
        assert "[on " in message and "group_sizes=[" in message.split("[on ")[1]
    elif info.value.kind != "shape":
        assert "Wrong groups:" in message
        assert "group " in message.split("Wrong groups:")[1] or "tail" in message.split("Wrong groups:")[1]
    notes = "\n".join(getattr(info.value, "__notes__", []))
    assert "Problem(" in notes, "the failure carries a reproducer"


@pytest.mark.parametrize("convention", sorted(CORRECT))
def test_correct_twin_passes(convention):
    pytest.importorskip(_framework(convention), reason=f"{convention} kernels take its tensors")
    report = check_kernel(CORRECT[convention], convention=convention, profile="gmm-ci")
    assert any(r.status is Status.PASSED for r in report), report
    assert all(r.status in (Status.PASSED, Status.UNSUPPORTED) for r in report), report


GRAD_CASES = [pytest.param(conv, fn, id=fn.__name__) for conv, fns in BROKEN_GRADIENTS.items() for fn in fns]


@pytest.mark.parametrize(("convention", "fn"), GRAD_CASES)
def test_broken_gradient_is_rejected(convention, fn):
    with pytest.raises(gmm_ref.Mismatch) as info:
        check_kernel(fn, convention=convention, modes=["grad"], profile="gmm-ci")
    message = str(info.value)
    assert "d/drhs" in message.splitlines()[0]
    assert "Wrong groups:" in message and "group " in message.split("Wrong groups:")[1]


def test_forward_of_the_broken_gradient_kernel_passes():
    (fn,) = BROKEN_GRADIENTS["ragged_dot"]
    report = check_kernel(fn, convention="ragged_dot", modes=["exact", "normal"], profile="gmm-ci")
    assert {m: r.status for m, r in report.by_check().items()} == {"exact": Status.PASSED, "normal": Status.PASSED}
    assert report.ok and report.count(Status.PASSED) == 2 and not report.failures
