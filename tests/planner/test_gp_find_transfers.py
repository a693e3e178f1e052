"""find_transfers on synthetic partition graphs: which pairs are found and what is recorded."""

import pytest

import gp_builders as B
import graph_pass as gp
from graph_pass.explain import format_table
from rdmadev._core import PLANNER_RULES as RULES

PS, W0, W1 = B.dev("ps"), B.dev("worker", 0), B.dev("worker", 1)


def find(*parts):
    g = gp.load(B.partitions(*parts))
    return g, gp.find_transfers(g, rules=RULES)


def test_no_cross_task_pair():
    w = B.Partition(W0)
    gpu = B.Partition(B.dev("worker", 0, "GPU"))
    w.node("a", "Const", dtype=("type", B.FLOAT), value=("tensor", (B.FLOAT, (4,), None)))
    B.pair(w, gpu, "edge_1_a", "a")  # CPU -> GPU on one task: not cross-task traffic
    gpu.node("b", "Relu", ["edge_1_a/_recv"])
    g, transfers = find(w, gpu)
    assert transfers == []
    assert g.graph[gp.NS]["same_task_pairs"] == 2
    plan = gp.validate(gp.plan_regions(transfers, rules=RULES))
    assert plan.transfers == [] and plan.tasks == [] and plan.instance_id is None


def test_diamond_across_two_tasks():
    """a on ps feeds b and c on worker0 (one pair: TF sends once per destination); b, c feed d on ps."""
    ps, w = B.Partition(PS), B.Partition(W0)
    ps.var("a", (16, 16))
    B.pair(ps, w, "edge_1_a", "a/read", recv_name="a/_recv", shape=(16, 16))
    w.node("b", "Relu", ["a/_recv"])
    w.node("c", "Neg", ["a/_recv"])
    B.pair(w, ps, "edge_2_b", "b", recv_name="b/_recv", shape=(16, 16))
    B.pair(w, ps, "edge_3_c", "c", recv_name="c/_recv", shape=(16, 16))
    ps.node("d", "AddV2", ["b/_recv", "c/_recv"])
    g, transfers = find(ps, w)
    assert [(t.tensor_name, t.send_task, t.recv_task) for t in transfers] == [
        ("edge_1_a", "/job:ps/replica:0/task:0", "/job:worker/replica:0/task:0"),
        ("edge_2_b", "/job:worker/replica:0/task:0", "/job:ps/replica:0/task:0"),
        ("edge_3_c", "/job:worker/replica:0/task:0", "/job:ps/replica:0/task:0")]
    for t in transfers:
        assert t.halves == "both" and t.kind == "data" and t.dtype == "DT_FLOAT"
        assert t.shape == [16, 16] and t.bytes == 1024
    # shapes are what TF's refiner wrote on each _Recv (the native pass does it before planning)
    assert [t.shape_source for t in transfers] == [f"_output_shapes of {n}/_recv" for n in "abc"]
    # results on the graph: a transfer edge send -> recv and the channel on both ends
    edges = [(u[1], v[1]) for u, v, d in g.edges(data=True) if d.get("transfer")]
    assert sorted(edges) == [("edge_1_a/_send", "a/_recv"), ("edge_2_b/_send", "b/_recv"), ("edge_3_c/_send", "c/_recv")]
    assert g.nodes[(W0, "a/_recv")][gp.NS] == {"channel_id": transfers[0].channel_id, "end": "recv",
                                                 "client_terminated": False}
    plan = gp.validate(gp.plan_regions(transfers, instance_id="i", graph=g, rules=RULES), g)
    assert [r.region_id for r in plan.regions] == [
        "/job:ps/replica:0/task:0<-/job:worker/replica:0/task:0", "/job:worker/replica:0/task:0<-/job:ps/replica:0/task:0"]
    assert g.nodes[(PS, "b/_recv")][gp.NS]["decision"] == "swap"


