"""Plan v2: the config carries the zero-copy threshold, the deadline and what the ops can carry;
the policy obeys ``carries`` so nothing downstream re-decides."""

import json

import pytest

import gp_builders as B
import graph_pass as gp
from graph_pass import plan as plan_mod
from rdmadev._core import PLANNER_RULES as RULES

PS, W0 = B.dev("ps"), B.dev("worker")
ON = {"dynamic_shapes": True, "half_pairs": True, "dead_tensors": True, "loops": True}


def transfer(**kw):
    base = dict(channel_id=gp.channel_id("edge_1_t", PS, W0, 1), tensor_name="edge_1_t", send_device=PS,
                recv_device=W0, send_device_incarnation=1, send_node="t/_send", recv_node="t/_recv",
                dtype="DT_FLOAT", shape=[4, 8], bytes=128)
    base.update(kw)
    return gp.Transfer(**base)


CASES = {  # name -> (transfer, reason with carries off, reason with carries on)
    "static": (transfer(), "static", "static"),
    "control": (transfer(kind="control", shape=[0], bytes=0), "control_signal", "control_signal"),
    "dynamic": (transfer(shape=[-1, 8], bytes=None), "not_carried_dynamic", "dynamic_bounded"),
    "unknown_rank": (transfer(shape=None, bytes=None), "not_carried_dynamic", "dynamic_bounded"),
    "send_half": (transfer(recv_node=None), "not_carried_half_pair", "half_pair_capacity"),
    "recv_half": (transfer(send_node=None, shape=None, bytes=None), "not_carried_half_pair", "half_pair_capacity"),
    "in_cond": (transfer(in_cond=True), "in_cond", "static"),
}


@pytest.mark.parametrize("name", sorted(CASES))
@pytest.mark.parametrize("on", [False, True])
def test_policy_obeys_carries(name, on):
    t, off_reason, on_reason = CASES[name]
    cfg = gp.Config(carries=ON if on else {}, default_dynamic_capacity=4096, half_pair_capacity=4096)
    plan = gp.validate(gp.plan_regions([t], cfg, instance_id="i", rules=RULES))
    (got,) = plan.transfers
    reason = on_reason if on else off_reason
    assert (got.reason, got.decision) == (reason, gp.REASONS[reason][0])
    if reason.startswith("not_carried") or reason == "in_cond":
        assert got.region is None and not plan.regions and "carries" in gp.REASONS[reason][1]


def test_each_capability_is_independent():
    dyn, half = CASES["dynamic"][0], CASES["send_half"][0]
    cfg = gp.Config(carries={"dynamic_shapes": True}, default_dynamic_capacity=256, half_pair_capacity=256)
    assert [t.reason for t in gp.plan_regions([dyn, half], cfg, "i", rules=RULES).transfers] == \
        ["dynamic_bounded", "not_carried_half_pair"]
    cfg = gp.Config(carries={"half_pairs": True}, default_dynamic_capacity=256, half_pair_capacity=256)
    assert [t.reason for t in gp.plan_regions([dyn, half], cfg, "i", rules=RULES).transfers] == \
        ["not_carried_dynamic", "half_pair_capacity"]


def test_validate_refuses_a_swap_the_ops_cannot_carry():
    plan = gp.plan_regions([CASES["dynamic"][0]], gp.Config(carries=ON, default_dynamic_capacity=64), "i", rules=RULES)
    plan.config = gp.Config()
    with pytest.raises(gp.ValidationError, match="do not carry dynamic shapes"):
        gp.validate(plan)


def test_config_defaults_and_errors():
    cfg = gp.Config()
    assert cfg.zero_copy_min_bytes == plan_mod.DEFAULT_ZERO_COPY_MIN_BYTES == 64 << 10
    assert cfg.deadline_s == plan_mod.DEFAULT_DEADLINE_S == 300.0
    assert cfg.carries == {"dynamic_shapes": False, "half_pairs": False, "dead_tensors": False, "loops": False}
    assert gp.Config(carries={"half_pairs": 1}).carries == {"dynamic_shapes": False, "half_pairs": True,
                                                            "dead_tensors": False, "loops": False}
    with pytest.raises(gp.ConfigError, match=r"unknown capabilities \['strings'\]"):
        gp.Config(carries={"strings": True})
    for bad in (0, -1.0, "5", True):
        with pytest.raises(gp.ConfigError, match="deadline_s="):
            gp.Config(deadline_s=bad)
    with pytest.raises(gp.ConfigError, match="zero_copy_min_bytes=-1"):
        gp.Config(zero_copy_min_bytes=-1)


def test_the_round_trip_keeps_the_v2_config():
    ps, (w,) = B.ps_worker_step()
    cfg = gp.Config(zero_copy_min_bytes=1024, deadline_s=12.5, carries={"dynamic_shapes": True})
    plan = gp.plan_partitions(B.partitions(ps, w), cfg, instance_id="v2", rules=RULES)
    data = json.loads(plan.to_json())
    assert data["version"] == 4 == gp.PLAN_VERSION
    assert data["config"]["zero_copy_min_bytes"] == 1024 and data["config"]["deadline_s"] == 12.5
    assert data["config"]["carries"] == {"dynamic_shapes": True, "half_pairs": False, "dead_tensors": False,
                                         "loops": False}
    again = gp.Plan.from_json(plan.to_json())
    assert again == plan and again.config == cfg


def test_older_plans_are_refused_with_the_reason():
    data = json.loads(gp.plan_partitions(B.partitions(*[B.Partition(PS)]), rules=RULES).to_json())
    for version in (1, 2, 3):
        data["version"] = version
        with pytest.raises(gp.PlanFormatError, match=rf"plan version {version} is not supported .*version 4, "
                                                     r"which added bundles.*re-plan"):
            gp.Plan.from_dict(data)


def _zero_copy_plan(shape, threshold):
    ps, w = B.Partition(PS), B.Partition(W0)
    ps.var("v", shape)
    B.pair(ps, w, "edge_1_v", "v/read", recv_name="v/_recv", shape=shape)
    w.node("use", "MatMul", ["v/_recv", "v/_recv"], T=("type", B.FLOAT))
    return gp.plan_partitions(B.partitions(ps, w), gp.Config(zero_copy_min_bytes=threshold), rules=RULES).transfers[0]


def test_zero_copy_threshold_comes_from_the_config():
    small = (16, 16)  # 1 KiB, far below the 64 KiB default
    assert _zero_copy_plan(small, gp.Config().zero_copy_min_bytes).zero_copy is False
    assert _zero_copy_plan(small, 1024).zero_copy is True
    assert _zero_copy_plan(small, 1025).zero_copy is False
