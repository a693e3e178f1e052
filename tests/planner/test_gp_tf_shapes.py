"""rdmadev.tools.tf_shapes: TF's own shape functions size the transfers of offline-planned graphs."""

import pytest

import gp_builders as B
import graph_pass as gp

import tensorflow as tf
from rdmadev.tools.tf_shapes import annotate  # noqa: E402
from rdmadev._core import PLANNER_RULES as RULES

PS, W0 = B.dev("ps"), B.dev("worker")


def recv_shapes(gds):
    return {n.name: gp.attrs.attr(n, "_output_shapes") for gd in gds for n in gd.node if n.op == "_Recv"}


def test_shapes_cross_partitions_both_ways():
    """ps reads w -> worker (ReadVariableOp: TF's handle shapes); worker's MatMul of it -> ps (next round)."""
    ps, w = B.Partition(PS), B.Partition(W0)
    ps.var("w", (4, 8))
    B.pair(ps, w, "edge_1_w", "w/read", recv_name="w/_recv")
    w.node("x", "_Arg", T=("type", B.FLOAT), _output_shapes=("shapes", [(2, 4)]), index=0)
    w.node("mm", "MatMul", ["x", "w/_recv"], T=("type", B.FLOAT))
    w.node("relu", "Relu", ["mm"], T=("type", B.FLOAT))
    B.pair(w, ps, "edge_2_relu", "relu", recv_name="relu/_recv")
    parts = [ps.gd, w.gd]
    before = gp.plan_partitions(parts, instance_id="i", rules=RULES)
    assert {t.reason for t in before.transfers} == {"not_carried_dynamic"}  # nothing says the shapes yet
    gds = annotate(parts)
    assert recv_shapes(gds) == {"w/_recv": [(4, 8)], "relu/_recv": [(2, 8)]}
    assert not any(n.attr["_output_shapes"].list.shape for n in ps.gd.node if n.op == "_Recv")  # input untouched
    plan = gp.plan_partitions(gds, instance_id="i", rules=RULES)
    assert sorted((t.tensor_name, t.shape, t.reason) for t in plan.transfers) == [
        ("edge_1_w", [4, 8], "static"), ("edge_2_relu", [2, 8], "static")]


def test_onednn_bias_gradient_shape_from_tf_is_wrong_and_skipped():
    """Regression (commit 3601043): TF's shape function for the fused op says [3] for an [8] bias gradient."""
    w, ps = B.Partition(W0), B.Partition(PS)
    w.node("x", "_Arg", T=("type", B.FLOAT), _output_shapes=("shapes", [(4, 16, 16, 3)]), index=0)
    w.node("dy", "_Arg", T=("type", B.FLOAT), _output_shapes=("shapes", [(4, 16, 16, 8)]), index=1)
    w.node("fs", "Const", dtype=("type", B.INT32), value=("tensor", (B.INT32, (4,), [3, 3, 3, 8])))
    g = w.node("g", "_MklNativeConv2DBackpropFilterWithBias", ["x", "fs", "dy"], T=("type", B.FLOAT), padding="SAME")
    g.attr["strides"].list.i.extend([1, 1, 1, 1])
    B.pair(w, ps, "edge_1_gf", "g", recv_name="gf/_recv")
    B.pair(w, ps, "edge_2_gb", "g:1", recv_name="gb/_recv")
    graph = tf.Graph()
    with graph.as_default():
        tf.graph_util.import_graph_def(tf.compat.v1.GraphDef.FromString(w.gd.SerializeToString()), name="")
    assert graph.get_operation_by_name("g").outputs[1].shape.as_list() == [3]  # TF's wrong answer (not 8)
    gds = annotate([w.gd, ps.gd])
    assert recv_shapes(gds) == {"gf/_recv": [(3, 3, 3, 8)], "gb/_recv": None}
    plan = gp.plan_partitions(gds, instance_id="i", rules=RULES)
    reasons = {t.tensor_name: (t.shape, t.reason) for t in plan.transfers}
    assert reasons == {"edge_1_gf": ([3, 3, 3, 8], "static"), "edge_2_gb": (None, "not_carried_dynamic")}


def test_partitions_the_importer_cannot_read_are_left_as_they_are():
    ps, w = B.Partition(PS), B.Partition(W0)
    ps.node("_EagerConst", "Const", dtype=("type", B.FLOAT), value=("tensor", (B.FLOAT, (3,), None)))
    B.pair(ps, w, "edge_1_c", "_EagerConst", recv_name="c/_recv")  # a name Python's importer refuses: renamed
    w.node("odd", "NoSuchOp", ["c/_recv"])
    B.pair(w, ps, "edge_2_odd", "odd", recv_name="odd/_recv")
    gds = annotate([ps.gd, w.gd])
    assert recv_shapes(gds) == {"c/_recv": [(3,)], "odd/_recv": None}