def test_one_tensor_to_two_tasks_is_two_transfers():
    ps, w0, w1 = B.Partition(PS), B.Partition(W0), B.Partition(W1)
    ps.var("v", (1000,))
    B.pair(ps, w0, "edge_5_v", "v/read", shape=(1000,))
    B.pair(ps, w1, "edge_6_v", "v/read", shape=(1000,))
    _, transfers = find(ps, w0, w1)
    assert len(transfers) == 2 and len({t.channel_id for t in transfers}) == 2
    assert {t.recv_task for t in transfers} == {"/job:worker/replica:0/task:0", "/job:worker/replica:0/task:1"}
    assert all(t.bytes == 4000 and t.src == "v/read" for t in transfers)
    plan = gp.validate(gp.plan_regions(transfers, instance_id="i", rules=RULES))
    assert [b.task for b in plan.tasks] == ["/job:worker/replica:0/task:0", "/job:worker/replica:0/task:1"]
    t = plan.transfers[0]
    assert (t.slot_bytes, t.payload_offset, t.slots) == (64 + 4032, 64, 1)  # 4000 B rounded up to 64
    assert all(b.total_bytes == 4096 for b in plan.tasks)  # 1 slot of 4096 B, already page-aligned


def test_control_edge_pairs_are_signals():
    ps, w = B.Partition(PS), B.Partition(W0)
    ps.node("update", "NoOp")
    B.control_pair(ps, w, "edge_9_update", "update", "next_step")
    _, transfers = find(ps, w)
    (t,) = transfers
    assert t.kind == "control" and t.shape == [0] and t.bytes == 0 and t.src == "update" and t.dst == "next_step"
    plan = gp.validate(gp.plan_regions(transfers, instance_id="i", rules=RULES))
    (t,) = plan.transfers
    assert (t.decision, t.reason, t.slot_bytes, t.capacity_bytes) == ("swap", "control_signal", 64, 0)
    # each half alone recognises the control pair too
    assert find(ps)[1][0].kind == "control"
    assert find(w)[1][0].kind == "control"


def test_a_real_empty_data_tensor_is_not_a_control_signal():
    ps, w = B.Partition(PS), B.Partition(W0)
    ps.node("x", "_Arg", T=("type", B.FLOAT), _output_shapes=("shapes", [(0, 3)]), index=0)
    B.pair(ps, w, "edge_1_x", "x", recv_name="x/_recv")
    w.node("y", "Relu", ["x/_recv"])
    (t,) = find(ps, w)[1]
    assert t.kind == "data" and t.bytes == 0
    (r,) = find(w)[1]
    assert r.kind == "data"


def test_client_terminated_and_client_task_pairs_are_kept():
    client = "/job:localhost/replica:0/task:0/device:CPU:0"
    w = B.Partition(W0)
    w.recv("feed", "x:0", client, client=True)  # TF1 feed
    w.node("y", "Relu", ["feed"])
    w.send("fetch", "y", "y:0", client, client=True)
    chief = B.Partition(B.dev("chief"))
    chief.node("arg", "_Arg", T=("type", B.FLOAT), _output_shapes=("shapes", [(2,)]), index=0)
    B.pair(chief, w, "edge_3_arg", "arg")
    _, transfers = find(w, chief)
    reasons = {t.tensor_name: t for t in gp.plan_regions(transfers, instance_id="i", rules=RULES).transfers}
    assert reasons["x:0"].reason == reasons["y:0"].reason == "client_terminated"
    assert reasons["x:0"].client_terminated and reasons["x:0"].halves == "recv"
    assert reasons["edge_3_arg"].reason == "client_task" and reasons["edge_3_arg"].decision == "keep"
    configured = gp.plan_regions(transfers, gp.Config(plan_client_pairs=True), instance_id="i", rules=RULES)
    by_name = {t.tensor_name: t for t in configured.transfers}
    assert by_name["edge_3_arg"].decision == "swap" and by_name["x:0"].decision == "keep"
    gp.validate(configured)


