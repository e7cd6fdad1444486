"""The property suite: every selected kernel x every mode, against the reference.

Run on your own kernel with
``pytest --pyargs property_tests --gmm-kernel=pkg.module:fn --gmm-convention=CONV``.
A mode in which an adapter declares a known upstream bug (``known_issues``)
is a strict xfail: the harness must keep catching that bug.
"""

from __future__ import annotations

import pytest

from gmm_kernels import Status
from property_tests.checking import check_mode
from property_tests.failures import raise_failure
from property_tests.modes import MODES
from property_tests.table import examples_in_default_run


@pytest.mark.kernel
@pytest.mark.parametrize("mode", list(MODES))
def test_kernel_matches_reference(gmm_kernel, mode, request, gmm_check_run):
    why = gmm_kernel.available()
    if why is not None:
        pytest.skip(f"{gmm_kernel.name} unavailable: {why}")
    known = gmm_kernel.known_issue(mode)
    if known:
        request.applymarker(pytest.mark.xfail(strict=True, reason=f"known upstream bug: {known}"))
    # the default run (no --gmm-kernel): a routed kernel that runs interpreted gets few examples a mode
    named = bool(request.config.getoption("--gmm-kernel"))
    result = check_mode(gmm_kernel, mode, run=gmm_check_run,
                        max_examples=None if named else examples_in_default_run(gmm_kernel, None))
    if result.status is Status.UNSUPPORTED:
        if known:
            pytest.fail(f"{gmm_kernel.name} / {mode}: declared known issue, but the mode is unsupported: "
                        f"{result.detail}")
        pytest.skip(f"{gmm_kernel.name} / {mode}: {result.detail}")
    if result.status is Status.KNOWN_BUG:
        result.raise_for_status()  # the strict xfail: the bug is still caught
    raise_failure(result)
