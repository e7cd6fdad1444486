"""Every documented promise of ``problems()`` holds for every pair of its arguments.

Each setting below comes with the promise its docstring makes; every pair of
settings (of different arguments) is drawn and both promises are checked on
each example. A pair that cannot be drawn must raise ``InvalidArgument``
naming one of its two arguments.
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis.errors import InvalidArgument

from property_tests import strategies as gst


def _sizes_sum(p):
    return p.group_sizes.sum(axis=-1)


def _all_empty(p, kw):
    if p.family == "batch":
        return True
    if kw.get("allow_tail") is False:  # every group but one empty, that one holding the extent
        return bool(np.all((p.group_sizes > 0).sum(axis=-1) <= 1)) and bool(np.all(_sizes_sum(p) == p.ragged_extent))
    return bool(np.all(p.group_sizes == 0))


SETTINGS = [
    ("all_empty", True, _all_empty),
    ("allow_tail", False, lambda p, kw: p.family == "batch" or bool(np.all(_sizes_sum(p) == p.ragged_extent))),
    ("existing_out", True, lambda p, kw: p.existing_out is not None),
    ("existing_out", False, lambda p, kw: p.existing_out is None),
    ("sharding", True, lambda p, kw: p.num_local_groups < p.num_groups),
    ("sharding", False, lambda p, kw: p.num_local_groups == p.num_groups and p.group_offset == 0),
    ("vary_out_dtype", True, lambda p, kw: p.out_dtype != p.lhs.dtype),
    ("vary_out_dtype", False, lambda p, kw: p.out_dtype == p.lhs.dtype),
    ("dtypes", ("bfloat16",), lambda p, kw: str(p.lhs.dtype) == "bfloat16" and str(p.rhs.dtype) == "bfloat16"),
    ("families", ("ragged_k",), lambda p, kw: p.family == "ragged_k"),
    ("min_groups", 3, lambda p, kw: p.num_groups >= 3),
    ("max_groups", 2, lambda p, kw: p.num_groups <= 2),
    ("max_batch_dims", 0, lambda p, kw: p.batch_ndim == 0),
    ("values", "exact", lambda p, kw: all(np.array_equal(a.astype(np.float64), np.rint(a.astype(np.float64)))
                                          for a in (p.lhs, p.rhs))),
    ("shapes", [(16, 8, 8)], lambda p, kw: (p.m, p.k, p.n) == (16, 8, 8)),
]
PAIRS = [(a, b) for a, b in itertools.combinations(SETTINGS, 2) if a[0] != b[0]]
DRAW = settings(max_examples=12, derandomize=True, database=None, deadline=None, phases=[Phase.generate],
                suppress_health_check=list(HealthCheck))


@pytest.mark.parametrize(("first", "second"), PAIRS, ids=[f"{a[0]}={a[1]}-{b[0]}={b[1]}" for a, b in PAIRS])
def test_both_promises_hold_for_every_example(first, second):
    kw = {first[0]: first[1], second[0]: second[1]}  # (min_groups=3 with max_groups=2 must be refused)
    refused = None
    try:
        strategy = gst.problems(**kw)

        @DRAW
        @given(strategy)
        def prop(p):
            for name, value, promise in (first, second):
                assert promise(p, kw), f"{name}={value!r} broken by {p!r} (arguments {kw})"

        prop()
    except InvalidArgument as exc:
        refused = str(exc)
    assert refused is None or first[0] in refused or second[0] in refused, f"{kw}: {refused}"


def test_the_pairs_cover_every_documented_setting():
    assert len(PAIRS) >= 90 and {s[0] for s in SETTINGS} >= {"all_empty", "allow_tail", "existing_out", "sharding",
                                                               "vary_out_dtype", "dtypes", "families"}
