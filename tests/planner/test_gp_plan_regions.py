"""plan_regions: layouts, channel identities (full vs TF1 halves), config, and layout properties."""

import dataclasses

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import gp_builders as B
import graph_pass as gp
from rdmadev._core import PLANNER_RULES as RULES

PS, W0, W1 = B.dev("ps"), B.dev("worker", 0), B.dev("worker", 1)


def test_layout_constants_and_slot_math():
    layout = RULES.layout  # the native constants (channel.h), through the bindings
    assert (layout.alignment, layout.slot_header_bytes, layout.seq_offset, layout.length_offset) == (64, 64, 0, 8)
    assert layout.slot_bytes(0) == (64, 64)
    assert layout.slot_bytes(1) == (128, 64)
    assert layout.slot_bytes(64) == (128, 64)
    assert layout.slot_bytes(65) == (192, 64)
    assert layout.slot_bytes(10, rank_capacity=7) == (64 + 64 + 64, 128)  # 8 + 7*8 = 64
    assert layout.slot_bytes(10, rank_capacity=8) == (64 + 128 + 64, 192)
    d = layout.to_dict()
    assert d["slot_header_bytes"] == 64 and d["seq_offset"] == 0 and d["length_offset"] == 8
    assert d["alignment"] == 64 and d["region_alignment"] == 4096 and d["byte_order"] == "little"


def test_regions_per_receiving_task_and_sending_peer():
    ps, (w0, w1) = B.ps_worker_step(workers=2, shape=(100, 10))
    plan = gp.plan_partitions(B.partitions(ps, w0, w1), gp.Config(slots=3), instance_id="inst", rules=RULES)
    assert [(r.recv_task, r.send_task) for r in plan.regions] == [
        ("/job:ps/replica:0/task:0", "/job:worker/replica:0/task:0"),
        ("/job:ps/replica:0/task:0", "/job:worker/replica:0/task:1"),
        ("/job:worker/replica:0/task:0", "/job:ps/replica:0/task:0"),
        ("/job:worker/replica:0/task:1", "/job:ps/replica:0/task:0")]
    # each channel: 3 slots x (64 header + 4000 payload rounded up to 4032) = 3 x 4096 = 12288 B (3 pages)
    for t in plan.transfers:
        assert (t.slots, t.capacity_bytes, t.slot_bytes, t.payload_offset) == (3, 4000, 4096, 64)
    assert [r.used_bytes for r in plan.regions] == [12288] * 4
    assert [r.bytes for r in plan.regions] == [12288] * 4
    ps_block = plan.tasks[0]
    assert ps_block.task == "/job:ps/replica:0/task:0" and ps_block.total_bytes == 2 * 12288
    assert [r.offset for r in plan.regions[:2]] == [0, 12288]  # regions follow each other, page-aligned
    assert plan.transfer(plan.regions[1].channels[0]).task_offset == 12288


def test_channels_sorted_by_key_and_offsets_packed():
    ps, w = B.Partition(PS), B.Partition(W0)
    for i, n in enumerate([10, 1000, 3]):
        ps.var(f"v{i}", (n,))
        B.pair(ps, w, f"edge_{i}_v", f"v{i}/read", shape=(n,))
    plan = gp.plan_partitions(B.partitions(ps, w), instance_id="x", rules=RULES)
    (region,) = plan.regions
    assert region.channels == sorted(region.channels)
    offsets = [plan.transfer(k).offset for k in region.channels]
    sizes = [plan.transfer(k).slots * plan.transfer(k).slot_bytes for k in region.channels]
    assert offsets == [sum(sizes[:i]) for i in range(len(sizes))]


def test_channel_id_depends_on_rendezvous_attrs_only():
    a = gp.channel_id("edge_4_x", PS, W0, 5)
    assert a == gp.channel_id("edge_4_x", PS, W0, 5) and len(a) == 16 and int(a, 16) >= 0
    assert len({a, gp.channel_id("edge_4_y", PS, W0, 5), gp.channel_id("edge_4_x", PS, W1, 5),
                gp.channel_id("edge_4_x", W1, W0, 5), gp.channel_id("edge_4_x", PS, W0, 6)}) == 5
    assert gp.channel_key(a, None) == a and gp.channel_key(a, "i9") == f"{a}@i9"


