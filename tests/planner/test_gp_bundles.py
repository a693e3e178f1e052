"""Bundles: the small static pairs of a step between two devices share one channel, and never
two of which one may wait for the other (graph_pass.bundles)."""
import json

import pytest

import graph_pass as gp
from graph_pass.bundles import BUNDLE_MAX_BYTES, levels

import gp_builders as B
from rdmadev._core import PLANNER_RULES as RULES

PS, W0 = B.dev("ps"), B.dev("worker", 0)


def _reads(n, shape=(4, 8)):
    """ps holds n variables, each read by worker 0 and summed there."""
    ps, w = B.Partition(PS), B.Partition(W0)
    for i in range(n):
        ps.var(f"v{i}", shape)
        B.pair(ps, w, f"edge_{i}_v{i}", f"v{i}/read", recv_name=f"v{i}/_recv", shape=shape)
    w.node("sum", "AddN", [f"v{i}/_recv" for i in range(n)], T=("type", B.FLOAT), N=("i", n))
    return ps, w


def _by_bundle(plan):
    out = {}
    for t in plan.swapped():
        out.setdefault(t.bundle, []).append(t)
    return out


def test_small_reads_of_one_step_share_one_channel():
    plan = gp.plan_partitions(B.partitions(*_reads(5)), instance_id="b", rules=RULES)
    bundles = _by_bundle(plan)
    assert list(bundles) != [None] and len(bundles) == 1
    (members,) = bundles.values()
    assert len(members) == 5 and len({t.channel_key for t in members}) == 1
    assert sorted(t.bundle_offset for t in members) == [0, 128, 256, 384, 512]
    assert {t.capacity_bytes for t in members} == {5 * 128} and {t.rank_capacity for t in members} == {None}
    (region,) = plan.regions
    assert region.channels == [members[0].channel_key]  # one channel: one slot of 640 B + header
    assert region.used_bytes == 64 + 640
    again = gp.Plan.from_json(plan.to_json())
    assert again == plan and json.loads(plan.to_json())["transfers"][0]["bundle"] == members[0].bundle


def test_a_bundle_is_the_same_on_every_planning():
    one = gp.plan_partitions(B.partitions(*_reads(3)), instance_id="x", rules=RULES)
    two = gp.plan_partitions(B.partitions(*reversed(_reads(3))), instance_id="x", rules=RULES)
    assert one.to_json() == two.to_json()


def test_bundle_below_bytes_zero_gives_every_pair_its_channel():
    plan = gp.plan_partitions(B.partitions(*_reads(5)), gp.Config(bundle_below_bytes=0), instance_id="b", rules=RULES)
    assert {t.bundle for t in plan.swapped()} == {None}
    assert len({t.channel_key for t in plan.swapped()}) == 5


def test_large_tensors_stay_on_channels_of_their_own():
    big = (64, 64)  # 16 KiB: not below the default threshold
    ps, w = _reads(2)
    ps.var("big", big)
    B.pair(ps, w, "edge_9_big", "big/read", recv_name="big/_recv", shape=big)
    w.node("use", "MatMul", ["big/_recv", "big/_recv"], T=("type", B.FLOAT))
    plan = gp.plan_partitions(B.partitions(ps, w), instance_id="b", rules=RULES)
    assert {t.tensor_name: bool(t.bundle) for t in plan.swapped()} == {
        "edge_0_v0": True, "edge_1_v1": True, "edge_9_big": False}


