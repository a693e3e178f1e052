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


def test_a_bundles_rewrites_list_its_tensors_in_the_order_of_their_bytes():
    """A control edge's empty tensor may start where the next tensor does: the native kernels
    need each tensor at or after the end of the one before, so the rewrites order by offset,
    then size (a resnet50 step had one at 2560 next to 512 B there)."""
    import os
    import sys
    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "planner"))
    import gp_builders as B
    import graph_pass as gp

    ps, w = B.Partition(B.dev("ps")), B.Partition(B.dev("worker", 0))
    for i in range(6):
        ps.var(f"v{i}", (128,))
        B.pair(ps, w, f"edge_{i}_v{i}", f"v{i}/read", recv_name=f"v{i}/_recv", shape=(128,))
        ps.node(f"ready{i}", "NoOp")
        B.control_pair(ps, w, f"edge_{10 + i}_ready", f"ready{i}", f"after{i}")
    plan = gp.plan_partitions(B.partitions(ps, w), instance_id="o")
    members = plan.swapped()
    assert {t.bundle for t in members} == {members[0].bundle}
    offsets = [t.bundle_offset for t in members]
    assert len(set(offsets)) < len(offsets)  # empty tensors share an offset with the next
    rewrites = [r for order in (members, members[::-1])  # ties in either order
                for r in bridge._bundle_rewrites(members[0].channel_key, order, 5.0)]
    for kind, _, node, key, *_, listed in rewrites:
        assert node == "" and key == members[0].channel_key and len(listed) == len(members)
        by_node = {getattr(t, f"{kind}_node"): t for t in plan.swapped()}
        end = 0
        for name, _, _, offset in listed:
            assert offset >= end, listed
            end = offset + by_node[name].bytes
