"""The covering design of routed relations: every cell shows its relations, a run reaches every pair, and a bug
that hides behind one relation (an expert filling a whole block) is caught in one example a cell."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.errors import InvalidArgument

import gmm_kernels
import gmm_ref
from property_tests import check_kernel
from property_tests import strategies as gst
from property_tests.checks.check import coverage
from property_tests.strategies.routed_design import observe_routing
from property_tests.strategies.routing import _config, routed_buckets, routed_covering, routings

torch = pytest.importorskip("torch")

CONFIGS = [{}, {"distinct_experts": False}, {"block_size": 64}, {"block_size": 1}, {"max_tokens": 5},
           {"expert_parallel": True, "distinct_experts": False, "top_k": (8,), "num_experts": (8,)},
           {"num_tokens": (3, 64)}]


@pytest.mark.parametrize("kwargs", CONFIGS, ids=str)
def test_every_routing_of_a_cell_shows_the_cells_relations(kwargs):
    design = routed_covering(**kwargs)
    block = kwargs.get("block_size", 16)
    assert design.cells and design.pairs
    assert {c.static for c in design.cells} == set(routed_buckets(_config(**_config_args(kwargs))))  # none lost
    reached = set()
    for cell in design.cells:
        _shows_its_relations(cell, kwargs, block, reached)
    assert design.pairs <= reached


def _shows_its_relations(cell, kwargs, block, reached):
    @settings(max_examples=4, database=None, deadline=None, suppress_health_check=list(HealthCheck))
    @given(routings(cell=cell, **kwargs))
    def prop(r):
        seen = observe_routing(r, block)
        for factor, level in cell.levels().items():
            assert level in seen[factor], (cell.describe(), factor, sorted(seen[factor]))
        reached.update(gst.design.pairs_of(seen))

    prop()


def _config_args(kwargs):
    import inspect

    params = inspect.signature(routings).parameters
    full = {k: p.default for k, p in params.items() if k not in ("values", "foreign", "cell", "max_tokens")}
    return full | {k: v for k, v in kwargs.items() if k != "max_tokens"}


def test_observed_levels_of_a_handmade_routing():
    rng = np.random.default_rng(0)
    ids = np.array([[0, 9]] * 17 + [[1, 9], [2, 3], [2, 4]], np.int32)  # expert 0: 17 slots, 9 (the last): 18
    r = gmm_ref.Routing(rng.standard_normal((20, 4)).astype(np.float32),
                        rng.standard_normal((10, 4, 4)).astype(np.float32), ids,
                        np.ones((20, 2), np.float32), expert_layout="enk")
    seen = observe_routing(r, 16)
    assert seen["slots"] == {"unaligned"}  # 40 slots, blocks of 16
    assert seen["last"] == {"hit"}
    assert seen["load"] == {"many_blocks", "one", "one_block", "none"}  # 0 and 9 / 1, 3, 4 / 2 / 5-8
    assert seen["experts"] == {"many"} and seen["top_k"] == {"several"} and seen["ep"] == {"off"}
    assert observe_routing(r, 64)["load"] == {"one_block", "one", "none"}
    assert observe_routing(r, 17)["load"] == {"one_block", "many_blocks", "one", "none"}  # 17 slots: one block
    assert observe_routing(r, 40)["slots"] == {"aligned"}


def test_the_design_covers_every_pair_it_can_express_and_says_what_it_cannot():
    design = routed_covering()
    assert {f for p in design.pairs for f, _ in p} == {"experts", "top_k", "ep", "slots", "load", "last"}
    inexpressible = dict(design.inexpressible)
    assert "load=many_blocks & slots=below" in inexpressible  # under one block of slots, no expert fills one
    assert "load=one & slots=zero" in inexpressible
    assert not any(set(a.split(" & ")) <= {f"{f}={v}" for p in design.pairs for f, v in p} and
                   frozenset(tuple(x.split("=")) for x in a.split(" & ")) in design.pairs for a in inexpressible)


def test_a_run_of_the_ci_profile_reaches_every_pair():
    result = coverage(gmm_kernels.get("torch.moe_experts"), "exact", profile="gmm-ci")
    assert result.cells[0] == result.cells[1] > 10
    assert result.pairs[0] == result.pairs[1] > 100, result.missing
    assert not result.missing


@pytest.mark.parametrize("bad", [{"num_tokens": st.integers(0, 3)}, {"max_buckets": None}, {"nonsense": 1}],
                         ids=["strategy", "no_buckets", "unknown"])
def test_routed_covering_rejects_what_its_cells_cannot_fix(bad):
    with pytest.raises(InvalidArgument, match=next(iter(bad))):
        routed_covering(**bad)


def test_a_cell_of_another_configuration_is_refused():
    cell = routed_covering(num_experts=(8,)).cells[0]
    with pytest.raises(InvalidArgument, match="not a cell of routed_covering"):
        routings(cell=cell, num_experts=(600,))


# --------------------------------------------------------------------- a bug behind one relation
def _moe_experts(hidden_states, weight, topk_ids, topk_weights, expert_map=None, *, per_expert_cap=None):
    """torch.moe_experts: ``[T, N]``, each token's local slots weighted and summed in float32; with
    ``per_expert_cap``, an expert's slots past the first ``per_expert_cap`` are dropped (a kernel that gives each
    expert one block of slots)."""
    t, top_k = topk_ids.shape
    out = torch.zeros((t, weight.shape[1]), dtype=torch.float32)
    taken: dict[int, int] = {}
    for i in range(t):
        for j in range(top_k):
            g = int(topk_ids[i, j])
            e = g if expert_map is None else int(expert_map[g])
            if e < 0:
                continue
            taken[e] = taken.get(e, 0) + 1
            if per_expert_cap is not None and taken[e] > per_expert_cap:
                continue
            out[i] += float(topk_weights[i, j]) * (weight[e].float() @ hidden_states[i].float())
    return out.to(hidden_states.dtype)


def one_block_per_expert(hidden_states, weight, topk_ids, topk_weights, expert_map=None):
    """Drops an expert's slots past its first 16 (one block of the alignment): right until an expert fills a
    block."""
    return _moe_experts(hidden_states, weight, topk_ids, topk_weights, expert_map, per_expert_cap=16)


def every_slot(hidden_states, weight, topk_ids, topk_weights, expert_map=None):
    """The honest twin."""
    return _moe_experts(hidden_states, weight, topk_ids, topk_weights, expert_map)


def test_a_kernel_wrong_only_when_an_expert_fills_a_block_is_caught_in_one_example_a_cell():
    with pytest.raises(gmm_ref.Mismatch, match=r"token \d+") as info:
        check_kernel(one_block_per_expert, convention="torch.moe_experts", modes=["exact"], tier="gmm-quick")
    assert "(expert " in str(info.value) and "one_block_per_expert differs" in str(info.value)
    report = check_kernel(every_slot, convention="torch.moe_experts", modes=["exact"], tier="gmm-quick")
    (result,) = report
    assert result.status.name == "PASSED" and result.cells[0] == result.cells[1] == result.examples
    assert result.pairs[0] == result.pairs[1] > 100
