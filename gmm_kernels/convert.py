"""NumPy <-> jax / torch conversion, exact for bfloat16 (no float32 round trip).

Imports jax and torch only inside the functions that need them.
"""

from __future__ import annotations

from typing import Any

import ml_dtypes
import numpy as np

from gmm_ref.compare import as_numpy

__all__ = ["to_numpy", "to_jax", "to_torch", "torch_dtype", "uses_64bit", "jax_x64"]

_BF16 = np.dtype(ml_dtypes.bfloat16)


def to_numpy(x: Any) -> np.ndarray:
    """A jax array, torch tensor or array-like as NumPy (bfloat16 as ml_dtypes)."""
    return as_numpy(x)


def torch_dtype(dt: Any) -> Any:
    """The torch dtype of a NumPy dtype (None stays None)."""
    import torch

    if dt is None:
        return None
    dt = np.dtype(dt)
    if dt == _BF16:
        return torch.bfloat16
    return torch.from_numpy(np.zeros(0, dt)).dtype


def to_torch(x: Any) -> Any:
    """A NumPy array as a CPU torch tensor with the same strides (bfloat16 bit-exact)."""
    import torch

    if x is None or isinstance(x, torch.Tensor):
        return x
    a = np.asarray(x)
    if any(s < 0 for s in a.strides):
        a = a.copy()
    if a.dtype == _BF16:
        return torch.from_numpy(a.view(np.int16)).view(torch.bfloat16)
    return torch.from_numpy(a)


def to_jax(x: Any) -> Any:
    """NumPy arrays to jax arrays (None and non-arrays pass through)."""
    import jax.numpy as jnp

    if isinstance(x, np.ndarray):
        return jnp.asarray(x)
    return x


def uses_64bit(*values: Any) -> bool:
    """Whether any array or dtype among ``values`` is 64-bit (needs jax x64)."""
    for v in values:
        if v is None:
            continue
        dt = None if isinstance(v, type) else getattr(v, "dtype", None)  # np.int64 has a .dtype descriptor
        if dt is None:
            try:
                dt = np.dtype(v)
            except TypeError:
                continue
        if np.dtype(dt).itemsize == 8 and np.dtype(dt).kind in "fiuc":
            return True
    return False


def jax_x64(enable: bool) -> Any:
    """A context enabling jax 64-bit types when ``enable`` (else a no-op)."""
    import contextlib

    if not enable:
        return contextlib.nullcontext()
    import jax

    return jax.enable_x64(True)
