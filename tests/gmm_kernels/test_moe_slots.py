"""The per-slot routed convention with global expert ids (``torch.moe_slots``): a user's kernel in the signature
many fused-MoE kernels take is checked as it is, and a global/local expert id mix-up is caught."""

from __future__ import annotations

import numpy as np
import pytest

import gmm_ref
from gmm_ref import conventions
from property_tests.checks.check import check_kernel
from tests.corpus import moe_slots

pytest.importorskip("torch")


def test_the_convention_round_trips_a_routing_with_an_expert_map():
    rng = np.random.default_rng(0)
    routing = gmm_ref.Routing(rng.standard_normal((3, 4)).astype(np.float32),
                              rng.standard_normal((2, 5, 4)).astype(np.float32),
                              np.array([[0, 3], [2, 1], [3, 3]], np.int32), np.full((3, 2), 0.5, np.float32),
                              expert_map=np.array([-1, 1, -1, 0], np.int32), mul_routed_weight=True)
    conv = conventions.get("torch.moe_slots")
    args, kwargs = conv.arguments(routing)
    again = conv.parse(*args, **kwargs)
    assert np.array_equal(again.topk_ids, routing.topk_ids) and np.array_equal(again.expert_map, routing.expert_map)
    assert again.mul_routed_weight and conv.output == "slots"
    with pytest.raises(TypeError, match="mul_routed_weight: expected a bool"):
        conv.parse(*args[:4], "yes", args[5])


def test_a_correct_kernel_in_the_signature_passes_as_it_is():
    report = check_kernel(moe_slots.moe_slots, convention="torch.moe_slots", modes=["exact", "normal", "poisoned"],
                          raise_on_failure=False, max_examples=25)
    assert report.ok, [r.line() for r in report]


def test_a_global_id_read_as_a_local_one_is_caught_naming_token_slot_and_expert():
    with pytest.raises(gmm_ref.Mismatch, match=r"token \d+, slot \d+ \(expert \d+, local \d+\)"):
        check_kernel(moe_slots.moe_slots_global_as_local, convention="torch.moe_slots", modes=["exact"])


def test_the_graph_mode_calls_new_routings_of_one_shape_and_names_the_call(tmp_path, monkeypatch):
    report = check_kernel(moe_slots.moe_slots, convention="torch.moe_slots", modes=["graph"], max_examples=20)
    assert report.ok and report.by_check()["graph"].examples > 0, [r.line() for r in report]
    moe_slots._PLANS.clear()
    failed = check_kernel(moe_slots.moe_slots_plan_cached_by_shape, convention="torch.moe_slots", modes=["graph"],
                          raise_on_failure=False)
    (result,) = failed.results
    assert result.status.failure and result.detail.startswith("call "), result.detail
    assert "of one routing shape: token " in result.detail, result.detail
    report_text = result.full_report()
    assert "metadata kept from an earlier call" in report_text
    # its reproducer makes the calls before the failing one, on a fresh kernel, and fails as the check did
    cause = next(c for c in failed.causes if c["key"].startswith("wrong:"))
    script = cause["reproducer"].removeprefix("```python\n").removesuffix("\n```")
    assert "call_1 = gmm_ref.Routing(" in script and "kernel.run(call_1)" in script, script
    moe_slots._PLANS.clear()
    monkeypatch.chdir(tmp_path)
    with pytest.raises(gmm_ref.Mismatch):
        exec(compile(script, "reproducer.py", "exec"), {})
