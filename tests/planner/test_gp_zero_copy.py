"""zero_copy: a received tensor may alias its slot only if every consumer keeps nothing."""
import graph_pass
from gp_builders import FLOAT, Partition, dev, pair, partitions

BIG = (256, 256)  # 256 KiB of float32: above Config.zero_copy_min_bytes (64 KiB by default)


def _plan(consumer_ops, shape=BIG):
    ps, w = Partition(dev("ps")), Partition(dev("worker"))
    ps.var("v", shape)
    pair(ps, w, "edge_1_v", "v/read", recv_name="v/_recv", shape=shape)
    for i, op in enumerate(consumer_ops):
        w.node(f"use{i}", op, ["v/_recv", "v/_recv"] if op == "MatMul" else ["v/_recv"], T=("type", FLOAT))
    (t,) = graph_pass.plan_partitions(partitions(ps, w)).transfers
    assert t.decision == "swap"
    return t


def test_consumers_that_keep_nothing_allow_zero_copy():
    assert _plan(["MatMul", "Relu"]).zero_copy is True


def test_any_aliasing_or_retaining_consumer_forbids_it():
    for risky in ("Identity", "Reshape", "StridedSlice", "_Retval", "AssignVariableOp"):
        assert _plan(["MatMul", risky]).zero_copy is False, risky


def _plan_chain(ops, last):
    """The received tensor goes through `ops` (each the only consumer of the one before) to `last`."""
    ps, w = Partition(dev("ps")), Partition(dev("worker"))
    ps.var("v", BIG)
    pair(ps, w, "edge_1_v", "v/read", recv_name="v/_recv", shape=BIG)
    prev = "v/_recv"
    for i, op in enumerate(ops + [last]):
        w.node(f"n{i}", op, [prev, prev] if op == "MatMul" else [prev], T=("type", FLOAT))
        prev = f"n{i}"
    (t,) = graph_pass.plan_partitions(partitions(ps, w)).transfers
    return t.zero_copy


def test_identities_are_looked_through():
    """TF1 graphs read a received variable through an Identity: what matters is its consumers."""
    assert _plan_chain(["Identity"], "MatMul") is True
    assert _plan_chain(["Identity", "Identity"], "Relu") is True
    assert _plan_chain(["Identity"], "_Retval") is False
    assert _plan_chain(["Identity"], "AssignVariableOp") is False
    assert _plan_chain(["Identity"] * 5, "MatMul") is False  # past MAX_FORWARDS: copied


def test_small_tensors_are_copied():
    assert _plan(["MatMul"], shape=(4, 4)).zero_copy is False


def test_zero_copy_round_trips_through_json():
    t = _plan(["MatMul"])
    plan = graph_pass.Plan.from_json(graph_pass.Plan(transfers=[t]).to_json())
    assert plan.transfers[0].zero_copy is True
