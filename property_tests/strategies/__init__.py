"""Public Hypothesis strategies for grouped GEMM edge cases (``from property_tests import strategies as gst``).

The strategies draw the cases that broke real kernels and that nobody writes by
hand: empty groups side by side, every group empty, one group holding every row,
group boundaries one row either side of a tile edge, K remainders, padding rows
full of NaN, a shard whose first group is empty. Failures shrink towards few
groups, small sizes and small integer values.

*Compile-aware*: :func:`problems` takes its static (recompiling) parameters,
i.e. family, layout, shapes, group count, dtypes and whether an output is
passed, from a small fixed list of *buckets* per strategy (``max_buckets``),
while group sizes, the shard offset and the values vary freely. N examples
against a jitted kernel therefore compile at most ``max_buckets`` times.

What a convention takes (families, layouts, dtypes, policies, shape
multiples) comes from its :class:`gmm_ref.conventions.Convention`. Importing
this package needs neither jax nor torch, and has no side effects.

Routed MoE (:class:`gmm_ref.Routing`, docs/routed.md): :func:`routings` draws whole routed problems
compile-aware in the same way; :func:`topk_ids` and :func:`topk_weights` draw the routing alone;
:func:`routed_replays` draws routings of one shape a kernel gets in turn (the graph mode's); :func:`routed_covering` is
the covering design of routed relations, whose cells ``routings(cell=...)`` draws;
:func:`routed_backwards` draws the backward of drawn routings (:class:`gmm_ref.RoutedBackward`: a cotangent, and an
existing experts' gradient where asked).
"""

from property_tests.strategies.cotangents import routed_backwards
from property_tests.strategies.extents import extents, tilings
from property_tests.strategies.problems import problems
from property_tests.strategies.routing import routed_covering, routed_replays, routings, topk_ids, topk_weights
from property_tests.strategies.sizes import group_sizes, shardings
from property_tests.strategies.values import VALUE_KINDS

# what users call; the checks' own helpers (covering, replays) stay in property_tests.strategies.problems
__all__ = ["VALUE_KINDS", "extents", "group_sizes", "problems", "routed_backwards", "routed_covering", "routed_replays",
           "routings", "shardings", "tilings", "topk_ids", "topk_weights"]
