"""Turn ``--gmm-kernel`` specs (built-in names or ``pkg.module:fn``) into adapters."""

from __future__ import annotations

import importlib
from collections.abc import Sequence
from typing import Any

__all__ = ["load_function", "resolve_kernels"]


def load_function(spec: str, *, require_callable: bool = True) -> Any:
    """Import ``pkg.module:attr.path`` and return the object."""
    module_name, _, attr = spec.partition(":")
    if not module_name or not attr:
        raise ValueError(f"--gmm-kernel: expected pkg.module:fn, got {spec!r}")
    try:
        obj: Any = importlib.import_module(module_name)
    except ImportError as exc:
        raise ImportError(f"--gmm-kernel {spec!r}: cannot import {module_name!r}: {exc}") from exc
    for part in attr.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise ValueError(f"--gmm-kernel {spec!r}: {module_name!r} has no attribute {attr!r}") from None
    if require_callable and not callable(obj):
        raise TypeError(f"--gmm-kernel {spec!r}: {attr!r} is not callable")
    return obj


def resolve_kernels(
    specs: Sequence[str], *, convention: str | None = None, tiling: tuple[int, int, int] | None = None
) -> list[Any]:
    """Adapters for ``specs``; every built-in adapter when ``specs`` is empty."""
    import gmm_kernels

    if not specs:
        return gmm_kernels.registry()
    builtin = {a.name: a for a in gmm_kernels.registry()}
    out = []
    for spec in specs:
        if spec in builtin:
            adapter = builtin[spec]
        elif ":" in spec:
            if convention is None:
                raise ValueError(
                    f"--gmm-convention: required with --gmm-kernel {spec!r}; "
                    f"expected one of {gmm_kernels.CONVENTIONS}"
                )
            adapter = gmm_kernels.wrap(load_function(spec), convention, name=spec)
        else:
            raise ValueError(
                f"--gmm-kernel: {spec!r} is neither a built-in adapter ({sorted(builtin)}) "
                "nor an import path pkg.module:fn"
            )
        if tiling is not None:
            adapter.tiling = tiling
        out.append(adapter)
    return out