def test_dynamic_shapes():
    ps, w = B.Partition(PS), B.Partition(W0)
    ps.node("batch", "_Arg", T=("type", B.FLOAT), _output_shapes=("shapes", [(-1, 4)]), index=0)
    ps.node("blob", "_Arg", T=("type", B.FLOAT), _output_shapes=("shapes", [None]), index=1)
    B.pair(ps, w, "edge_1_batch", "batch")
    B.pair(ps, w, "edge_2_blob", "blob")
    _, transfers = find(ps, w)
    assert [(t.shape, t.bytes) for t in transfers] == [([-1, 4], None), (None, None)]
    plan = gp.validate(gp.plan_regions(transfers, instance_id="i", rules=RULES))
    assert [t.reason for t in plan.transfers] == ["not_carried_dynamic", "not_carried_dynamic"]
    dyn = {"dynamic_shapes": True}
    plan = gp.validate(gp.plan_regions(transfers, gp.Config(carries=dyn), instance_id="i", rules=RULES))
    assert [t.reason for t in plan.transfers] == ["dynamic_unbounded", "dynamic_unbounded"]
    cfg = gp.Config(capacity_hints={"edge_1_batch": 4096}, default_dynamic_capacity=100, carries=dyn)
    plan = gp.validate(gp.plan_regions(transfers, cfg, instance_id="i", rules=RULES))
    b, blob = plan.transfers
    assert (b.reason, b.capacity_bytes, b.rank_capacity) == ("dynamic_bounded", 4096, 2)
    # header 64 + shape block (8 + 2*8 -> 64) + payload 4096
    assert (b.payload_offset, b.slot_bytes) == (128, 128 + 4096)
    assert (blob.capacity_bytes, blob.rank_capacity) == (100, gp.Config().max_dynamic_rank)
    assert (blob.payload_offset, blob.slot_bytes) == (64 + 128, 64 + 128 + 128)
    hinted_by_src = gp.plan_regions(transfers, gp.Config(capacity_hints={"batch": 64}, carries=dyn), instance_id="i", rules=RULES)
    assert hinted_by_src.transfers[0].capacity_bytes == 64


@pytest.mark.parametrize("dtype,name", [(B.STRING, "DT_STRING"), (B.VARIANT, "DT_VARIANT"),
                                        (B.RESOURCE, "DT_RESOURCE"), (101, "DT_FLOAT_REF"), (99, "DT_UNKNOWN_99")])
def test_non_plain_dtypes_stay_on_grpc(dtype, name):
    ps, w = B.Partition(PS), B.Partition(W0)
    ps.node("h", "_Arg", T=("type", dtype), _output_shapes=("shapes", [()]), index=0)
    B.pair(ps, w, "edge_1_h", "h", dtype=dtype)
    (t,) = gp.plan_regions(find(ps, w)[1], instance_id="i", rules=RULES).transfers
    assert (t.dtype, t.decision, t.reason) == (name, "keep", "non_plain_dtype")


def test_host_send_recv_are_pairs_too():
    ps, w = B.Partition(PS), B.Partition(W0)
    ps.var("v", (8,))
    ps.send("v/_hs", "v/read", "edge_1_v", W0, op="_HostSend")
    w.recv("v/_hr", "edge_1_v", PS, op="_HostRecv", shape=(8,))
    (t,) = find(ps, w)[1]
    assert (t.send_op, t.recv_op, t.bytes) == ("_HostSend", "_HostRecv", 32)


def test_dtype_mismatch_between_halves_is_an_error():
    ps, w = B.Partition(PS), B.Partition(W0)
    ps.var("v", (8,))
    ps.send("s", "v/read", "edge_1_v", W0, dtype=B.FLOAT)
    w.recv("r", "edge_1_v", PS, dtype=B.INT64)
    with pytest.raises(gp.PlanError, match="_Send 's' has T=DT_FLOAT but _Recv 'r' has tensor_type=DT_INT64"):
        find(ps, w)


