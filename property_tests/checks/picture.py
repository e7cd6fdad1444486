"""A picture of a failing output, written as a PNG beside its reproducer: :func:`save`.

The output is drawn as a grid (leading axes stacked: a ``[G, M, N]`` output is G blocks of M rows), one square per
element: white where right, light gray where the convention leaves it undefined, the wrong elements from orange to
dark red by how far past the bound they are (log scale, 1x to 10**6x), NaN or Inf where the reference has none (or the
reverse) purple. Group boundaries are blue lines, the kernel's tile grid (where the problem names a tiling) gray
lines, so that "the last partial K tile of every group" or "every row of group 3" shows at a glance. The PNG is
encoded here (zlib): no plotting library is needed. A routed kernel's output is drawn by ``routed_picture`` with this
module's colours and encoder.
"""

from __future__ import annotations

import hashlib
import struct
import zlib
from pathlib import Path
from typing import Any

import numpy as np

import gmm_ref
from gmm_ref.repro import repro_directory

__all__ = ["MAX_PIXELS", "NOTE", "colours", "enlarged", "image", "png", "save", "severity", "worst", "write"]

#: the largest side of a picture, in pixels (a larger output is shown a block of elements a pixel)
MAX_PIXELS = 1024
#: how a report's note naming the picture begins
NOTE = "Picture of the output"

_WHITE, _GRAY, _PURPLE = (255, 255, 255), (225, 225, 225), (128, 0, 170)
_BLUE, _TILE = (30, 90, 220), (185, 185, 185)


def png(rgb: np.ndarray) -> bytes:
    """The PNG file of an ``[height, width, 3]`` uint8 image."""
    h, w, _ = rgb.shape
    raw = b"".join(b"\x00" + np.ascontiguousarray(rgb[y], dtype=np.uint8).tobytes() for y in range(h))

    def chunk(tag: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + tag + data + struct.pack(">I", zlib.crc32(tag + data) & 0xFFFFFFFF)

    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, 8, 2, 0, 0, 0))
            + chunk(b"IDAT", zlib.compress(raw, 6)) + chunk(b"IEND", b""))


def _grid(x: np.ndarray) -> np.ndarray:
    x = np.asarray(x)
    if x.ndim < 2:
        x = x.reshape(1, -1)
    return x.reshape(-1, x.shape[-1])


def severity(out: np.ndarray, values: np.ndarray, mask: np.ndarray, bound: np.ndarray, bad: np.ndarray) -> np.ndarray:
    """Per element: -2 undefined, -1 right, 0..1 how far past the bound (log), 2 NaN/Inf (``values``: what the
    error is measured from)."""
    o, r = out.astype(np.float64), values.astype(np.float64)
    sev = np.where(mask, -1.0, -2.0)
    with np.errstate(all="ignore"):
        ratio = np.abs(o - r) / np.maximum(np.abs(bound.astype(np.float64)), 1e-300)
    level = np.clip(np.log10(np.maximum(ratio, 1.0)) / 6.0, 0.0, 1.0)
    sev = np.where(bad, level, sev)
    return np.where(bad & (~np.isfinite(o) | ~np.isfinite(r)), 2.0, sev)


def colours(sev: np.ndarray) -> np.ndarray:
    """The colour of each :func:`severity` (white right, gray undefined, orange to dark red wrong, purple NaN/Inf;
    any other code white)."""
    rgb = np.empty((*sev.shape, 3), np.uint8)
    rgb[:] = _WHITE
    rgb[sev == -2.0] = _GRAY
    wrong = (sev >= 0) & (sev <= 1)
    t = sev[wrong][:, None]
    rgb[wrong] = (np.array([255, 190, 0]) * (1 - t) + np.array([140, 0, 0]) * t).astype(np.uint8)
    rgb[sev == 2.0] = _PURPLE
    return rgb


def worst(sev: np.ndarray, block: int) -> np.ndarray:
    """``sev`` (a 2-D :func:`severity` grid) with each ``block`` x ``block`` of elements one: its worst (the edges
    padded as undefined)."""
    if block == 1:
        return sev
    pads = ((0, -sev.shape[0] % block), (0, -sev.shape[1] % block))
    padded = np.pad(sev, pads, constant_values=-2.0)
    return padded.reshape(padded.shape[0] // block, block, -1, block).max(axis=(1, 3))


def enlarged(x: np.ndarray, side: int) -> np.ndarray:
    """``x`` with each element a ``side`` x ``side`` square of pixels."""
    return np.repeat(np.repeat(x, side, axis=0), side, axis=1)


def _boundaries(problem: gmm_ref.Problem, rows: int, cols: int) -> tuple[set[int], set[int]]:
    """The grid's rows and columns where a group starts (the output's ragged axis, or each group's block)."""
    facts = problem.family_facts
    if facts.is_grouped("out"):  # [G, ..., M, N]: a block of rows a group
        per = max(rows // max(len(problem.local_groups), 1), 1)
        return {i * per for i in range(1, rows // per)}, set()
    if problem.group_sizes is None or facts.ragged_dim("out") is None:
        return set(), set()
    starts, ends = problem.spans_at(tuple(0 for _ in problem.batch_shape))
    edges = {int(s) for s in starts[1:]} | {int(ends[-1])}
    return (edges, set()) if facts.ragged_dim("out") == 0 else (set(), edges)


def image(out: Any, reference: gmm_ref.Reference, numerics: Any, bad: np.ndarray) -> np.ndarray:
    """The ``[height, width, 3]`` picture of ``out`` against ``reference`` (module docstring)."""
    problem = reference.problem
    sev = _grid(severity(np.asarray(out), np.asarray(reference.values), np.asarray(reference.mask),
                         np.asarray(reference.bound(numerics)), np.asarray(bad)))
    rows, cols = sev.shape
    block = max(1, -(-max(rows, cols) // MAX_PIXELS))  # elements a pixel side, where there are too many
    sev = worst(sev, block)  # each pixel the worst of its block
    side = max(1, min(16, MAX_PIXELS // max(sev.shape)))
    rgb = enlarged(colours(sev), side)
    if side >= 3:  # lines on the elements' first pixel row / column
        tm, _, tn = problem.tiling or (0, 0, 0)
        row_groups, col_groups = _boundaries(problem, rows, cols)
        for r in range(1, sev.shape[0]):
            if r in row_groups or (tm and r % tm == 0):
                rgb[r * side, :] = _BLUE if r in row_groups else _TILE
        for c in range(1, sev.shape[1]):
            if c in col_groups or (tn and c % tn == 0):
                rgb[:, c * side] = _BLUE if c in col_groups else _TILE
    return rgb


def write(rgb: np.ndarray) -> Path:
    """Write the image ``rgb`` as a PNG into the reproducers' directory (``gmm_ref.repro.repro_directory``), named
    by its contents; its path."""
    data = png(rgb)
    path = repro_directory() / f"failure-{hashlib.sha256(data).hexdigest()[:12]}.png"
    path.write_bytes(data)
    return path


def save(out: Any, reference: gmm_ref.Reference, numerics: Any, bad: np.ndarray) -> Path:
    """Write :func:`image` as a PNG (:func:`write`); its path."""
    return write(image(out, reference, numerics, bad))
