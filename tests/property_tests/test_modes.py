"""A mode is one object (``property_tests.checks.modes.Mode``): its strategy options, what it checks and where it
applies travel with it, so that a new mode runs through ``check_mode`` without a change anywhere else."""

from __future__ import annotations

import pytest

from gmm_kernels import Status, resolve_kernel
from property_tests.checks.check import check_mode, coverage
from property_tests.checks.modes import ALL_MODES, MODES, Mode
from tests.corpus import broken_kernels as bk

pytest.importorskip("jax")

#: a mode a later issue could add: exact values, at most two groups
FEW_GROUPS = Mode("few_groups", "exact values in at most three groups", {"values": "exact", "max_groups": 3},
                  deterministic_repeat=True)


def _kernel(fn):
    return resolve_kernel(fn, convention="ragged_dot", option="kernel")


def test_a_new_mode_is_one_object():
    passed = check_mode(_kernel(bk.ragged_dot_correct), FEW_GROUPS, profile="gmm-ci", max_examples=8)
    assert passed.status is Status.PASSED and passed.check == "few_groups" and passed.examples > 0
    failed = check_mode(_kernel(bk.ragged_dot_boundary_off_by_one), FEW_GROUPS, profile="gmm-ci")
    assert failed.status is Status.FAILED and "group" in failed.detail
    refused = Mode("refused", "a mode that applies to no kernel", {"values": "exact"},
                   refuse=lambda adapter, family: f"{adapter.name} is not for this mode")
    result = check_mode(_kernel(bk.ragged_dot_correct), refused, profile="gmm-ci", max_examples=4)
    assert result.status is Status.UNSUPPORTED and "is not for this mode" in result.detail


def test_a_mode_says_what_it_checks_through_its_fields():
    assert [m for m, mode in MODES.items() if mode.deterministic_repeat] == ["exact"]
    assert [m for m, mode in MODES.items() if mode.gradient] == ["grad"]
    assert [m for m, mode in ALL_MODES.items() if not mode.draws_examples] == ["real_k", "strided", "scale", "large"]
    # modes whose problems differ from the exact mode's only in their values share its compiled shapes
    assert sorted(m for m, mode in MODES.items() if not mode.changes_shapes) == [
        "all_empty", "exact", "graph", "normal", "poisoned", "wide"]
    assert [m for m, mode in ALL_MODES.items() if mode.replays > 1] == ["graph"]
    assert FEW_GROUPS.changes_shapes


def test_a_mode_of_fixed_problems_draws_nothing_to_cover():
    result = coverage(_kernel(bk.ragged_dot_correct), "large")
    assert result.status is Status.UNSUPPORTED
    assert result.detail == "the large mode draws no examples (one fixed problem per cell, built for the kernel)"
    other = check_mode(_kernel(bk.ragged_dot_correct), "large", family="ragged_k")
    assert other.status is Status.UNSUPPORTED
    assert "built in the ragged_m family only (the token axis)" in other.detail, other.detail
    assert "jax arrays are dense (no strides)" in other.detail, other.detail


def test_the_package_names_its_public_checks_and_loads_them_when_named():
    # `from property_tests import check_kernel` is the documented entry point; importing the package alone (as the
    # pytest plugin does in every pytest run) must not load the checks, nor jax or torch
    import subprocess
    import sys

    code = ("import sys, property_tests\n"
            "print(sorted(m for m in ('property_tests.checks.check', 'jax', 'torch') if m in sys.modules))\n"
            "from property_tests import check_kernel, check_mode, strategies\n"
            "from property_tests.checks.check import check_kernel as k, check_mode as m\n"
            "print(check_kernel is k and check_mode is m, strategies.__name__)\n"
            "try:\n    property_tests.no_such_name\nexcept AttributeError as exc:\n    print(exc)\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == ["[]", "True property_tests.strategies",
                                        "module 'property_tests' has no attribute 'no_such_name'"], done.stdout
