"""The property suite: every selected kernel x every mode, against the reference.

Run on your own kernel with
``pytest --pyargs property_tests --gmm-kernel=pkg.module:fn --gmm-convention=CONV``.
"""

from __future__ import annotations

import pytest

from property_tests.checking import MODES, Unsupported, check_mode


@pytest.mark.kernel
@pytest.mark.parametrize("mode", list(MODES))
def test_kernel_matches_reference(gmm_kernel, mode):
    why = gmm_kernel.available()
    if why is not None:
        pytest.skip(f"{gmm_kernel.name} unavailable: {why}")
    try:
        check_mode(gmm_kernel, mode)
    except Unsupported as exc:
        pytest.skip(f"{gmm_kernel.name} / {mode}: {exc}")
