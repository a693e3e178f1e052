"""The TF bridge's side of the Plan contract: what it tells the planner, what it refuses."""
import pytest

import rdmadev
from graph_pass.plan import Plan
from rdmadev.tf import bridge


def test_planner_is_told_what_the_ops_carry_and_the_deadline():
    cfg = rdmadev.Config(slots=3, deadline_s=42.0, dynamic_capacity=4096)
    planned = bridge.plan_config(cfg)
    assert planned.slots == 3 and planned.deadline_s == 42.0
    assert bridge.OPS_CARRY == {"dynamic_shapes": True, "half_pairs": True, "dead_tensors": True, "loops": True}
    # Half pairs only where the task's runtime can meet their peers (a TF1 GraphMgr's pass).
    assert planned.carries == {"dynamic_shapes": True, "half_pairs": False, "dead_tensors": True, "loops": True}
    assert planned.half_pair_capacity is None
    assert planned.default_dynamic_capacity == 4096  # RDMADEV_DYNAMIC_CAPACITY
    halves = bridge.plan_config(cfg, halves=True)
    assert halves.carries == bridge.OPS_CARRY and halves.half_pair_capacity == 4096


def test_a_plan_with_the_native_wire_layout_is_accepted():
    bridge.check_wire_layout(Plan())  # graph_pass.layout's constants


@pytest.mark.parametrize("field, value, named", [
    ("seq_offset", 8, "seq_offset"), ("length_offset", 16, "length_offset"),
    ("slot_header_bytes", 128, "slot_header_bytes"), ("alignment", 128, "alignment"),
    ("length_bytes", 4, "signal_bytes"), ("shape_block_offset", 128, "shape_block_offset"),
    ("shape_dims_offset", 16, "shape_dims_offset"),
])
def test_a_plan_whose_slot_layout_differs_from_the_native_one_is_refused(field, value, named):
    plan = Plan()
    plan.layout[field] = value
    with pytest.raises(rdmadev.ProtocolError, match=f"{named}=.*native library writes {named}="):
        bridge.check_wire_layout(plan)


def test_a_function_keeps_its_lineage_scope_across_retraces_tokens_and_coordinators():
    """What a channel learned is kept per function (opening.lineage): TF's instantiation
    counter and an optimized function's opt-in token (new per tf.function object and per
    coordinator) are not part of its name; the name it was given is."""
    marker = bridge.opt_in_marker()
    assert bridge.lineage_scope(f"__inference_step{marker}6c891183_22") == "__inference_step"
    assert bridge.lineage_scope(f"__inference_step{marker}1e12de9d_67") == "__inference_step"
    assert bridge.lineage_scope("__inference_one_step_on_data_1234") == "__inference_one_step_on_data"
    assert bridge.lineage_scope("__inference_step_2") != bridge.lineage_scope("__inference_other_2")
    assert bridge.lineage_scope("") == ""  # a TF1 GraphMgr's pass: no function