def test_duplicate_rendezvous_key_is_an_error():
    ps, w = B.Partition(PS), B.Partition(W0)
    ps.var("v", (8,))
    ps.send("s1", "v/read", "edge_1_v", W0)
    ps.send("s2", "v/read", "edge_1_v", W0)
    with pytest.raises(gp.PlanError, match="'s1' and 's2' share the rendezvous key"):
        find(ps, w)


def test_missing_rendezvous_attr_is_an_error():
    ps = B.Partition(PS)
    ps.node("x", "NoOp")
    ps.node("s", "_Send", ["x"], T=("type", B.FLOAT), tensor_name="t", send_device=PS)
    with pytest.raises(gp.PlanError, match=r"_Send node 's' .* lacks attr\(s\) \['recv_device', 'send_device_incarnation'\]"):
        find(ps)


def test_pairs_inside_while_loops_are_kept_by_each_half():
    """Lowered while loops, as TF partitions them: the ps reads v inside an outer loop's frame
    (after an inner loop's Exit: still in the outer frame), and the worker's _Recv of it takes a
    control input from its own copy of the frame (TF's "_cloop" nodes). A pair after the outer
    Exit is outside every loop. Each half tells alone, as TF1 halves must."""
    ps, w = B.Partition(PS), B.Partition(W0)
    ps.var("v", (4,))
    ps.node("outer/enter", "Enter", ["v/read"], frame_name="outer")
    ps.node("inner/enter", "Enter", ["outer/enter"], frame_name="inner")
    ps.node("inner/exit", "Exit", ["inner/enter"])
    ps.node("body/y", "Identity", ["inner/exit"])
    ps.node("outer/exit", "Exit", ["body/y"])
    ps.node("after", "Identity", ["outer/exit"])
    ps.send("in/_send", "body/y", "edge_1_in", W0)
    ps.send("out/_send", "after", "edge_2_out", W0)
    w.node("_cloop/x", "Const")
    w.node("_cloop/enter", "Enter", ["_cloop/x"], frame_name="outer")
    w.node("_cloop/merge", "Merge", ["_cloop/enter", "_cloop/next"])
    w.node("_cloop/next", "NextIteration", ["_cloop/merge"])  # the back edge: a cycle
    w.recv("in/_recv", "edge_1_in", PS, shape=(4,)).input.append("^_cloop/merge")
    w.recv("out/_recv", "edge_2_out", PS, shape=(4,))
    for parts in ((ps, w), (ps,), (w,)):
        assert {t.tensor_name: t.in_loop for t in find(*parts)[1]} == {"edge_1_in": True, "edge_2_out": False}
    plan = gp.plan_partitions(B.partitions(ps, w), instance_id="i", rules=RULES)
    assert {t.tensor_name: (t.decision, t.reason) for t in plan.transfers} == {
        "edge_1_in": ("keep", "in_loop"), "edge_2_out": ("swap", "static")}
    # Ops that carry loops and dead tensors (the exit iteration's) swap a loop's pairs; in_loop
    # stays set, for the pass to label TF's nodes and run the loop in order (rdmadev.tf.bridge).
    for carries, swapped in (({"loops": True}, False), ({"dead_tensors": True}, False),
                             ({"loops": True, "dead_tensors": True}, True)):
        plan = gp.plan_partitions(B.partitions(ps, w), gp.Config(carries=carries), instance_id="i", rules=RULES)
        assert {t.tensor_name: (t.decision, t.reason, t.in_loop) for t in plan.transfers} == {
            "edge_1_in": ("swap", "static", True) if swapped else ("keep", "in_loop", True),
            "edge_2_out": ("swap", "static", False)}, carries


