"""The Python half of the partition pass: called by the C++ POST_PARTITIONING pass (with
the GIL) for every function instantiation that has cross-task pairs. It runs the planner
(graph_pass, the one place policy lives), sets up every swapped channel through the
tasks' control services, records a report, and tells the C++ side what to replace.

Each rewrite is a tuple (kind, partition, node, channel, dtype enum, shape, zero_copy,
timeout_s) with kind "send" or "recv".
"""
import dataclasses
import itertools
import logging
import os
import threading

import graph_pass
from graph_pass.plan import Config as PlanConfig

from . import _core, runtime

__all__ = ["rewrites", "Report", "reports"]

log = logging.getLogger(__name__)
log.addHandler(logging.NullHandler())

_instances = itertools.count()
_reports = []
_reports_lock = threading.Lock()


@dataclasses.dataclass
class Report:
    """What one instantiation moved where."""

    instance: str
    swapped: list        # [(tensor_name, send_task -> recv_task, dtype, bytes, fabric[+zc])]
    kept: list           # [(tensor_name, send_task -> recv_task, reason)]
    registered: dict     # recv task -> bytes registered there

    def __str__(self):
        lines = [f"rdmadev instance {self.instance}: {len(self.swapped)} transfers swapped, "
                 f"{len(self.kept)} stayed on gRPC"]
        if not self.swapped and not self.kept:
            lines[0] = f"rdmadev instance {self.instance}: no cross-task transfer (nothing to do)"
        for name, route, dtype, nbytes, fabric in self.swapped:
            lines.append(f"  {fabric:<8} {route}  {name} {dtype} {nbytes} B")
        for name, route, reason in self.kept:
            lines.append(f"  grpc     {route}  {name} ({reason})")
        for task, nbytes in sorted(self.registered.items()):
            lines.append(f"  registered on {task}: {nbytes} B")
        return "\n".join(lines)


def reports():
    """Reports of every instantiation planned in this process, oldest first."""
    with _reports_lock:
        return list(_reports)


def _dtype_enum(name):
    from tensorflow.core.framework import types_pb2
    return types_pb2.DataType.Value(name)


def _region_bytes(plan):
    return {r.region_id: r for r in plan.regions}


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
    regions = _region_bytes(plan)
    out, swapped, kept, registered = [], [], [], {}
    allocated = {}
    for t in plan.transfers:
        route = f"{t.send_task} -> {t.recv_task}"
        if t.decision != "swap":
            kept.append((t.tensor_name, route, t.reason))
            continue
        if t.rank_capacity is not None or t.halves != "both":
            kept.append((t.tensor_name, route, "dynamic or half pair: not carried by this version's ops"))
            continue
        if _core.ring_bytes(t.slots, t.capacity_bytes) != t.slots * t.slot_bytes:
            kept.append((t.tensor_name, route, "plan slot layout differs from the ring layout"))
            continue
        region = regions[t.region]
        if t.region not in allocated:
            allocated[t.region] = rt.call(t.recv_task, {
                "op": "alloc_region", "region": f"{instance}/{t.region}", "bytes": region.bytes,
                "sender": t.send_task})
            registered[t.recv_task] = registered.get(t.recv_task, 0) + region.bytes
        ring = allocated[t.region]
        sent = rt.call(t.send_task, {
            "op": "send_channel", "key": t.channel_key, "slots": t.slots,
            "capacity": t.capacity_bytes, "offset": t.offset,
            "receiver_address": ring["address"], "ring": ring["descriptor"]})
        rt.call(t.recv_task, {
            "op": "recv_channel", "key": t.channel_key, "region": f"{instance}/{t.region}",
            "slots": t.slots, "capacity": t.capacity_bytes, "offset": t.offset,
            "sender_address": sent["address"], "credit": sent["credit"]})
        dtype = _dtype_enum(t.dtype)
        timeout = rt.config.deadline_s
        out.append(("send", t.send_device, t.send_node, t.channel_key, dtype, [], False, timeout))
        out.append(("recv", t.recv_device, t.recv_node, t.channel_key, dtype, list(t.shape),
                    bool(t.zero_copy), timeout))
        swapped.append((t.tensor_name, route, t.dtype, t.bytes,
                        sent["fabric"] + ("+zc" if t.zero_copy else "")))
    report = Report(instance, swapped, kept, registered)
    with _reports_lock:
        _reports.append(report)
    log.info("%s", report)
    return out
