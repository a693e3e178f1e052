"""Transfer shapes come only from what TF wrote (``_output_shapes``, Const values); no op rules."""

import pytest

import gp_builders as B
import graph_pass as gp
from graph_pass.shapes import fully_defined
from rdmadev._core import PLANNER_RULES as RULES

trusted_output = RULES.trusted_output  # rules.h's TrustedOutput, through the bindings

PS, W0 = B.dev("ps"), B.dev("worker")
MKL_BIAS_GRAD = "_MklNativeConv2DBackpropFilterWithBias"


def sent(build, recv_shape=None, halves="both"):
    """Build the producer on worker0 with ``build(w)``, send it to ps; return the planned transfer."""
    ps, w = B.Partition(PS), B.Partition(W0)
    B.pair(w, ps, "edge_1_t", build(w), recv_name="t/_recv", shape=recv_shape)
    ps.node("use", "Identity", ["t/_recv"], T=("type", B.FLOAT))
    parts = {"both": (ps, w), "send": (w,), "recv": (ps,)}[halves]
    (t,) = gp.plan_partitions(B.partitions(*parts), gp.Config(carries={"half_pairs": True},
                                                               half_pair_capacity=1 << 20), rules=RULES).transfers
    return t


def arg(w, name, shape, index=0):
    return w.node(name, "_Arg", T=("type", B.FLOAT), _output_shapes=("shapes", [shape]), index=index).name


def test_recv_output_shapes_attr_is_authoritative():
    t = sent(lambda w: arg(w, "x", (9, 9)), recv_shape=(5,))
    assert (t.shape, t.bytes, t.shape_source) == ([5], 20, "_output_shapes of t/_recv")


def test_sender_side_arg_output_shapes_and_const_values():
    t = sent(lambda w: arg(w, "x", (2, 3)), halves="send")
    assert (t.shape, t.bytes, t.shape_source) == ([2, 3], 24, "_output_shapes of x")
    t = sent(lambda w: w.node("c", "Const", dtype=("type", B.FLOAT), value=("tensor", (B.FLOAT, (4,), None))).name)
    assert (t.shape, t.bytes, t.shape_source) == ([4], 16, "value of Const c")


def test_a_full_shape_wins_over_a_partial_one():
    t = sent(lambda w: arg(w, "x", (2, 3)), recv_shape=(-1, 3))
    assert (t.shape, t.shape_source) == ([2, 3], "_output_shapes of x")
    t = sent(lambda w: arg(w, "x", None), recv_shape=(-1, 3))
    assert (t.shape, t.bytes, t.reason) == ([-1, 3], None, "not_carried_dynamic")


def test_no_op_rules_an_op_without_tf_shapes_is_unknown():
    """A MatMul of known inputs is not sized by graph_pass: that is TF's shape function's job."""
    def build(w):
        return w.node("mm", "MatMul", [arg(w, "a", (2, 3)), arg(w, "b", (3, 5), 1)], T=("type", B.FLOAT)).name
    t = sent(build)
    assert (t.shape, t.bytes, t.decision, t.reason) == (None, None, "keep", "not_carried_dynamic")
    t = sent(build, recv_shape=(2, 5))  # what the native pass writes after TF's refiner
    assert (t.shape, t.bytes, t.reason) == ([2, 5], 40, "static")


def test_onednn_fused_bias_gradient_shape_is_not_trusted():
    """Regression (commit 3601043): TF's shape function for _MklNativeConv2DBackpropFilterWithBias
    gives the bias gradient (output 1) the conv's input channels (3) instead of its 8 outputs."""
    def build(w):
        w.node("g", MKL_BIAS_GRAD, [arg(w, "x", (4, 16, 16, 3))], T=("type", B.FLOAT),
               _output_shapes=("shapes", [(3, 3, 3, 8), (3,)]))
        return "g:1"
    t = sent(build, halves="send")
    assert (t.shape, t.bytes) == (None, None) and "not trusted" in t.shape_source
    assert not trusted_output(MKL_BIAS_GRAD, 1) and trusted_output(MKL_BIAS_GRAD, 0)
    assert trusted_output("SomeOp", 1) and trusted_output("_MklMatMul", 0)
    for op in ("_MklNativeFusedBatchNormV3", "_MklFusedBatchNormGradV3"):  # statistics, scale/offset grads: [C]
        assert trusted_output(op, 1) and trusted_output(op, 2) and not trusted_output(op, 3)
    t = sent(lambda w: (build(w), "g")[1], halves="send")  # output 0 (the filter gradient) is trusted
    assert t.shape == [3, 3, 3, 8]


@pytest.mark.parametrize("shape,expected", [((2, 3), True), ((), True), ((-1, 3), False), (None, False)])
def test_fully_defined(shape, expected):
    assert fully_defined(shape) is expected
