"""The Python half of the partition pass: called by the C++ POST_PARTITIONING pass (with
the GIL) for every function instantiation that has cross-task pairs. It runs the planner
(graph_pass, the one place policy lives), sets up every swapped channel through the
tasks' control services (rdmadev.cluster.channels), records a report, and tells the C++
side what to replace.

Each rewrite is a tuple (kind, partition, node, channel, dtype enum, shape, zero_copy,
timeout_s, max_bytes) with kind "send" or "recv"; shape has -1 for a dim known only at run time
and is None when the rank is too (a dynamic channel's slots carry the shape).
"""
import itertools
import logging
import os

import graph_pass
from graph_pass.plan import Config as PlanConfig

from .. import _core
from ..cluster import reports, runtime
from ..cluster.channels import open_channels
from ..errors import ProtocolError

__all__ = ["rewrites", "plan_config", "check_wire_layout", "OPS_CARRY"]

log = logging.getLogger(__name__)
log.addHandler(logging.NullHandler())

_instances = itertools.count()


def _dtype_enum(name):
    from tensorflow.core.framework import types_pb2
    return types_pb2.DataType.Value(name)


#: What RdmadevSend/RdmadevRecv carry, told to the planner so that its policy decides once:
#: any shape (a dynamic channel's slots carry a shape block, and a tensor larger than a slot
#: goes in chunks), and only pairs whose both halves are planned here (a TF1 half pair cannot
#: agree on a size from the attrs alone).
OPS_CARRY = {"dynamic_shapes": True, "half_pairs": False}


def plan_config(config):
    """The planner's settings for this process's rdmadev ``Config``."""
    return PlanConfig(slots=config.slots, deadline_s=config.deadline_s, carries=dict(OPS_CARRY),
                      default_dynamic_capacity=config.dynamic_capacity)


def check_wire_layout(plan):
    """Refuses a plan whose slot layout differs from the one the native protocol writes.

    Raises:
        ProtocolError: naming the field, the plan's value and the native one.
    """
    native = dict(_core.wire_layout())
    planned = dict(plan.layout)
    # The native signal is the two header words written together: the plan states their widths.
    planned["signal_bytes"] = (plan.layout.get("seq_bytes") or 0) + (plan.layout.get("length_bytes") or 0)
    for key, value in native.items():
        if planned.get(key) != value:
            raise ProtocolError(
                f"the plan's slot layout has {key}={planned.get(key)!r} but the native library "
                f"writes {key}={value!r}", hint="graph_pass and rdmadev's native library come from "
                "different versions: reinstall rdmadev (pip install -e .)")


def rewrites(partitions, function="", marked=()):
    """Plans `partitions` ({device: GraphDef bytes}) of an instantiation of `function`, which
    is or calls the rdmadev.optimize'd functions `marked`, and sets up the swapped channels."""
    rt = runtime.current()
    if rt is None:
        log.warning("rdmadev pass: this process has no rdmadev runtime (start tasks with "
                    "`rdmadev serve`, call rdmadev.enable()/optimize() in the coordinator); "
                    "the function stays on gRPC")
        return []
    instance = f"{os.getpid():x}.{next(_instances)}"
    plan = graph_pass.plan_partitions(partitions, plan_config(rt.config), instance_id=instance)
    check_wire_layout(plan)
    swap = [t for t in plan.transfers if t.decision == "swap"]
    fabrics, registered = open_channels(rt.call, instance, swap,
                                        {r.region_id: r.bytes for r in plan.regions}, function,
                                        marked)
    out, swapped, kept = [], [], []
    timeout, limit = plan.config.deadline_s, rt.config.max_tensor_bytes
    for t in plan.transfers:
        route = f"{t.send_task} -> {t.recv_task}"
        if t.decision != "swap":
            kept.append((t.tensor_name, route, t.reason))
            continue
        dtype = _dtype_enum(t.dtype)
        shape = None if t.shape is None else list(t.shape)  # None: the rank travels too
        out.append(("send", t.send_device, t.send_node, t.channel_key, dtype, [], False, timeout,
                    limit))
        out.append(("recv", t.recv_device, t.recv_node, t.channel_key, dtype, shape,
                    bool(t.zero_copy), timeout, limit))
        fabric = fabrics[t.channel_key] + ("+zc" if t.zero_copy else "")
        swapped.append((t.tensor_name, route, t.dtype, t.bytes, fabric))
    report = reports.Report(instance, swapped, kept, registered, function=function,
                            task=rt.task or "coordinator", marked=list(marked))
    reports.record(report)
    log.info("%s", report)
    return out
