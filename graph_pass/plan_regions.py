"""Pass 3, plan_regions: decide every transfer and lay out the receive regions exactly.

For each receiving task there is one region per sending peer task. A region holds the channels
of the swapped transfers between the two, sorted by channel key (independent of node order, so
equal inputs always give equal layouts); a channel is ``Config.slots_for`` slots whose
layout is the native one (``rules.layout``, a ``graph_pass.layout.Layout``). Regions start on
``region_alignment`` boundaries inside the
task's block, and the block's ``total_bytes`` is what the task registers. The members of a
bundle (graph_pass.bundles: small tensors of a step between the same two devices) are one
channel, of static slots holding all of their bytes, keyed by the bundle's id.

Channel identity: ``channel_id`` comes from the rendezvous attrs alone; when both halves are planned
together the ``channel_key`` also carries this instantiation's ``instance_id``, so two
instantiations of one function never share a channel.
"""

import dataclasses
import logging
import secrets
from collections import defaultdict

from .bundles import bundle_transfers
from .layout import end_to_end, round_up
from .load import NS
from .plan import Config, Plan, Region, TaskBlock, channel_key
from .policy import decide

__all__ = ["plan_regions", "new_instance_id"]

log = logging.getLogger(__name__)
log.addHandler(logging.NullHandler())

#: Random bytes in a generated instance id: 64 bits make a clash between two instantiations that
#: share a rendezvous key (same function, devices and incarnations) negligible across a cluster.
INSTANCE_ID_BYTES = 8


def new_instance_id():
    """Return a fresh random instantiation id (16 hex digits)."""
    return secrets.token_hex(INSTANCE_ID_BYTES)


def plan_regions(transfers, config=None, instance_id=None, graph=None, *, rules):
    """Decide each transfer and lay out the regions of every receiving task.

    Args:
        transfers: ``Transfer`` records from ``find_transfers`` (not modified; copies are planned).
        config: a ``Config`` (default ``Config()``).
        instance_id: the instantiation id to put into keys of pairs whose both halves are planned;
            None generates one when such pairs exist (pass one for reproducible plans).
        graph: optionally the loaded graph; its pair nodes get ``decision``, ``reason``,
            ``channel_key`` and ``region`` under ``data["rdmadev"]``. Small tensors of a step
            share channels (bundles) only where it is given: their dependencies are its edges.
        rules: the ``NativeRules`` (``rdmadev._core.PLANNER_RULES``): the slot layout the
            native protocol writes, and the pair ops.

    Returns:
        A ``Plan`` (call ``validate`` on it before use; ``plan_partitions`` does).

    Raises:
        PlanError: from the policy (e.g. a half pair larger than ``half_pair_capacity``).

    Example:
        >>> p = plan_regions(find_transfers(g, rules), Config(slots=3), "step-1", rules=rules)  # doctest: +SKIP
    """
    config = config or Config()
    planned = [dataclasses.replace(t) for t in transfers]
    if instance_id is None and any(t.halves == "both" for t in planned):
        instance_id = new_instance_id()
    decisions = [decide(t, config) for t in planned]
    for t, decision in zip(planned, decisions):
        t.decision, t.reason, t.detail = decision[:3]
    layout = rules.layout
    bundles = bundle_transfers(planned, config, graph, rules)  # needs every decision
    groups = defaultdict(lambda: defaultdict(list))  # (recv, send task) -> channel key -> transfers
    for t, (*_, cap, rank_cap) in zip(planned, decisions):
        t.channel_key = channel_key(t.bundle or t.channel_id, instance_id if t.halves == "both" else None)
        if t.decision == "swap":
            if t.bundle:
                cap, rank_cap = bundles[t.bundle], None
            t.slots, t.capacity_bytes, t.rank_capacity = config.slots_for(rank_cap), cap, rank_cap
            t.slot_bytes, t.payload_offset = layout.slot_bytes(cap, rank_cap)
            groups[(t.recv_task, t.send_task)][t.channel_key].append(t)
    regions, tasks = [], {}
    for recv_task, send_task in sorted(groups):
        block = tasks.setdefault(recv_task, TaskBlock(task=recv_task, total_bytes=0))
        region = Region(region_id=f"{recv_task}<-{send_task}", recv_task=recv_task, send_task=send_task,
                        offset=block.total_bytes, bytes=0, used_bytes=0)
        channels = groups[(recv_task, send_task)]
        keys = sorted(channels)
        offsets, region.used_bytes = end_to_end(channels[k][0].slots * channels[k][0].slot_bytes for k in keys)
        for key, offset in zip(keys, offsets):
            for t in channels[key]:
                t.region, t.offset = region.region_id, offset
                t.task_offset = region.offset + offset
            region.channels.append(key)
        region.bytes = round_up(region.used_bytes, layout.region_alignment)
        block.total_bytes += region.bytes
        block.regions.append(region.region_id)
        regions.append(region)
    plan = Plan(transfers=planned, regions=regions, tasks=[tasks[k] for k in sorted(tasks)], config=config,
                instance_id=instance_id, layout=layout.to_dict())
    if graph is not None:
        by_id = {t.channel_id: t for t in planned}
        for _, data in graph.nodes(data=True):
            t = by_id.get(data[NS].get("channel_id"))
            if t is not None:
                data[NS].update(decision=t.decision, reason=t.reason, channel_key=t.channel_key, region=t.region)
        graph.graph.setdefault(NS, {})["plan"] = plan
    log.debug("planned %d transfers: %d swapped in %d regions", len(planned), len(plan.swapped()), len(regions))
    return plan
