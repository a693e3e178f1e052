"""Shape inference rules used to size transfers."""

import pytest

import gp_builders as B
import graph_pass as gp
from graph_pass.shapes import broadcast, merge

PS, W0 = B.dev("ps"), B.dev("worker")


def shape_of(build):
    """Build ``src`` on worker0 with ``build(w)`` and return the shape of the tensor sent to ps."""
    ps, w = B.Partition(PS), B.Partition(W0)
    src = build(w)
    B.pair(w, ps, "edge_1_t", src, recv_name="t/_recv")
    ps.node("use", "Identity", ["t/_recv"])
    (t,) = gp.find_transfers(gp.load(B.partitions(ps, w)))
    return None if t.shape is None else tuple(t.shape)


def arg(w, name, shape, index=0):
    return w.node(name, "_Arg", T=("type", B.FLOAT), _output_shapes=("shapes", [shape]), index=index).name


def const_ints(w, name, values):
    return w.node(name, "Const", dtype=("type", B.INT32), value=("tensor", (B.INT32, (len(values),), values))).name


@pytest.mark.parametrize("a,b,ta,tb,expected", [((2, 3), (3, 5), False, False, (2, 5)),
                                                ((3, 2), (3, 5), True, False, (2, 5)),
                                                ((2, 3), (4, 3), False, True, (2, 4))])
def test_matmul_with_transposes(a, b, ta, tb, expected):
    def build(w):
        return w.node("mm", "_MklMatMul", [arg(w, "a", a), arg(w, "b", b, 1)], transpose_a=ta, transpose_b=tb).name
    assert shape_of(build) == expected


def test_batch_matmul_broadcasts_batch_dims():
    def build(w):
        return w.node("bmm", "BatchMatMulV2", [arg(w, "a", (7, 1, 2, 3)), arg(w, "b", (6, 3, 4), 1)]).name
    assert shape_of(build) == (7, 6, 2, 4)


def test_reshape_resolves_minus_one():
    def build(w):
        return w.node("r", "Reshape", [arg(w, "x", (4, 6)), const_ints(w, "s", [-1, 3])]).name
    assert shape_of(build) == (8, 3)


@pytest.mark.parametrize("keep,expected", [(False, (2,)), (True, (2, 1, 1))])
def test_reduction_with_const_axes(keep, expected):
    def build(w):
        return w.node("s", "Sum", [arg(w, "x", (2, 3, 4)), const_ints(w, "ax", [1, -1])], keep_dims=keep).name
    assert shape_of(build) == expected


def test_elementwise_broadcast_and_unknown_dims():
    def build(w):
        return w.node("add", "AddV2", [arg(w, "x", (-1, 1, 5)), arg(w, "y", (3, 1), 1)]).name
    assert shape_of(build) == (-1, 3, 5)


def test_conv_gradients_from_const_sizes_and_bias_grad():
    def conv(w):
        return w.node("gf", "Conv2DBackpropFilter",
                      [arg(w, "x", (8, 32, 32, 3)), const_ints(w, "fs", [3, 3, 3, 64]), arg(w, "dy", (8, 32, 32, 64), 1)]).name

    def bias(w):
        return w.node("gb", "BiasAddGrad", [arg(w, "dy", (8, 32, 32, 64))]).name
    assert shape_of(conv) == (3, 3, 3, 64)
    assert shape_of(bias) == (64,)


def test_fused_batch_norm_grad_outputs():
    def build(w):
        w.node("fbg", "FusedBatchNormGradV3", [arg(w, "dy", (8, 4, 4, 16)), arg(w, "x", (8, 4, 4, 16), 1),
                                               arg(w, "scale", (16,), 2)])
        return "fbg:1"
    assert shape_of(build) == (16,)


def test_fused_batch_norm_statistics_outputs():
    def build(w):
        w.node("fbn", "FusedBatchNormV3", [arg(w, "x", (8, 4, 4, 16)), arg(w, "scale", (16,), 1)])
        return "fbn:2"
    assert shape_of(build) == (16,)


def test_unknown_op_gives_unknown_shape():
    def build(w):
        return w.node("weird", "SomeCustomOp", [arg(w, "x", (2, 2))]).name
    assert shape_of(build) is None


def test_declared_output_shapes_win():
    def build(w):
        return w.node("weird", "SomeCustomOp", [arg(w, "x", (2, 2))], _output_shapes=("shapes", [(9, 9)])).name
    assert shape_of(build) == (9, 9)


def test_receiver_side_rules_size_a_half_graph():
    """With only the receiving half loaded, consumers give the shape (_input_shapes, Assign*)."""
    ps = B.Partition(PS)
    ps.node("v/resource", "_Arg", T=("type", B.RESOURCE), _handle_shapes=("shapes", [(4, 8)]), index=0)
    ps.recv("g/_recv", "edge_1_g", W0)
    ps.node("apply", "AssignSubVariableOp", ["v/resource", "g/_recv"])
    ps.recv("h/_recv", "edge_2_h", W0)
    ps.node("fused", "_MklNativeFusedMatMul", ["h/_recv", "h/_recv"], _input_shapes=("shapes", [(2, 2), (2, 2)]))
    t1, t2 = gp.find_transfers(gp.load(ps.gd))
    assert (t1.shape, t1.bytes, t1.shape_source) == ([4, 8], 128, "variable assigned by apply")
    assert (t2.shape, t2.shape_source) == ([2, 2], "_input_shapes of fused")


def test_recv_output_shapes_attr_is_authoritative():
    ps = B.Partition(PS)
    r = ps.recv("g/_recv", "edge_1_g", W0)
    r.attr["_output_shapes"].list.shape.add().dim.add(size=5)
    (t,) = gp.find_transfers(gp.load(ps.gd))
    assert t.shape == [5] and t.bytes == 20


def test_merge_and_broadcast_helpers():
    assert merge((2, -1), (-1, 3)) == (2, 3) and merge(None, (1,)) == (1,) and merge((1,), (1, 2)) == (1,)
    assert broadcast((2, 1), (3,)) == (2, 3) and broadcast((2,), (3,)) is None and broadcast(None, (1,)) is None
    assert broadcast((-1,), (4,)) == (4,) and broadcast((-1,), (1,)) == (-1,)