def test_pairs_inside_conditional_branches_are_kept():
    """A lowered tf.cond as TF partitions it: the worker's branch pivot (Identity of a Switch
    output) gates, through a control edge, ps's read of v, whose value comes back to the
    worker's branch and on to the Merge. On the branch not taken every one of those is dead,
    and the two pairs with it (the control pair and the read); the Merge's output, sent to ps
    after the conditional, is live. Deadness is followed across the pairs: ps alone has no
    Switch. A TF1 half cannot see its peer's side, so it is not told (its peer may be)."""
    ps, w = B.Partition(PS), B.Partition(W0)
    ps.var("v", (4,))
    w.node("pred", "Placeholder", dtype=("type", 10))  # DT_BOOL
    w.node("cond/switch", "Switch", ["pred", "pred"])
    w.node("cond/pivot_t", "Identity", ["cond/switch:1"])
    w.node("cond/dummy", "Const", ["^cond/pivot_t"], dtype=("type", B.FLOAT),
           value=("tensor", (B.FLOAT, (0,), None)))
    B.pair(w, ps, "edge_1_ctl", "cond/dummy", recv_name="ctl/_recv", shape=(0,))
    ps.node("cond/read", "Identity", ["v/read", "^ctl/_recv"])
    B.pair(ps, w, "edge_2_read", "cond/read", recv_name="read/_recv", shape=(4,))
    w.node("cond/neg", "Neg", ["read/_recv"])
    w.node("cond/zeros", "Const", ["^cond/switch"], dtype=("type", B.FLOAT),
           value=("tensor", (B.FLOAT, (4,), None)))
    w.node("cond/merge", "Merge", ["cond/neg", "cond/zeros"])
    B.pair(w, ps, "edge_3_out", "cond/merge", recv_name="out/_recv", shape=(4,))
    assert {t.tensor_name: t.in_cond for t in find(ps, w)[1]} == {
        "edge_1_ctl": True, "edge_2_read": True, "edge_3_out": False}
    for half in (ps, w):
        assert not any(t.in_cond for t in find(half)[1])
    plan = gp.plan_partitions(B.partitions(ps, w), instance_id="i", rules=RULES)
    assert {t.tensor_name: (t.decision, t.reason) for t in plan.transfers} == {
        "edge_1_ctl": ("keep", "in_cond"), "edge_2_read": ("keep", "in_cond"),
        "edge_3_out": ("swap", "static")}
    # Ops that carry dead tensors swap the branch's pairs like any other; in_cond stays set,
    # for the pass to label TF's own nodes (rdmadev.tf.bridge).
    plan = gp.plan_partitions(B.partitions(ps, w), gp.Config(carries={"dead_tensors": True}), instance_id="i", rules=RULES)
    assert {t.tensor_name: (t.decision, t.reason, t.in_cond) for t in plan.transfers} == {
        "edge_1_ctl": ("swap", "control_signal", True), "edge_2_read": ("swap", "static", True),
        "edge_3_out": ("swap", "static", False)}


def test_halves_named_after_a_branch_mark_are_kept_each_alone():
    """What a TF1 task plans: one half of each pair. rdmadev's pass put a node named
    `<src>/rdmadev_in_branch/_N` between each branch value and the task it crosses to, before
    TF partitioned the whole graph, and the partitioner named both halves after it (`_src`):
    each half alone is in_cond, its peer likewise; a half named after any other node is not."""
    ps, w = B.Partition(PS), B.Partition(W0)
    ps.var("v", (4,))
    mark = "cond/read" + RULES.branch_mark + "/_0"
    ps.node(mark, "Identity", ["v/read"])
    B.pair(ps, w, "edge_2_" + mark, mark, recv_name="read/_recv", shape=(4,), src=mark)
    B.pair(ps, w, "edge_3_v", "v/read", recv_name="v/_recv", shape=(4,))
    w.node("use", "AddV2", ["read/_recv", "v/_recv"])
    for parts in ((ps,), (w,), (ps, w)):
        assert {t.tensor_name: t.in_cond for t in find(*parts)[1]} == {
            "edge_2_" + mark: True, "edge_3_v": False}, parts
    for half in (ps, w):
        plan = gp.plan_partitions(B.partitions(half), gp.Config(carries={"half_pairs": True}, half_pair_capacity=4096),
                                  instance_id="i", rules=RULES)
        assert {t.tensor_name: (t.decision, t.reason) for t in plan.transfers} == {
            "edge_2_" + mark: ("keep", "in_cond"), "edge_3_v": ("swap", "half_pair_capacity")}
        plan = gp.plan_partitions(B.partitions(half), gp.Config(carries={"half_pairs": True, "dead_tensors": True},
                                                                half_pair_capacity=4096), instance_id="i", rules=RULES)
        assert {t.tensor_name: (t.decision, t.reason, t.in_cond) for t in plan.transfers} == {
            "edge_2_" + mark: ("swap", "half_pair_capacity", True),
            "edge_3_v": ("swap", "half_pair_capacity", False)}


