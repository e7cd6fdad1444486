"""The property suite: every selected kernel x every mode, against the reference.

Run on your own kernel with
``pytest --pyargs property_tests --gmm-kernel=pkg.module:fn --gmm-convention=CONV``.
A mode in which an adapter declares a known upstream bug (``known_issues``)
is a strict xfail: the harness must keep catching that bug.
"""

from __future__ import annotations

import pytest

from property_tests.checking import MODES, Unsupported, check_mode


@pytest.mark.kernel
@pytest.mark.parametrize("mode", list(MODES))
def test_kernel_matches_reference(gmm_kernel, mode, request):
    why = gmm_kernel.available()
    if why is not None:
        pytest.skip(f"{gmm_kernel.name} unavailable: {why}")
    known = (getattr(gmm_kernel, "known_issues", None) or {}).get(mode)
    if known:
        request.applymarker(pytest.mark.xfail(strict=True, reason=f"known upstream bug: {known}"))
    try:
        check_mode(gmm_kernel, mode)
    except Unsupported as exc:
        if known:
            pytest.fail(f"{gmm_kernel.name} / {mode}: declared known issue, but the mode is unsupported: {exc}")
        pytest.skip(f"{gmm_kernel.name} / {mode}: {exc}")
