"""``routed_backwards()``: the backward of drawn routings (:class:`gmm_ref.RoutedBackward`): each routing with a
per-slot cotangent ``dY [T, top_k, N]`` and, for a kernel that adds into an existing experts' gradient, that
gradient (docs/routed.md, "The routed gradient model").

The values follow the routing's kind:

- ``"exact"``: small integers in ``[-c, c]``, ``c`` (1 to 4) sized so that the per-slot input gradient (``N``
  terms against the experts) and the experts' gradient (an expert's slots against the tokens) stay exact in the
  output dtype where they can; an existing gradient small integers too, but for an eighth of its elements
  ``+-2**(m + 2)`` (``m`` the accumulator's fraction bits, 2**25 for float32; where the dtype holds it): a sum that
  starts from it in a float32 accumulator loses every small add (unsloth adds it after the reduction);
- ``"normal"``, ``"wide"``: ``values.fill``'s kinds, over the longer of the two contractions;
- ``"poisoned"``: normal values, NaN or Inf in every cotangent row of a slot no local expert takes (nothing
  reads it).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
from hypothesis import strategies as st
from hypothesis.errors import InvalidArgument
from hypothesis.strategies import SearchStrategy

import gmm_ref
from gmm_ref import dtypes as _dt
from property_tests.strategies._common import SEEDS, check_bool
from property_tests.strategies.values import VALUE_KINDS, fill, poison

__all__ = ["cotangent_of", "existing_of", "routed_backwards"]


def _largest(x: np.ndarray) -> float:
    a = np.abs(_dt.as_numpy(x).astype(np.float64))
    a = a[np.isfinite(a)]
    return float(a.max()) if a.size else 1.0


def _terms(r: gmm_ref.Routing) -> int:
    """The longest contraction of a gradient: ``N`` (per-slot input) or the most slots of one expert."""
    local = r.local_ids[r.local_ids >= 0]
    return max(r.n, int(np.bincount(local).max()) if local.size else 0, 1)


def cotangent_of(rng: np.random.Generator, r: gmm_ref.Routing, kind: str, seed: int = 0) -> np.ndarray:
    """A cotangent ``[T, top_k, N]`` of ``r``'s output dtype, of values ``kind`` (module docstring)."""
    shape, out = (r.num_tokens, r.top_k, r.n), np.dtype(r.out_dtype)
    if kind == "exact":
        lim = min(2.0 ** (_dt.float_format(d).mant + 1) for d in (out, np.float32, r.tokens.dtype)) / 2
        other = max(_largest(r.tokens), _largest(r.experts)) * float(np.abs(r.weights64()).max(initial=1.0))
        c = int(max(1, min(4, lim // (_terms(r) * max(other, 1.0)))))
        return rng.integers(-c, c + 1, size=shape, dtype=np.int8).astype(out)
    dy = fill(rng, shape, out, "normal" if kind == "poisoned" else kind, _terms(r), out, seed)
    if kind == "poisoned":
        poison(rng, dy, np.broadcast_to((r.local_ids < 0)[:, :, None], shape))
    return dy


def existing_of(rng: np.random.Generator, r: gmm_ref.Routing, kind: str, seed: int = 0) -> np.ndarray:
    """An existing experts' gradient (the experts' shape and dtype) of values ``kind`` (module docstring)."""
    dtype = r.experts.dtype
    if kind != "exact":
        return fill(rng, r.experts.shape, dtype, "normal" if kind == "poisoned" else kind, _terms(r), dtype, seed)
    ex = rng.integers(-2, 3, size=r.experts.shape).astype(np.float64)
    fmt = _dt.float_format(dtype)
    big = 2.0 ** min(_dt.float_format(np.float32).mant + 2, math.floor(math.log2(fmt.max_finite)) - 1)
    far = rng.random(ex.shape) < 1 / 8
    ex[far] = big * rng.choice((-1.0, 1.0), size=int(far.sum()))
    return ex.astype(dtype)


def routed_backwards(routings: SearchStrategy[gmm_ref.Routing], *, values: str = "normal",
                     existing: bool = False) -> SearchStrategy[gmm_ref.RoutedBackward]:
    """The backward of each routing ``routings`` draws: its cotangent (and with ``existing`` an existing experts'
    gradient) of values ``values`` (one of ``values.VALUE_KINDS``, the routings' own kind), seeded by a draw, so
    that they shrink with the routing."""
    if values not in VALUE_KINDS:
        raise InvalidArgument(f"values={values!r}, but it must be one of {VALUE_KINDS}")
    if not isinstance(routings, SearchStrategy):
        raise InvalidArgument(f"routings={routings!r}, but it must be a strategy of gmm_ref.Routing (gst.routings())")
    check_bool("existing", existing)

    @st.composite
    def _draw(draw: Any) -> gmm_ref.RoutedBackward:
        r = draw(routings)
        seed = draw(SEEDS)
        rng = np.random.default_rng(seed)
        dy = cotangent_of(rng, r, values, seed)
        return gmm_ref.RoutedBackward.of(r, dy, existing_of(rng, r, values, seed) if existing else None)

    return _draw()
