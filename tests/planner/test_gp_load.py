"""load: inputs in every accepted form, errors, and the no-pair fast path."""

import pytest

import gp_builders as B
import graph_pass as gp
from graph_pass import _proto
from graph_pass.attrs import attr, parse_input, tensor_shape
from rdmadev._core import PLANNER_RULES as RULES


def test_bytes_and_messages_give_the_same_graph_and_plan():
    ps, (w,) = B.ps_worker_step()
    g1 = gp.load(B.partitions(ps, w))
    g2 = gp.load(B.partitions(ps, w, as_bytes=True))
    g3 = gp.load([ps.gd, w.gd])  # a list: partition labels come from the nodes' devices
    assert sorted(g1.nodes) == sorted(g2.nodes) == sorted(g3.nodes)
    assert sorted((u, v, d["dst_input"]) for u, v, d in g1.edges(data=True)) == \
        sorted((u, v, d["dst_input"]) for u, v, d in g2.edges(data=True))
    p1 = gp.plan_partitions(B.partitions(ps, w), instance_id="i", rules=RULES)
    p2 = gp.plan_partitions(B.partitions(ps, w, as_bytes=True), instance_id="i", rules=RULES)
    assert p1.to_json() == p2.to_json()


def test_nodes_keep_op_device_and_an_empty_namespace():
    ps, (w,) = B.ps_worker_step()
    g = gp.load(B.partitions(ps, w))
    data = g.nodes[(B.dev("worker"), "mm")]
    assert data["op"] == "MatMul" and data["device"] == B.dev("worker") and data[gp.NS] == {}
    ins = sorted((u[1], d["dst_input"]) for u, _, d in g.in_edges((B.dev("worker"), "mm"), data=True))
    assert ins == [("w_read/_recv0", 1), ("x", 0)]
    assert g.graph[gp.NS]["partitions"] == [B.dev("ps"), B.dev("worker")]


def test_control_inputs_become_control_edges():
    p = B.Partition(B.dev("worker"))
    p.node("a", "NoOp")
    p.node("b", "NoOp", ["^a"])
    g = gp.load(p.gd)
    (_, _, d), = g.edges(data=True)
    assert d["control"] is True and d["dst_input"] == -1


def test_bad_bytes_raise_load_error_naming_the_partition():
    with pytest.raises(gp.LoadError, match="partition /job:ps.*not a serialized GraphDef"):
        gp.load({"/job:ps/replica:0/task:0/device:CPU:0": b"\xff\xff\xff\xff"})


def test_unsupported_input_type():
    with pytest.raises(gp.LoadError, match="expected a GraphDef"):
        gp.load([42])
    with pytest.raises(gp.LoadError, match="expected partition graphs"):
        gp.load(42)


def test_dangling_input_names_node_and_input():
    p = B.Partition(B.dev("worker"))
    p.node("b", "Relu", ["missing:0"])
    with pytest.raises(gp.LoadError, match="node 'b' has input 'missing:0'"):
        gp.load(p.gd)


def test_duplicate_node_name():
    p = B.Partition(B.dev("worker"))
    p.node("a", "NoOp")
    p.node("a", "NoOp")
    with pytest.raises(gp.LoadError, match="'a' appears twice"):
        gp.load(p.gd)


def test_fast_path_skips_parsing_when_no_pair_op_exists(monkeypatch):
    p = B.Partition("/job:localhost/replica:0/task:0/device:CPU:0")
    p.node("x", "_Arg", T=("type", B.FLOAT), index=0)
    p.node("y", "Relu", ["x"])
    data = B.partitions(p, as_bytes=True)
    assert gp.may_have_transfers(data, RULES) is False
    assert gp.may_have_transfers(B.partitions(p), RULES) is False

    def boom(_):
        raise AssertionError("load must not run on the fast path")

    monkeypatch.setattr("graph_pass.pipeline.load", boom)
    plan = gp.plan_partitions(data, rules=RULES)
    assert plan.transfers == [] and plan.regions == [] and plan.tasks == []
    gp.validate(plan)


def test_fast_path_is_exact_for_pair_ops():
    ps, (w,) = B.ps_worker_step()
    assert gp.may_have_transfers(B.partitions(ps, w, as_bytes=True), RULES)
    assert gp.may_have_transfers(B.partitions(ps, w), RULES)


@pytest.mark.parametrize("op", sorted(RULES.send_ops | RULES.recv_ops))
def test_fast_path_sees_every_pair_op_alone(op):
    """A partition whose only pair op is a _HostSend or _HostRecv (a GPU task's host-memory
    tensors) is planned: neither name contains "_Send" or "_Recv"."""
    p = B.Partition("/job:worker/replica:0/task:0/device:GPU:0")
    p.node("x", "_Arg", T=("type", B.INT32), index=0)
    p.node("half", op, ["x"] if op in RULES.send_ops else [], T=("type", B.INT32))
    assert gp.may_have_transfers(B.partitions(p, as_bytes=True), RULES)
    assert gp.may_have_transfers(B.partitions(p), RULES)


def test_partition_sets_from_run_metadata_bytes():
    ps, (w,) = B.ps_worker_step()
    md = _proto.RunMetadata()
    fg = md.function_graphs.add()
    fg.partition_graphs.extend([ps.gd, w.gd])
    md.function_graphs.add()  # an instantiation with no partitions is skipped
    md.partition_graphs.extend([ps.gd, w.gd])  # eager metadata repeats them at top level
    sets = gp.partition_sets(md.SerializeToString())
    assert len(sets) == 1 and [len(g.node) for g in sets[0]] == [len(ps.gd.node), len(w.gd.node)]
    tf1 = _proto.RunMetadata()
    tf1.partition_graphs.extend([ps.gd])  # TF1 sessions: only top-level partitions
    assert len(gp.partition_sets(tf1)) == 1
    with pytest.raises(gp.LoadError, match="got a whole RunMetadata"):
        gp.load(md)
    with pytest.raises(gp.LoadError, match="not a serialized RunMetadata"):
        gp.partition_sets(b"\xff\xff")


def test_attr_helpers():
    p = B.Partition(B.dev("ps"))
    nd = p.node("c", "Const", value=("tensor", (B.INT32, (3,), [2, 3, 4])), flag=True, n=5, s="abc",
                shp=("shape", (2, -1)), unk=("shape", None), shapes=("shapes", [(1,), None]))
    assert attr(nd, "flag") is True and attr(nd, "n") == 5 and attr(nd, "s") == "abc"
    assert attr(nd, "shp") == (2, -1) and attr(nd, "unk") is None and attr(nd, "missing", 9) == 9
    assert attr(nd, "shapes") == [(1,), None]
    assert tensor_shape(attr(nd, "value")) == (3,)
    assert parse_input("^a") == ("a", -1, True) and parse_input("a:2") == ("a", 2, False)
    assert parse_input("scope/a") == ("scope/a", 0, False)