def test_a_tensor_that_depends_on_another_of_the_route_is_not_bundled_with_it():
    # ps -> worker (a), the worker computes on it and sends it back (b), ps sends the result
    # again (c): a and c both go ps -> worker, but c waits for a's arrival. Bundled, c's write
    # would wait for a, whose wait would wait for c's write: a deadlock.
    ps, w = B.Partition(PS), B.Partition(W0)
    ps.var("v", (4,))
    ps.var("u", (4,))
    B.pair(ps, w, "edge_1_a", "v/read", recv_name="a/_recv", shape=(4,))
    B.pair(ps, w, "edge_2_u", "u/read", recv_name="u/_recv", shape=(4,))
    w.node("twice", "Add", ["a/_recv", "a/_recv"], T=("type", B.FLOAT))
    B.pair(w, ps, "edge_3_b", "twice", recv_name="b/_recv", shape=(4,))
    ps.node("again", "Neg", ["b/_recv"], T=("type", B.FLOAT))
    B.pair(ps, w, "edge_4_c", "again", recv_name="c/_recv", shape=(4,))
    w.node("out", "Add", ["c/_recv", "u/_recv"], T=("type", B.FLOAT))
    plan, graph = gp.plan_partitions(B.partitions(ps, w), instance_id="d", return_graph=True, rules=RULES)
    bundle = {t.tensor_name: t.bundle for t in plan.swapped()}
    assert bundle["edge_1_a"] and bundle["edge_1_a"] == bundle["edge_2_u"]  # a and u: level 0
    assert bundle["edge_3_b"] is None and bundle["edge_4_c"] is None  # alone at their levels
    level = levels(graph, RULES)
    assert level[(W0, "a/_recv")] == 1 and level[(PS, "b/_recv")] == 2 and level[(W0, "c/_recv")] == 3


def test_a_receive_that_waits_for_another_members_arrival_is_not_bundled_with_it():
    # Both tensors are ready on ps at once, but worker 0's partition makes the second receive
    # wait (a control edge) for an op on the first one: one wait for both would never end.
    ps, w = _reads(2)
    w.node("first", "Identity", ["v0/_recv"], T=("type", B.FLOAT))
    next(n for n in w.gd.node if n.name == "v1/_recv").input.append("^first")
    plan = gp.plan_partitions(B.partitions(ps, w), instance_id="d", rules=RULES)
    assert {t.bundle for t in plan.swapped()} == {None}


def test_a_function_with_a_loop_has_no_bundles():
    ps, w = _reads(3)
    w.node("enter", "Enter", ["sum"], T=("type", B.FLOAT), frame_name=("s", "loop"))
    w.node("merge", "Merge", ["enter", "next"], T=("type", B.FLOAT), N=("i", 2))
    w.node("next", "NextIteration", ["merge"], T=("type", B.FLOAT))
    plan, graph = gp.plan_partitions(B.partitions(ps, w), instance_id="l", return_graph=True, rules=RULES)
    assert levels(graph, RULES) is None
    assert {t.bundle for t in plan.swapped()} == {None}


def test_a_route_with_more_bytes_than_a_bundle_holds_gets_several():
    shape = (32, 64)  # 8 KiB each
    n = BUNDLE_MAX_BYTES // (32 * 64 * 4) + 3
    plan = gp.plan_partitions(B.partitions(*_reads(n, shape)), instance_id="m", rules=RULES)
    bundles = _by_bundle(plan)
    assert None not in bundles and len(bundles) == 2
    assert sorted(len(m) for m in bundles.values()) == [3, n - 3]
    assert all(m[0].capacity_bytes <= BUNDLE_MAX_BYTES for m in bundles.values())


def test_validate_refuses_a_broken_bundle():
    plan = gp.plan_partitions(B.partitions(*_reads(3)), instance_id="v", rules=RULES)
    members = plan.swapped()
    members[1].bundle_offset = members[0].bundle_offset  # two tensors in one place
    with pytest.raises(gp.ValidationError, match="overlaps"):
        gp.validate(plan)
    members[1].bundle_offset = 8  # not aligned
    with pytest.raises(gp.ValidationError, match="aligned offset"):
        gp.validate(plan)
    members[1].bundle_offset = 128
    members[2].bundle = None  # keeps the bundle's key without being in it
    with pytest.raises(gp.ValidationError, match="shares channel_key"):
        gp.validate(plan)


