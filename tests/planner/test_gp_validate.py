"""validate: a good plan passes; each broken invariant is caught, naming the node and the fix."""

import copy

import pytest

import gp_builders as B
import graph_pass as gp
from rdmadev._core import PLANNER_RULES as RULES

FIX = "re-run plan_regions"


def good():
    """A plan with static swaps on three tasks, a control signal and a kept client pair."""
    ps, (w0, w1) = B.ps_worker_step(workers=2, shape=(30, 10))
    ps.node("upd", "NoOp")
    B.control_pair(ps, w0, "edge_90_upd", "upd", "after")
    client = B.Partition("/job:localhost/replica:0/task:0/device:CPU:0")
    client.node("arg", "_Arg", T=("type", B.FLOAT), _output_shapes=("shapes", [(3,)]), index=0)
    B.pair(client, w1, "edge_91_arg", "arg")
    # a channel per pair: bundles' own invariants are test_gp_bundles.py's
    plan, graph = gp.plan_partitions(B.partitions(ps, w0, w1, client), gp.Config(bundle_below_bytes=0),
                                     instance_id="inst", return_graph=True, rules=RULES)
    return plan, graph


def by_label(plan, label):
    return next(t for t in plan.transfers if t.label == label)


def test_good_plan_passes_and_has_what_we_built():
    plan, graph = good()
    assert gp.validate(plan, graph, RULES) is plan
    assert sorted((t.reason, t.decision) for t in plan.transfers) == [
        ("client_task", "keep"), ("control_signal", "swap")] + [("static", "swap")] * 4
    assert gp.validate(gp.Plan.from_json(plan.to_json()), graph, RULES).to_json() == plan.to_json()


def broken(mutate):
    plan, graph = good()
    plan = copy.deepcopy(plan)
    mutate(plan)
    with pytest.raises(gp.ValidationError) as err:
        gp.validate(plan, graph, RULES)
    return err.value


def test_duplicate_channel_identity():
    def dup(plan):
        plan.transfers[1].channel_id = plan.transfers[0].channel_id
    err = broken(dup)
    assert any("shares channel_id" in p and plan_label in p for p in err.problems
               for plan_label in [good()[0].transfers[0].label])


def test_kept_pair_without_reason():
    def drop(plan):
        by_label(plan, "edge_91_arg/_send").reason = None
    err = broken(drop)
    assert any("'edge_91_arg/_send'" in p and "is kept without a known reason" in p and FIX in p for p in err.problems)


def test_reason_contradicting_decision():
    def flip(plan):
        by_label(plan, "edge_91_arg/_send").reason = "static"
    err = broken(flip)
    assert any("decision 'keep' but reason 'static'" in p for p in err.problems)


def test_transfer_without_decision():
    def undecided(plan):
        plan.transfers[0].decision = None
    assert any("has no decision" in p for p in broken(undecided).problems)


def test_overlapping_channels_in_a_region():
    def overlap(plan):
        region = next(r for r in plan.regions if len(r.channels) == 2)
        t = plan.transfer(region.channels[1])
        t.offset -= 64
        t.task_offset -= 64
    err = broken(overlap)
    assert any("overlaps" in p and FIX in p for p in err.problems)


def test_region_sizes_must_add_up():
    def grow(plan):
        plan.regions[0].used_bytes += 64
    assert any("used_bytes" in p and plan_region in p for p in broken(grow).problems
               for plan_region in [good()[0].regions[0].region_id])


def test_task_total_must_add_up():
    def shrink(plan):
        plan.tasks[0].total_bytes -= 4096
    assert any("total_bytes" in p and "add up" in p for p in broken(shrink).problems)


def test_overlapping_regions_in_a_task():
    def collide(plan):
        ps_regions = [r for r in plan.regions if r.recv_task == "/job:ps/replica:0/task:0"]
        ps_regions[1].offset = ps_regions[0].offset
        for k in ps_regions[1].channels:
            t = plan.transfer(k)
            t.task_offset = ps_regions[1].offset + t.offset
    assert any("overlaps region" in p for p in broken(collide).problems)


def test_swapped_transfer_missing_from_its_region():
    def orphan(plan):
        plan.regions[0].channels.pop()
    assert any("listed in 0 regions" in p for p in broken(orphan).problems)


def test_swap_without_region():
    def lost(plan):
        plan.swapped()[0].region = "nowhere"
    assert any("region 'nowhere' is not in the plan" in p for p in broken(lost).problems)


def test_slot_layout_must_match_the_layout_module():
    def misalign(plan):
        plan.swapped()[0].slot_bytes += 8
    assert any("slot_bytes/payload_offset" in p for p in broken(misalign).problems)


def test_static_capacity_must_equal_tensor_bytes():
    def small(plan):
        t = next(t for t in plan.swapped() if t.bytes)
        t.capacity_bytes = t.bytes - 4
    assert any("static slots hold" in p for p in broken(small).problems)


def test_layout_or_version_mismatch():
    def old(plan):
        plan.layout["slot_header_bytes"] = 32
        plan.version = 0
    problems = broken(old).problems
    assert any("layout differs" in p and "slot_header_bytes" in p for p in problems)
    assert any("expected 'rdmadev.plan' v4" in p for p in problems)


def test_write_without_exactly_one_wait_in_the_graph():
    plan, graph = good()
    t = plan.swapped()[0]
    recv_key = next(k for k, d in graph.nodes(data=True) if d[gp.NS].get("channel_id") == t.channel_id
                    and d[gp.NS]["end"] == "recv")
    graph.nodes[recv_key][gp.NS]["end"] = "send"  # now two writes, no wait
    with pytest.raises(gp.ValidationError) as err:
        gp.validate(plan, graph, RULES)
    assert any(t.label in p and "exactly one partner" in p for p in err.value.problems)


def test_instance_id_must_be_in_full_pair_keys():
    def bare(plan):
        plan.swapped()[0].channel_key = plan.swapped()[0].channel_id
    assert any("expected '" in p and "@inst'" in p for p in broken(bare).problems)


def test_problems_lists_all_at_once():
    def many(plan):
        plan.tasks[0].total_bytes += 1
        plan.transfers[0].decision = None
    err = broken(many)
    assert len(err.problems) >= 2 and str(err).startswith("plan is invalid (")