BOOL = 10
DYNAMIC = {"dynamic_shapes": True}


def bounds(gds):
    """{tensor_name: (the exact shape, the bound)} the annotation wrote on each pair's _Recv."""
    return {gp.attrs.attr(n, "tensor_name"): (gp.attrs.attr(n, "_output_shapes"), gp.attrs.attr(n, RULES.bound_attr))
            for gd in gds for n in gd.node if n.op == "_Recv"}


def test_unique_ids_bound_the_rows_gathered_for_them_on_the_other_task():
    """tf.unique of 2048 ids on the worker: at most 2048 ids go to ps, and the rows ps gathers
    for them come back as at most 2048 x 32 (the bound crosses to ps and back); unique's idx
    has a static shape, ids of unknown length no bound."""
    w, ps = B.Partition(W0), B.Partition(PS)
    w.node("ids", "_Arg", T=("type", B.INT64), _output_shapes=("shapes", [(2048,)]), index=0)
    w.node("any", "_Arg", T=("type", B.INT64), _output_shapes=("shapes", [(-1,)]), index=1)
    w.node("uniq", "Unique", ["ids"], T=("type", B.INT64), out_idx=("type", B.INT32))
    w.node("uniq_any", "Unique", ["any"], T=("type", B.INT64), out_idx=("type", B.INT32))
    B.pair(w, ps, "edge_1_ids", "uniq", dtype=B.INT64)
    B.pair(w, ps, "edge_2_idx", "uniq:1", dtype=B.INT32)
    B.pair(w, ps, "edge_3_any", "uniq_any", dtype=B.INT64)
    ps.node("table", "_Arg", T=("type", B.RESOURCE), _handle_shapes=("shapes", [(100000, 32)]),
            _handle_dtypes=("types", [B.FLOAT]), index=0)
    ps.node("rows", "ResourceGather", ["table", "edge_1_ids/_recv"], dtype=("type", B.FLOAT),
            Tindices=("type", B.INT64))
    B.pair(ps, w, "edge_4_rows", "rows")
    gds = annotate([w.gd, ps.gd])
    assert bounds(gds) == {"edge_1_ids": (None, [(2048,)]), "edge_2_idx": ([(2048,)], None),
                           "edge_3_any": (None, None), "edge_4_rows": (None, [(2048, 32)])}
    plan = gp.plan_partitions(gds, gp.Config(default_dynamic_capacity=1 << 20, carries=DYNAMIC), instance_id="i", rules=RULES)
    got = {t.tensor_name: (t.reason, t.bytes, t.bound_bytes, t.capacity_bytes, t.rank_capacity) for t in plan.transfers}
    assert got == {"edge_1_ids": ("dynamic_bounded", None, 2048 * 8, 2048 * 8, 1),
                   "edge_2_idx": ("static", 2048 * 4, None, 2048 * 4, None),
                   "edge_3_any": ("dynamic_bounded", None, None, 1 << 20, gp.Config().max_dynamic_rank),
                   "edge_4_rows": ("dynamic_bounded", None, 2048 * 32 * 4, 2048 * 32 * 4, 2)}
    assert "bound [2048, 32] from TF's shapes" in plan.transfer(plan.transfers[3].channel_key).detail


def test_rdmadev_plan_shows_the_bounds_and_the_slots_they_give(tmp_path, capsys):
    from rdmadev.tools import plan as cli
    w, ps = B.Partition(W0), B.Partition(PS)
    w.node("ids", "_Arg", T=("type", B.INT64), _output_shapes=("shapes", [(2048,)]), index=0)
    w.node("uniq", "Unique", ["ids"], T=("type", B.INT64), out_idx=("type", B.INT32))
    B.pair(w, ps, "edge_1_ids", "uniq", dtype=B.INT64)
    files = []
    for name, part in (("w.pb", w), ("ps.pb", ps)):
        files.append(tmp_path / name)
        files[-1].write_bytes(part.gd.SerializeToString())
    assert cli.main(["--graphdef", *map(str, files), "--carry", "dynamic_shapes",
                     "--default-dynamic-capacity", str(1 << 20)]) == 0
    row = [line for line in capsys.readouterr().out.splitlines() if line.startswith("edge_1_ids")]
    assert row and row[0].split()[5:9] == ["int64", "<=[2048]", "<=16384", "swap"], row