def test_config_refuses_a_negative_threshold():
    with pytest.raises(gp.ConfigError, match="bundle_below_bytes=-1"):
        gp.Config(bundle_below_bytes=-1)


def test_rdmadev_plan_shows_the_bundles_and_can_turn_them_off(tmp_path, capsys):
    from rdmadev.tools import plan as cli
    files = []
    for name, part in zip(("ps.pb", "w.pb"), _reads(3)):
        files.append(tmp_path / name)
        files[-1].write_bytes(part.gd.SerializeToString())
    assert cli.main(["--graphdef", *map(str, files)]) == 0
    out = capsys.readouterr().out
    rows = [line.split() for line in out.splitlines() if line.startswith("edge_")]
    assert len(rows) == 3 and {r[9:11] == ["static", "bundle"] for r in rows} == {True}, out
    assert "3 small tensors share 1 bundle(s): 1 channels for 3 swapped transfers" in out, out
    assert cli.main(["--graphdef", *map(str, files), "--bundle-below-bytes", "0"]) == 0
    out = capsys.readouterr().out
    assert "bundle" not in out.replace("bundles below 0 B", ""), out


def test_a_control_edges_signal_comes_with_the_bundle_of_its_level():
    ps, w = _reads(2)
    ps.node("ready", "NoOp")
    B.control_pair(ps, w, "edge_7_ready", "ready", "after_ready")
    plan = gp.plan_partitions(B.partitions(ps, w), instance_id="c", rules=RULES)
    control = next(t for t in plan.swapped() if t.kind == "control")
    assert control.bytes == 0 and control.bundle
    assert {t.bundle for t in plan.swapped()} == {control.bundle}


def test_a_dependency_through_two_devices_of_one_task_keeps_tensors_apart():
    # x goes ps -> worker and y back, so a (read after y) is at level 2. a reaches the worker's
    # second device through a pair within the task, whose result goes to ps (b), from which ps
    # computes c for the worker: c waits for a. find_transfers gives the pair within the task
    # no edge; levels must add it, or c would land at a's level (the chain restarting at the
    # second device) and share a's bundle.
    ps, w, w1 = B.Partition(PS), B.Partition(W0), B.Partition(B.dev("worker", 0, number=1))
    for name in ("v", "u"):
        ps.var(name, (4,))
    B.pair(ps, w, "edge_1_x", "v/read", recv_name="x/_recv", shape=(4,))
    w.node("y", "Neg", ["x/_recv"], T=("type", B.FLOAT))
    B.pair(w, ps, "edge_2_y", "y", recv_name="y/_recv", shape=(4,))
    ps.node("a", "Neg", ["y/_recv"], T=("type", B.FLOAT))
    B.pair(ps, w, "edge_3_a", "a", recv_name="a/_recv", shape=(4,))
    B.pair(w, w1, "edge_4_hop", "a/_recv", recv_name="hop/_recv", shape=(4,))
    w1.node("b", "Neg", ["hop/_recv"], T=("type", B.FLOAT))
    B.pair(w1, ps, "edge_5_b", "b", recv_name="b/_recv", shape=(4,))
    ps.node("c", "Neg", ["b/_recv"], T=("type", B.FLOAT))
    B.pair(ps, w, "edge_6_c", "c", recv_name="c/_recv", shape=(4,))
    w.node("out", "Add", ["c/_recv", "a/_recv"], T=("type", B.FLOAT))
    plan, graph = gp.plan_partitions(B.partitions(ps, w, w1), instance_id="t", return_graph=True, rules=RULES)
    level = levels(graph, RULES)
    assert level[(W0, "a/_recv")] == 3 and level[(w1.device, "hop/_recv")] == 4
    bundle = {t.tensor_name: t.bundle for t in plan.swapped()}
    assert bundle["edge_3_a"] is None or bundle["edge_3_a"] != bundle["edge_6_c"]
