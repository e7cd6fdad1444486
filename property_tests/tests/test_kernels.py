"""The property suite: every selected kernel x every mode, against the reference (``property_tests.kernel_checks``,
imported here so that this repository's suite collects them).

Run on your own kernel with
``pytest --pyargs property_tests --gmm-kernel=pkg.module:fn --gmm-convention=CONV``: the plugin then collects
``property_tests.kernel_checks`` itself, and none of the harness's own test modules.
"""

from __future__ import annotations

from property_tests.kernel_checks import test_kernel_matches_reference

__all__ = ["test_kernel_matches_reference"]
