"""Near-miss names: a "did you mean ...?" for a name a user gave that is not one of the known ones.

One helper for every layer that refuses a name (a convention, a built-in kernel, a mode, a family, a command-line
option), so that all of them suggest alike:

>>> did_you_mean("ragged_dto", ["ragged_dot", "megablox.gmm"])
'; did you mean ragged_dot?'
>>> did_you_mean("nothing_like_it", ["ragged_dot"])
''
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable
from typing import Any

__all__ = ["close_names", "did_you_mean"]


def close_names(given: Any, known: Iterable[str], n: int = 3) -> list[str]:
    """The known names closest to ``given``: the best match and those as close (at most ``n``; none when nothing
    is close). Case does not count, and a name matches a known one by its last dotted part too
    (``ragged_dot`` -> ``jax.ragged_dot``)."""
    if not isinstance(given, str) or not given.strip():
        return []
    word = given.strip().lower()
    scores: dict[str, float] = {}
    for k in dict.fromkeys(known):
        if isinstance(k, str) and k:
            m = difflib.SequenceMatcher(None, word, k.lower()).ratio()
            tail = difflib.SequenceMatcher(None, word, k.rpartition(".")[2].lower()).ratio()
            scores[k] = max(m, tail)
    ranked = sorted((k for k in scores if scores[k] >= 0.6), key=lambda k: -scores[k])
    return [k for k in ranked if scores[k] >= scores[ranked[0]] - 0.05][:n] if ranked else []


def did_you_mean(given: Any, known: Iterable[str]) -> str:
    """``"; did you mean X?"`` (or ``X or Y``) for the known names closest to ``given``, else ``""``: a suffix
    for an error message that names what was given."""
    near = close_names(given, known)
    return f"; did you mean {' or '.join(near)}?" if near else ""
