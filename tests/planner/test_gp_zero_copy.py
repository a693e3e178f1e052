"""zero_copy: a received tensor may alias its slot only if every consumer keeps nothing."""
import graph_pass
from gp_builders import FLOAT, Partition, dev, pair, partitions
from rdmadev._core import PLANNER_RULES as RULES

BIG = (256, 256)  # 256 KiB of float32: above Config.zero_copy_min_bytes (64 KiB by default)


def _plan(consumer_ops, shape=BIG):
    ps, w = Partition(dev("ps")), Partition(dev("worker"))
    ps.var("v", shape)
    pair(ps, w, "edge_1_v", "v/read", recv_name="v/_recv", shape=shape)
    for i, op in enumerate(consumer_ops):
        w.node(f"use{i}", op, ["v/_recv", "v/_recv"] if op == "MatMul" else ["v/_recv"], T=("type", FLOAT))
    (t,) = graph_pass.plan_partitions(partitions(ps, w), rules=RULES).transfers
    assert t.decision == "swap"
    return t


def test_consumers_that_keep_nothing_allow_zero_copy():
    assert _plan(["MatMul", "Relu"]).zero_copy is True


def test_any_retaining_consumer_or_view_that_is_a_result_forbids_it():
    # A view (Identity, Reshape, StridedSlice) with no consumer is the function's result.
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
    (t,) = graph_pass.plan_partitions(partitions(ps, w), rules=RULES).transfers
    return t.zero_copy


def test_identities_are_looked_through():
    """TF1 graphs read a received variable through an Identity: what matters is its consumers."""
    assert _plan_chain(["Identity"], "MatMul") is True
    assert _plan_chain(["Identity", "Identity"], "Relu") is True
    assert _plan_chain(["Identity"], "_Retval") is False
    assert _plan_chain(["Identity"], "AssignVariableOp") is False
    assert _plan_chain(["Identity"] * 5, "MatMul") is False  # past MAX_VIEWS: copied


VIEWS = ("Reshape", "ExpandDims", "Squeeze", "Slice", "StridedSlice", "Cast", "Transpose", "Pack",
         "_MklTranspose", "_MklConjugateTranspose")  # the last two: oneDNN's renamed transposes


def test_views_are_looked_through_like_identities():
    """Each op whose output may be a view of its input's buffer is safe exactly when what
    consumes the view keeps nothing (tests/e2e: the views scenario runs each in TF)."""
    for view in VIEWS:
        assert _plan_chain([view], "MatMul") is True, view
        assert _plan_chain([view, "Identity"], "MatMul") is True, view
        assert _plan_chain([view], "_Retval") is False, view
        assert _plan_chain([view], "AssignVariableOp") is False, view


def test_a_reduction_may_return_its_input():
    """TF's reductions return their input's buffer when every reduced dimension has size 1."""
    assert _plan_chain(["Sum"], "MatMul") is True
    assert _plan_chain(["Mean"], "_Retval") is False


def test_past_a_slice_ops_that_compute_in_place_are_views():
    """A slice is a SubBuffer, which TF counts as owning memory: an elementwise op may write
    its result into it, and that result is then the slot (tests/e2e: the views scenario's
    variable assigned from a slice plus one). The slot's own buffer is never written in place."""
    assert _plan_chain(["StridedSlice", "AddV2"], "MatMul") is True
    assert _plan_chain(["StridedSlice", "AddV2"], "_Retval") is False
    assert _plan_chain(["Slice", "Relu"], "AssignVariableOp") is False
    assert _plan_chain(["Reshape", "AddV2"], "_Retval") is True
    assert _plan_chain(["AddV2"], "AssignVariableOp") is True


def test_a_views_shape_or_bounds_input_is_only_read():
    """A received tensor that is the shape of a Reshape (or the bounds of a slice) is read by
    it, not viewed: the Reshape's result may outlive the step without holding the slot."""
    for op in ("Reshape", "StridedSlice"):
        ps, w = Partition(dev("ps")), Partition(dev("worker"))
        ps.var("v", BIG)
        pair(ps, w, "edge_1_v", "v/read", recv_name="v/_recv", shape=BIG)
        w.node("x", "Placeholder", dtype=("type", FLOAT))
        w.node("view", op, ["x", "v/_recv"], T=("type", FLOAT))
        w.node("out", "_Retval", ["view"], T=("type", FLOAT))
        (t,) = graph_pass.plan_partitions(partitions(ps, w), rules=RULES).transfers
        assert t.zero_copy is True, op


def test_stitching_gathered_rows_keeps_nothing():
    """A sharded embedding lookup stitches each shard's rows into a fresh tensor."""
    for stitch in ("DynamicStitch", "ParallelDynamicStitch"):
        assert _plan([stitch]).zero_copy is True, stitch


def test_segment_reductions_keep_nothing():
    """Segment reductions (an embedding bag's combiner) sum rows into a fresh tensor."""
    for reduce in ("UnsortedSegmentSum", "SparseSegmentSum", "SparseSegmentMeanWithNumSegments"):
        assert _plan([reduce]).zero_copy is True, reduce


def test_concatenation_keeps_nothing():
    """ConcatV2 copies every input into a fresh tensor; its axis input is only read."""
    assert _plan(["ConcatV2"]).zero_copy is True
    assert _plan_chain(["ConcatV2"], "_Retval") is True


def test_a_pack_is_a_view_of_its_first_input_only():
    """A Pack of one tensor returns it reshaped (followed, as a view); a Pack of several
    copies each, so a received tensor that is not its first input is only read."""
    assert _plan_chain(["Pack"], "_Retval") is False
    ps, w = Partition(dev("ps")), Partition(dev("worker"))
    ps.var("v", BIG)
    pair(ps, w, "edge_1_v", "v/read", recv_name="v/_recv", shape=BIG)
    w.node("x", "Placeholder", dtype=("type", FLOAT))
    w.node("packed", "Pack", ["x", "v/_recv"], T=("type", FLOAT), N=("i", 2))
    w.node("out", "_Retval", ["packed"], T=("type", FLOAT))
    (t,) = graph_pass.plan_partitions(partitions(ps, w), rules=RULES).transfers
    assert t.zero_copy is True


def test_small_tensors_are_copied():
    assert _plan(["MatMul"], shape=(4, 4)).zero_copy is False


def test_zero_copy_round_trips_through_json():
    t = _plan(["MatMul"])
    plan = graph_pass.Plan.from_json(graph_pass.Plan(transfers=[t]).to_json())
    assert plan.transfers[0].zero_copy is True