def test_a_bound_above_the_default_capacity_leaves_the_default():
    """A bound is what a tensor may reach: it only ever lowers the slots a channel starts with."""
    w, ps = B.Partition(W0), B.Partition(PS)
    w.node("ids", "_Arg", T=("type", B.INT64), _output_shapes=("shapes", [(2048,)]), index=0)
    w.node("uniq", "Unique", ["ids"], T=("type", B.INT64), out_idx=("type", B.INT32))
    B.pair(w, ps, "edge_1_ids", "uniq", dtype=B.INT64)
    gds = annotate([w.gd, ps.gd])
    small = gp.plan_partitions(gds, gp.Config(default_dynamic_capacity=4096, carries=DYNAMIC), instance_id="i", rules=RULES)
    assert (small.transfers[0].bound_bytes, small.transfers[0].capacity_bytes) == (16384, 4096)
    hinted = gp.Config(default_dynamic_capacity=1 << 20, capacity_hints={"edge_1_ids": 99}, carries=DYNAMIC)
    assert gp.plan_partitions(gds, hinted, instance_id="i", rules=RULES).transfers[0].capacity_bytes == 99
    none = gp.plan_partitions(gds, gp.Config(carries=DYNAMIC), instance_id="i", rules=RULES)  # no default: the bound
    assert (none.transfers[0].reason, none.transfers[0].capacity_bytes) == ("dynamic_bounded", 16384)


def test_where_dynamic_partition_setdiff_and_unique_along_an_axis_are_bounded_by_their_inputs():
    w, ps = B.Partition(W0), B.Partition(PS)
    w.node("mask", "_Arg", T=("type", BOOL), _output_shapes=("shapes", [(64, 3)]), index=0)
    w.node("where", "Where", ["mask"], T=("type", BOOL))
    w.node("data", "_Arg", T=("type", B.FLOAT), _output_shapes=("shapes", [(100, 8)]), index=1)
    w.node("parts", "_Arg", T=("type", B.INT32), _output_shapes=("shapes", [(100,)]), index=2)
    w.node("split", "DynamicPartition", ["data", "parts"], T=("type", B.FLOAT), num_partitions=2)
    w.node("x", "_Arg", T=("type", B.INT32), _output_shapes=("shapes", [(10,)]), index=3)
    w.node("y", "_Arg", T=("type", B.INT32), _output_shapes=("shapes", [(5,)]), index=4)
    w.node("diff", "ListDiff", ["x", "y"], T=("type", B.INT32), out_idx=("type", B.INT32))
    w.node("rows", "_Arg", T=("type", B.INT64), _output_shapes=("shapes", [(6, 4)]), index=5)
    w.node("axis", "Const", dtype=("type", B.INT64), value=("tensor", (B.INT64, (1,), None)))
    axis = [n for n in w.gd.node if n.name == "axis"][0]
    axis.attr["value"].tensor.int64_val.append(0)
    w.node("uniq_rows", "UniqueV2", ["rows", "axis"], T=("type", B.INT64), Taxis=("type", B.INT64),
           out_idx=("type", B.INT32))
    B.pair(w, ps, "edge_1_where", "where", dtype=B.INT64)
    B.pair(w, ps, "edge_2_part", "split:1")
    B.pair(w, ps, "edge_3_diff", "diff", dtype=B.INT32)
    B.pair(w, ps, "edge_4_uniq_rows", "uniq_rows", dtype=B.INT64)
    assert bounds(annotate([w.gd, ps.gd])) == {
        "edge_1_where": (None, [(192, 2)]), "edge_2_part": (None, [(100, 8)]),
        "edge_3_diff": (None, [(10,)]), "edge_4_uniq_rows": (None, [(6, 4)])}


@pytest.mark.parametrize("framed, named", [
    (b"\x05\x00\x00", "ends inside a length"),
    (b"\x10" + b"\x00" * 7 + b"short", "partition 0 is not a serialized GraphDef"),
    (b"\x03" + b"\x00" * 7 + b"\xff\xff\xff", "partition 0 is not a serialized GraphDef"),
])
def test_the_op_librarys_annotation_refuses_input_that_is_not_framed_graphdefs(framed, named):
    import ctypes
    from rdmadev.tools import tf_shapes
    lib, out = tf_shapes.library(), ctypes.c_void_p()
    assert lib.rdmadev_annotate_partitions(framed, len(framed), ctypes.byref(out)) == 1
    try:
        assert named in ctypes.string_at(out).decode()
    finally:
        lib.rdmadev_free(out)