def test_tf1_half_graphs_give_the_same_channel_identities_as_the_full_graph():
    ps, (w0, w1) = B.ps_worker_step(workers=2)
    full = gp.plan_partitions(B.partitions(ps, w0, w1), instance_id="inst", rules=RULES)
    halves = {dev: gp.plan_partitions({dev: gd}, rules=RULES) for dev, gd in B.partitions(ps, w0, w1).items()}
    full_ids = {t.channel_id for t in full.transfers}
    for dev, plan in halves.items():
        assert plan.instance_id is None  # no pair has both halves here: keys are the bare ids
        for t in plan.transfers:
            assert t.channel_id in full_ids and t.channel_key == t.channel_id and t.halves != "both"
    # every transfer is seen once by its sender's plan and once by its receiver's plan
    sends = sorted(t.channel_id for p in halves.values() for t in p.transfers if t.halves == "send")
    recvs = sorted(t.channel_id for p in halves.values() for t in p.transfers if t.halves == "recv")
    assert sends == recvs == sorted(full_ids)
    assert all(t.channel_key == f"{t.channel_id}@inst" for t in full.transfers)


def test_half_pairs_decide_alike_on_both_sides():
    ps, (w,) = B.ps_worker_step()
    parts = B.partitions(ps, w)
    halves = {"half_pairs": True}
    for cfg, reason in ((gp.Config(), "not_carried_half_pair"), (gp.Config(carries=halves), "half_pair"),
                        (gp.Config(carries=halves, half_pair_capacity=1024), "half_pair_capacity")):
        by_side = [{t.channel_id: t for t in gp.plan_partitions({d: gd}, cfg, rules=RULES).transfers} for d, gd in parts.items()]
        assert by_side[0].keys() == by_side[1].keys()
        for cid in by_side[0]:
            a, b = by_side[0][cid], by_side[1][cid]
            assert a.reason == b.reason == reason
            assert (a.capacity_bytes, a.rank_capacity, a.slot_bytes) == (b.capacity_bytes, b.rank_capacity, b.slot_bytes)


def test_slots_by_kind_of_channel_unless_the_config_sets_them():
    """One slot for a static tensor and a control signal (one per step, freed within it), two
    for a run-time shape and a half pair (chunks stream through them); config.slots sets all."""
    ps, w = B.Partition(PS), B.Partition(W0)
    ps.var("v", (1000,))
    B.pair(ps, w, "edge_1_v", "v/read", shape=(1000,))
    B.pair(ps, w, "edge_2_ids", "v/read", shape=(-1,))
    B.control_pair(ps, w, "edge_3_ctrl", "v/read", "after")
    # every channel its own: the static tensor and the signal would share a bundle
    cfg = dict(default_dynamic_capacity=4096, carries={"dynamic_shapes": True}, bundle_below_bytes=0)
    plan = gp.plan_partitions(B.partitions(ps, w), gp.Config(**cfg), instance_id="i", rules=RULES)
    assert {t.tensor_name: (t.reason, t.slots) for t in plan.transfers} == {
        "edge_1_v": ("static", 1), "edge_2_ids": ("dynamic_bounded", 2), "edge_3_ctrl": ("control_signal", 1)}
    (region,) = plan.regions
    assert region.used_bytes == (64 + 4032) + 64 + 2 * (64 + 64 + 4096)  # static, signal, dynamic (rank 1)
    half = gp.plan_partitions({W0: w.gd}, gp.Config(carries={"half_pairs": True}, half_pair_capacity=4096), rules=RULES)
    assert {t.slots for t in half.swapped()} == {2}
    forced = gp.plan_partitions(B.partitions(ps, w), gp.Config(slots=3, **cfg), instance_id="i", rules=RULES)
    assert {t.slots for t in forced.swapped()} == {3}
    bad = dataclasses.replace(plan.transfers[0], slots=2)
    with pytest.raises(gp.ValidationError, match="has 2 slots, the config gives 1"):
        gp.validate(dataclasses.replace(plan, transfers=[bad] + plan.transfers[1:]))


