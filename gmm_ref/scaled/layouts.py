"""Physical layouts of block scales: the swizzled 128 x 4 tiles NVIDIA's block-scaled MMA reads.

torch's ``SWIZZLE_32_4_4`` (``torch._scaled_grouped_mm`` with MXFP8) and TransformerEngine's swizzled MXFP8
scales store a ``[rows, k_blocks]`` matrix of scales padded to a multiple of 128 rows and 4 columns (padding
holds zeros), cut into 128 x 4 tiles taken row of tiles by row of tiles, each tile stored as 512 consecutive
scales: the scale of row ``r`` and column ``c`` of a tile at ``(r % 32) * 16 + (r // 32) * 4 + c``. Grouped
kernels keep one such padded block per group, one after the other. The model (``gmm_ref.Problem``) holds
scales unswizzled; a convention's front-end reads and writes these layouts.
"""

from __future__ import annotations

from typing import Any

import ml_dtypes
import numpy as np

__all__ = ["blocked_shape", "from_blocked", "group_blocks", "join_blocked", "pack_fp4", "round_up", "to_blocked",
           "unpack_fp4"]

TILE_ROWS, TILE_COLS = 128, 4


def round_up(x: int, multiple: int) -> int:
    """``x`` rounded up to a multiple of ``multiple``."""
    return -(-int(x) // multiple) * multiple


def blocked_shape(rows: int, cols: int) -> tuple[int, int]:
    """The padded ``(rows, cols)`` of a scale matrix in the swizzled layout (multiples of 128 and 4)."""
    return round_up(rows, TILE_ROWS), round_up(cols, TILE_COLS)


def _order(rows: int, cols: int) -> np.ndarray:
    """For each position of the flat swizzled layout of a ``blocked_shape(rows, cols)`` matrix, the flat index
    of the padded matrix's scale stored there."""
    pr, pc = blocked_shape(rows, cols)
    r, c = np.meshgrid(np.arange(pr), np.arange(pc), indexing="ij")
    tile = (r // TILE_ROWS) * (pc // TILE_COLS) + c // TILE_COLS
    rr, cc = r % TILE_ROWS, c % TILE_COLS
    position = tile * (TILE_ROWS * TILE_COLS) + (rr % 32) * 16 + (rr // 32) * 4 + cc
    order = np.empty(pr * pc, np.int64)
    order[position.reshape(-1)] = np.arange(pr * pc)
    return order


def to_blocked(scales: Any) -> np.ndarray:
    """A ``[rows, cols]`` scale matrix as its swizzled layout: padded with zeros to ``blocked_shape``, flat."""
    s = np.asarray(scales)
    if s.ndim != 2:
        raise ValueError(f"scales: expected a [rows, cols] matrix, got shape {s.shape}")
    pr, pc = blocked_shape(*s.shape)
    padded = np.zeros((pr, pc), s.dtype)
    padded[:s.shape[0], :s.shape[1]] = s
    return padded.reshape(-1)[_order(*s.shape)]


def from_blocked(flat: Any, rows: int, cols: int) -> np.ndarray:
    """The ``[rows, cols]`` scale matrix held in a swizzled layout (``flat``: its ``blocked_shape`` scales)."""
    f = np.asarray(flat).reshape(-1)
    pr, pc = blocked_shape(rows, cols)
    if f.size != pr * pc:
        raise ValueError(f"flat: expected {pr * pc} scales (a [{rows}, {cols}] matrix padded to [{pr}, {pc}]), "
                         f"got {f.size}")
    padded = np.empty(pr * pc, f.dtype)
    padded[_order(rows, cols)] = f
    return padded.reshape(pr, pc)[:rows, :cols]


def join_blocked(blocks: list[np.ndarray], dtype: Any) -> np.ndarray:
    """Groups' ``[rows, cols]`` scale matrices each in its own padded swizzled layout, one after the other, flat
    (a group of no rows takes no space)."""
    return np.concatenate([to_blocked(s) for s in blocks]) if blocks else np.zeros(0, dtype)


def group_blocks(name: str, arr: np.ndarray, shapes: list[tuple[int, int]], rows_first: bool,
                 kind: str = "MXFP8") -> list[np.ndarray]:
    """Each group's ``[rows, k_blocks]`` scales from the groups' swizzled blocks laid one after the other (each
    padded to a multiple of 128 rows and 4 columns; the inverse of :func:`join_blocked`). ``rows_first``: the
    blocks follow each other along the rows of ``arr`` (a 2-D stack), else along its columns; ``arr`` may be
    1-D. ``kind`` names the scales in the error message."""
    sizes = [int(np.prod(blocked_shape(r, c))) for r, c in shapes]
    flat = np.asarray(arr).reshape(-1)
    if flat.size != sum(sizes):
        want = ((sum(blocked_shape(r, c)[0] for r, c in shapes), blocked_shape(*shapes[0])[1]) if rows_first and shapes
                else (blocked_shape(shapes[0][0], 1)[0], sum(blocked_shape(r, c)[1] for r, c in shapes)) if shapes
                else (0,))
        raise ValueError(f"{name}: expected {sum(sizes)} {kind} scales (each group's swizzled block, padded to 128 "
                         f"rows and 4 columns: {want} in all), got shape {np.shape(arr)}")
    out, at = [], 0
    for (r, c), size in zip(shapes, sizes, strict=True):
        out.append(from_blocked(flat[at:at + size], r, c))
        at += size
    return out


# ------------------------------------------------------------------------------ packed 4-bit codes
def pack_fp4(codes: Any) -> np.ndarray:
    """float4_e2m1fn codes ``[..., K]`` (K even) as uint8 ``[..., K // 2]``, two codes a byte: the element of
    even index in the low nibble (torch's ``float4_e2m1fn_x2``, torchao's ``pack_uint4``). A code's 4 bits are
    sign, two exponent bits and one mantissa bit, as ml_dtypes holds them."""
    c = np.asarray(codes)
    if c.dtype != np.dtype(ml_dtypes.float4_e2m1fn) or c.ndim < 1 or c.shape[-1] % 2:
        raise ValueError(f"codes: expected float4_e2m1fn codes with an even last axis, got {c.dtype} {c.shape}")
    bits = c.view(np.uint8) & 0xF
    return (bits[..., 0::2] | (bits[..., 1::2] << 4)).astype(np.uint8)


def unpack_fp4(packed: Any, name: str = "packed") -> np.ndarray:
    """The inverse of :func:`pack_fp4`: uint8 ``[..., K // 2]`` -> float4_e2m1fn codes ``[..., K]``."""
    b = np.asarray(packed)
    if b.dtype != np.uint8:
        raise TypeError(f"{name}: expected uint8 bytes holding two float4_e2m1fn codes each, got {b.dtype}")
    if b.ndim == 0:
        raise ValueError(f"{name}: expected at least one dimension, got a scalar")
    out = np.empty((*b.shape[:-1], 2 * b.shape[-1]), np.uint8)
    out[..., 0::2], out[..., 1::2] = b & 0xF, b >> 4
    return out.view(ml_dtypes.float4_e2m1fn)