def test_a_half_on_a_device_other_than_a_cpu_crosses_via_its_tasks_cpu():
    """A GPU (or PluggableDevice, XLA device) end has no rdmadev kernel: the plan names the
    task's CPU the half crosses through (``send_host``/``recv_host``), the view hands it to the
    pass (``HalfDecision.host``), and the table says ``via host`` with the device copies a step."""
    gpu = B.dev("worker", 0, "GPU")
    ps, w = B.Partition(PS), B.Partition(gpu)
    ps.var("v", (16, 16))
    B.pair(ps, w, "edge_1_v", "v/read", recv_name="v/_recv", shape=(16, 16))
    w.node("g", "Relu", ["v/_recv"])
    B.pair(w, ps, "edge_2_g", "g", recv_name="g/_recv", shape=(16, 16))
    plan = gp.plan_partitions(B.partitions(ps, w), instance_id="i", rules=RULES)
    assert {t.tensor_name: (t.decision, t.send_host, t.recv_host, t.via_host) for t in plan.transfers} == {
        "edge_1_v": ("swap", None, W0, 1), "edge_2_g": ("swap", W0, None, 1)}
    view = gp.PassView.of(plan)
    assert [(h.side, h.facts.device, h.decision.host) for h in view.halves] == [
        ("send", PS, ""), ("recv", gpu, W0), ("send", gpu, W0), ("recv", PS, "")]
    table = format_table(plan)
    assert table.count("static via host") == 2, table
    assert "2 swapped with an end on a device other than its task's CPU cross via host: 2 device copies " \
           "per step (2.0 KiB of static shape)" in table, table


def test_a_pair_in_a_loop_on_a_device_stays_on_grpc_saying_why():
    """Its copy through the CPU would need the loop's frame in the CPU's partition: kept, with
    the reason, even when the ops carry loops."""
    gpu = B.dev("worker", 0, "GPU")
    ps, w = B.Partition(PS), B.Partition(gpu)
    ps.var("v", (4,))
    ps.node("loop/enter", "Enter", ["v/read"], frame_name="loop")
    ps.send("in/_send", "loop/enter", "edge_1_in", gpu)
    w.node("_cloop/x", "Const")
    w.node("_cloop/enter", "Enter", ["_cloop/x"], frame_name="loop")
    w.node("_cloop/merge", "Merge", ["_cloop/enter", "_cloop/next"])
    w.node("_cloop/next", "NextIteration", ["_cloop/merge"])
    w.recv("in/_recv", "edge_1_in", PS, shape=(4,)).input.append("^_cloop/merge")
    config = gp.Config(carries={"loops": True, "dead_tensors": True})
    (t,) = gp.plan_partitions(B.partitions(ps, w), config, instance_id="i", rules=RULES).transfers
    assert (t.decision, t.reason, t.recv_host) == ("keep", "device_loop", W0)
    assert gp.REASONS["device_loop"][0] == "keep" and gpu in t.detail
