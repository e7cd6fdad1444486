"""A picture of a routed MoE kernel's failing output, written as a PNG beside its reproducer: :func:`save`.

Rows are tokens. A per-slot output (``[T, top_k, N]``; the per-slot input gradient ``[T, top_k, K]``, the weights'
gradient ``[T, top_k]``) is a block of columns per slot, side by side, one element a square. One token's row in one
slot's block is that slot's band: its right elements are tinted light in the hue of the local expert the slot was
routed to and the band is outlined in a stronger shade of that hue, so that its expert still shows where every
element of it is wrong. A slot of another rank is untinted and outlined gray (its elements gray where the routing's
``foreign`` policy leaves them undefined). A combined output (``[T, N]``; the token gradient ``[T, K]``) is one
block, a token's slots a square each on its left in their experts' colours; the experts' gradient is a block of
rows per local expert, stacked, each outlined in its expert's shade. The wrong elements are coloured as the grouped
picture colours them (``picture``: orange to dark red by error over the bound, NaN/Inf purple), so that "every slot
routed to expert 3" or "the last token of every block" shows at a glance. Under the picture a legend: one swatch per
local expert, expert 0 first. The experts' hues run from yellow to blue, away from the wrong elements' orange, red
and purple.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from gmm_ref.routed.compare import output_target
from property_tests.checks import picture

__all__ = ["image", "palette", "save", "words"]

#: the legend, as the report's note words it
_LEGEND = "the experts' colours in a row under it, expert 0 first"


def words(output: str) -> str:
    """How the report's note describes the picture of a routed kernel's ``output`` (its layout and legend)."""
    if output == "d_experts":
        return f"a block of rows per local expert, outlined in its colour; {_LEGEND}"
    slots = ("each token's slots a square left of its row" if output in ("combined", "d_tokens")
             else "a row per token, a block of columns per slot")
    return f"{slots}, tinted and outlined in its local expert's colour (another rank's gray); {_LEGEND}"


#: owner codes of an element: not in a slot's band; in a slot of another rank (a local expert's: its index)
_NONE, _FOREIGN = -2, -1
#: the severity code of the white column between two blocks (``picture.colours`` draws it white)
_GAP = -3.0
_OTHER_EDGE = (150, 150, 150)


def palette(n: int) -> tuple[np.ndarray, np.ndarray]:
    """``([n, 3] light tints, [n, 3] strong shades)`` of ``n`` local experts: hues spread by the golden ratio over
    yellow to blue (none orange, red or purple, the wrong elements' colours; no channel 0), every other expert
    lighter, so that neighbouring hues still differ."""
    e = np.arange(n)
    h = 0.15 + 0.53 * ((e * 0.6180339887498949) % 1.0)
    odd = (e % 2).astype(np.float64)
    return _hsv(h, 0.22 + 0.14 * odd, np.ones(n)), _hsv(h, np.full(n, 0.8), 0.8 - 0.25 * odd)


def _hsv(h: np.ndarray, s: np.ndarray, v: np.ndarray) -> np.ndarray:
    i = np.floor(h * 6).astype(np.int64) % 6
    f = h * 6 - np.floor(h * 6)
    p, q, t = v * (1 - s), v * (1 - s * f), v * (1 - s * (1 - f))
    rgb = [np.choose(i, c) for c in ([v, q, p, p, t, v], [t, v, v, q, p, p], [p, p, t, v, v, q])]
    return np.round(np.stack(rgb, axis=-1).reshape(-1, 3) * 255).astype(np.uint8)


def _panels(sev: np.ndarray, ref: Any, output: str) -> list[tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """The picture's blocks, left to right: (severity, owner, band) grids of one shape, ``owner`` each element's
    local expert (``_FOREIGN``, ``_NONE``), ``band`` the slot band it lies in (-1: none)."""
    local = np.asarray(ref.routing.local_ids)
    tokens, top_k = local.shape
    owner = np.where(local >= 0, local, _FOREIGN)
    slot = np.arange(tokens * top_k).reshape(tokens, top_k)
    if output == "d_experts":  # [E, N, K] or [E, K, N]: each expert's rows, one band
        e, a, b = sev.shape
        rows = np.repeat(np.repeat(np.arange(e), a)[:, None], b, axis=1)
        return [(sev.reshape(e * a, b), rows, rows)]
    if output in ("combined", "d_tokens"):  # the slots feeding each row, then the rows
        return [(np.full((tokens, top_k), -1.0), owner, slot),
                (sev, np.full(sev.shape, _NONE), np.full(sev.shape, -1))]
    sev = sev.reshape(tokens, top_k, -1)
    cols = sev.shape[2]
    return [(sev[:, j], np.repeat(owner[:, j:j + 1], cols, axis=1), np.repeat(slot[:, j:j + 1], cols, axis=1))
            for j in range(top_k)]


def _reduced(panel: tuple[np.ndarray, np.ndarray, np.ndarray], block: int
             ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``panel`` with each ``block`` x ``block`` of elements one: its worst severity; its owner and band where all
    of its elements share them, else none."""
    sev, owner, band = panel
    if block == 1 or sev.size == 0:
        return panel
    pads = ((0, -sev.shape[0] % block), (0, -sev.shape[1] % block))

    def shared(x: np.ndarray, none: int) -> np.ndarray:
        b = np.pad(x, pads, mode="edge")
        b = b.reshape(b.shape[0] // block, block, b.shape[1] // block, block)
        lo, hi = b.min(axis=(1, 3)), b.max(axis=(1, 3))
        return np.where(lo == hi, lo, none)

    return picture.worst(sev, block), shared(owner, _NONE), shared(band, -1)


def _assembled(panels: list[tuple[np.ndarray, np.ndarray, np.ndarray]]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The blocks side by side, a white column between two."""
    rows = panels[0][0].shape[0]
    gap = (np.full((rows, 1), _GAP), np.full((rows, 1), _NONE), np.full((rows, 1), -1))
    parts = [part for i, panel in enumerate(panels) for part in ((gap, panel) if i else (panel,))]
    sev, owner, band = (np.concatenate([p[i] for p in parts], axis=1) for i in range(3))
    return sev, owner, band


def _outline(rgb: np.ndarray, owner: np.ndarray, band: np.ndarray, side: int, shade: np.ndarray) -> None:
    """Outline each slot band of ``rgb`` (``side`` pixels an element) in its expert's shade (another rank's gray):
    the border pixels of its elements next to another band or none."""
    colour = np.empty((*band.shape, 3), np.uint8)
    colour[:] = _OTHER_EDGE
    mine = owner >= 0
    colour[mine] = shade[owner[mine]]
    around = np.pad(band, 1, constant_values=-1)
    inside = band >= 0
    edges = [inside & (around[:-2, 1:-1] != band), inside & (around[2:, 1:-1] != band),
             inside & (around[1:-1, :-2] != band), inside & (around[1:-1, 2:] != band)]

    width = max(1, side // 6)  # thick enough to tell the hue of a band whose every element is wrong
    py, px = np.arange(rgb.shape[0]) % side, np.arange(rgb.shape[1]) % side
    at = [(py < width)[:, None], (py >= side - width)[:, None], (px < width)[None, :], (px >= side - width)[None, :]]
    edge = np.zeros(rgb.shape[:2], bool)
    for e, where in zip(edges, at, strict=True):
        edge |= picture.enlarged(e, side) & where
    rgb[edge] = picture.enlarged(colour, side)[edge]


def _with_legend(rgb: np.ndarray, shade: np.ndarray, side: int) -> np.ndarray:
    """``rgb`` with a row of swatches under it, one per local expert in order (a white pixel column between two)."""
    n = len(shade)
    if n == 0:
        return rgb
    s = max(1, min(16, picture.MAX_PIXELS // n))
    legend = np.full((s, n * s, 3), 255, np.uint8)
    keep = np.arange(n * s) % s < s - (s >= 3)
    legend[:, keep] = shade[np.repeat(np.arange(n), s)[keep]]
    gap = max(2, side)
    out = np.full((rgb.shape[0] + gap + s, max(rgb.shape[1], n * s), 3), 255, np.uint8)
    out[:rgb.shape[0], :rgb.shape[1]] = rgb
    out[rgb.shape[0] + gap:, :n * s] = legend
    return out


def image(out: Any, ref: Any, numerics: Any, bad: np.ndarray, output: str = "slots") -> np.ndarray:
    """The ``[height, width, 3]`` picture of a routed kernel's ``output`` ``out`` against ``ref`` (a
    ``gmm_ref.RoutedReference``; a ``gmm_ref.RoutedGradients`` for a gradient), ``bad`` its wrong elements under
    ``numerics`` (the module docstring)."""
    _, exact, bound_of, mask = output_target(ref, output)
    sev = picture.severity(np.asarray(out), exact, np.asarray(mask), np.asarray(bound_of(numerics)), np.asarray(bad))
    panels = _panels(sev, ref, output)
    cols = sum(p[0].shape[1] for p in panels) + len(panels) - 1
    block = max(1, -(-max(panels[0][0].shape[0], cols) // picture.MAX_PIXELS))  # elements a pixel, where too many
    sev, owner, band = _assembled([_reduced(p, block) for p in panels])
    side = max(1, min(16, picture.MAX_PIXELS // max(*sev.shape, 1)))
    tint, shade = palette(ref.routing.num_local_experts)
    rgb = picture.colours(sev)
    right = (sev == -1.0) & (owner >= 0)
    rgb[right] = tint[owner[right]]
    rgb = picture.enlarged(rgb, side)
    if side >= 3:  # room for a band's outline around its elements' insides
        _outline(rgb, owner, band, side, shade)
    return _with_legend(rgb, shade, side)


def save(out: Any, ref: Any, numerics: Any, bad: np.ndarray, output: str = "slots") -> Path:
    """Write :func:`image` as a PNG into the reproducers' directory (``picture.write``); its path."""
    return picture.write(image(out, ref, numerics, bad, output))
