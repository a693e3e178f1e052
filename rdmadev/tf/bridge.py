"""The Python half of the partition pass: called by the C++ POST_PARTITIONING pass (with
the GIL) for every function instantiation that has cross-task pairs. It runs the planner
(graph_pass, the one place policy lives), sets up every swapped channel through the
tasks' control services (rdmadev.cluster.channels), records a report, and tells the C++
side what to replace.

Each rewrite is a tuple (kind, partition, node, channel, dtype enum, shape, zero_copy,
timeout_s) with kind "send" or "recv".
"""
import itertools
import logging
import os

import graph_pass
from graph_pass.plan import Config as PlanConfig

from .. import _core
from ..cluster import reports, runtime
from ..cluster.channels import open_channel

__all__ = ["rewrites"]

log = logging.getLogger(__name__)
log.addHandler(logging.NullHandler())

_instances = itertools.count()


def _dtype_enum(name):
    from tensorflow.core.framework import types_pb2
    return types_pb2.DataType.Value(name)


def _not_carried(t):
    """Why this version's ops cannot carry a transfer the planner swapped, or None."""
    if t.rank_capacity is not None or t.halves != "both":
        return "dynamic or half pair: not carried by this version's ops"
    if _core.ring_bytes(t.slots, t.capacity_bytes) != t.slots * t.slot_bytes:
        return "plan slot layout differs from the ring layout"
    return None


def rewrites(partitions):
    """Plans `partitions` ({device: GraphDef bytes}) and sets up the swapped channels."""
    rt = runtime.current()
    if rt is None:
        log.warning("rdmadev pass: this process has no rdmadev runtime (start tasks with "
                    "`rdmadev serve`, call rdmadev.enable()/optimize() in the coordinator); "
                    "the function stays on gRPC")
        return []
    instance = f"{os.getpid():x}.{next(_instances)}"
    plan = graph_pass.plan_partitions(partitions, PlanConfig(slots=rt.config.slots),
                                      instance_id=instance)
    regions = {r.region_id: r for r in plan.regions}
    out, swapped, kept, registered = [], [], [], {}
    allocated = {}
    timeout = rt.config.deadline_s
    for t in plan.transfers:
        route = f"{t.send_task} -> {t.recv_task}"
        reason = t.reason if t.decision != "swap" else _not_carried(t)
        if reason is not None:
            kept.append((t.tensor_name, route, reason))
            continue
        region_bytes = regions[t.region].bytes
        fabric, fresh = open_channel(rt.call, instance, t, region_bytes, allocated)
        if fresh:
            registered[t.recv_task] = registered.get(t.recv_task, 0) + region_bytes
        dtype = _dtype_enum(t.dtype)
        out.append(("send", t.send_device, t.send_node, t.channel_key, dtype, [], False, timeout))
        out.append(("recv", t.recv_device, t.recv_node, t.channel_key, dtype, list(t.shape),
                    bool(t.zero_copy), timeout))
        swapped.append((t.tensor_name, route, t.dtype, t.bytes, fabric + ("+zc" if t.zero_copy else "")))
    report = reports.Report(instance, swapped, kept, registered)
    reports.record(report)
    log.info("%s", report)
    return out
