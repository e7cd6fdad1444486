"""property_tests: Hypothesis strategies and the kernel checks for grouped GEMM kernels.

``from property_tests import strategies as gst`` gives the public strategies;
``from property_tests import check_kernel`` checks any kernel from Python (``check_mode`` one mode of it).
Importing this package needs neither jax nor torch: the checks are loaded when first named.
"""

from typing import Any

__all__ = ["check_kernel", "check_mode", "strategies"]


def __getattr__(name: str) -> Any:
    # loaded on first use, so that the pytest plugin (a module of this package) imports no check machinery
    if name in ("check_kernel", "check_mode"):
        from property_tests.checks import check as checking

        return getattr(checking, name)
    raise AttributeError(f"module 'property_tests' has no attribute {name!r}")
