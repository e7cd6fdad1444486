"""Who made a golden: the reference, or a kernel at a version on a platform, and the numerics it declared.

A golden made by a kernel is checked bit for bit against later runs of the same
kernel, version and platform; any other kernel is judged within the bound of
its declared numerics, which the manifest stores in full.
"""

from __future__ import annotations

import contextlib
import importlib
import platform as _platform
import sys
from importlib import metadata
from typing import Any

import gmm_ref
from gmm_kernels import KernelAdapter

__all__ = ["kernel_producer", "numerics_from_json", "numerics_json", "reference_producer"]


def _package_version(dist: str) -> str:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return "unknown"


def reference_producer() -> dict[str, str]:
    """The reference's producer record: exact float64 arithmetic, the same on every platform."""
    return {"name": "reference", "version": f"gmm-harness {_package_version('gmm-harness')}",
            "platform": "any"}


def _packages(kernel: KernelAdapter) -> tuple[str, ...]:
    """The distributions whose versions identify the kernel's build."""
    pkgs = list(kernel.requires) or [kernel.convention_facts.framework]
    fn = getattr(kernel, "fn", None)
    if fn is not None and getattr(fn, "__module__", None):
        pkgs.insert(0, fn.__module__.split(".")[0])
    if "jax" in pkgs:
        pkgs.insert(pkgs.index("jax") + 1, "jaxlib")
    return tuple(dict.fromkeys(pkgs))


def _device(framework: str) -> str:
    """The device the framework runs on. The framework is imported here (the kernel runs in it anyway): were it
    read only when already imported, the platform a golden is stored under would depend on whether anything had
    imported the framework yet, and a later check would not find the kernel's own golden."""
    with contextlib.suppress(Exception):
        if framework in ("jax", "torch"):
            importlib.import_module(framework)
        if framework == "jax":
            return sys.modules["jax"].devices()[0].device_kind
        if framework == "torch":  # the selected device (gmm_kernels.sandbox.device: --device), where torch kernels run
            from gmm_kernels.sandbox import device

            if not device.on_cuda():
                return "cpu"
            return sys.modules["torch"].cuda.get_device_name(device.torch_device())
    return ""


def kernel_producer(kernel: KernelAdapter, *, version: str | None = None) -> dict[str, str]:
    """A kernel's producer record: ``version`` (default: the kernel's declared ``version``, else
    the versions of gmm-harness and its packages) and OS-machine[/device]."""
    version = version or kernel.version
    if not version:
        version = "; ".join(f"{d} {_package_version(d)}" for d in ("gmm-harness", *_packages(kernel)))
    plat = getattr(kernel, "platform", None)
    if not plat:
        dev = _device(kernel.convention_facts.framework)
        plat = f"{sys.platform}-{_platform.machine()}" + (f"/{dev}" if dev else "")
    return {"name": str(kernel.name), "version": str(version), "platform": str(plat)}


def numerics_json(n: Any) -> dict[str, Any] | None:
    """Every field of the numerics the judge uses, as JSON (a routed kernel's ``gmm_ref.RoutedNumerics`` under
    ``routed_numerics``: its product's numerics as ``product``, beside ``weight`` and ``combine``)."""
    if n is None:
        return None
    if isinstance(n, gmm_ref.RoutedNumerics):
        return {"routed_numerics": n.to_json()}
    return n.to_json()


def numerics_from_json(d: dict[str, Any] | None) -> Any:
    if d is None:
        return None
    if set(d) == {"routed_numerics"}:
        r = d["routed_numerics"]
        return gmm_ref.RoutedNumerics(product=numerics_from_json(r["product"]), weight=r["weight"],
                                      combine=r["combine"])
    return gmm_ref.Numerics.from_json(d)