def test_half_pair_larger_than_its_capacity_is_an_error_naming_node_and_fix():
    ps, (w,) = B.ps_worker_step(shape=(64, 64))
    with pytest.raises(gp.PlanError, match=r"_Recv node 'grad/_recv0' \(edge_20_grad\) carries 16384 bytes.*raise "
                                           r"half_pair_capacity to at least 16384"):
        gp.plan_partitions({PS: ps.gd}, gp.Config(carries={"half_pairs": True}, half_pair_capacity=1000), rules=RULES)


def test_min_bytes_keeps_small_tensors():
    ps, (w,) = B.ps_worker_step(shape=(2, 2))
    plan = gp.plan_partitions(B.partitions(ps, w), gp.Config(min_bytes=1024), instance_id="i", rules=RULES)
    assert {t.reason for t in plan.transfers} == {"below_min_bytes"} and plan.regions == []


def test_generated_instance_id_and_inputs_not_mutated():
    ps, (w,) = B.ps_worker_step()
    transfers = gp.find_transfers(gp.load(B.partitions(ps, w)), rules=RULES)
    before = [dataclasses.asdict(t) for t in transfers]
    p1, p2 = gp.plan_regions(transfers, rules=RULES), gp.plan_regions(transfers, rules=RULES)
    assert p1.instance_id and p2.instance_id and p1.instance_id != p2.instance_id
    assert [dataclasses.asdict(t) for t in transfers] == before


@pytest.mark.parametrize("kwargs,match", [({"slots": 0}, "slots=0: must be None"),
                                          ({"slots": True}, "slots=True: must be None"),
                                          ({"min_bytes": -1}, "min_bytes=-1"),
                                          ({"half_pair_capacity": -5}, "half_pair_capacity=-5"),
                                          ({"capacity_hints": {"t": "big"}}, r"capacity_hints\['t'\]")])
def test_config_errors_name_the_setting(kwargs, match):
    with pytest.raises(gp.ConfigError, match=match):
        gp.Config(**kwargs)


_tasks = st.sampled_from([PS, W0, W1, B.dev("worker", 2)])


@settings(max_examples=60, deadline=None, derandomize=True)
@given(st.lists(st.tuples(_tasks, _tasks, st.one_of(st.none(), st.integers(0, 1 << 20)), st.booleans()),
                min_size=0, max_size=25),
       st.one_of(st.none(), st.integers(1, 4)))
def test_any_set_of_transfers_gives_a_valid_non_overlapping_plan(specs, slots):
    transfers = []
    for i, (src, dst, size, control) in enumerate(specs):
        if src == dst:
            continue
        transfers.append(gp.Transfer(channel_id=gp.channel_id(f"edge_{i}", src, dst, 1), tensor_name=f"edge_{i}",
                                     send_device=src, recv_device=dst, send_device_incarnation=1,
                                     send_node=f"s{i}", recv_node=f"r{i}", kind="control" if control else "data",
                                     dtype="DT_FLOAT", shape=None if size is None else [size // 4],
                                     bytes=0 if control else (None if size is None else size // 4 * 4)))
    plan = gp.validate(gp.plan_regions(transfers, gp.Config(slots=slots, default_dynamic_capacity=512,
                                                                  carries={"dynamic_shapes": True}), "i", rules=RULES))
    for block in plan.tasks:
        regions = [r for r in plan.regions if r.recv_task == block.task]
        assert block.total_bytes == sum(r.bytes for r in regions)
        spans = sorted((plan.transfer(k).task_offset, plan.transfer(k).slots * plan.transfer(k).slot_bytes)
                       for r in regions for k in r.channels)
        for (a, n), (b, _) in zip(spans, spans[1:]):
            assert a + n <= b
        assert all(off % 64 == 0 for off, _ in spans)
    assert len(plan.swapped()) == len(transfers)  # all are same-dtype data/control between workers/ps
