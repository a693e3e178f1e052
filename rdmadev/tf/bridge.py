"""The Python half of the partition pass: called by the C++ POST_PARTITIONING pass (with
the GIL) for every function instantiation that has cross-task pairs. It runs the planner
(graph_pass, the one place policy lives), sets up every swapped channel through the
tasks' control services (rdmadev.cluster.channels), records a report, and tells the C++
side what to replace: a graph_pass.pass_view.PassView of the plan, which the pass reads field
by field, by name (_native/tf/pass/planner_call.cc; the fields are documented there).

Half pairs: a TF1 task's GraphMgr runs the pass on that task's partition alone (the function
name is empty there), so each half is planned by its own task as a dynamic channel, and the
halves meet through the receiver (ChannelTable.offer_halves), which sizes the slots from the
sender's shapes where it knows them, else RDMADEV_DYNAMIC_CAPACITY.
"""
import functools
import itertools
import logging
import os
import re

import graph_pass
from graph_pass.bundles import BUNDLE_ID_SHOWN
from graph_pass.pass_view import PassView
from graph_pass.plan import Config as PlanConfig

from .. import _core
from ..cluster import evictions, reports, runtime
from ..errors import ProtocolError
from ..cluster.opening import lineage
from .api import opt_in_marker

__all__ = ["rewrites", "plan_config", "lineage_scope", "OPS_CARRY", "OVER_BUDGET", "KEPT_ON_TF"]

log = logging.getLogger(__name__)
log.addHandler(logging.NullHandler())

_instances = itertools.count()


#: What rdmadev's ops carry, told to the planner so that its policy decides once: any shape (a
#: dynamic channel's slots carry a shape block, and a tensor larger than a slot goes staged or
#: in chunks), half pairs where a task's runtime can meet their peers (plan_config), dead
#: tensors (a pair in a conditional's branch keeps TF's _Send/_Recv nodes, labelled for
#: rdmadev's kernels, which send and output the deadness; pass.cc) and loops (a pair in a while
#: loop's frame is labelled alike, and the pass runs that frame's iterations one at a time on
#: each task, so that a channel carries them in order; pass.cc, RunIterationsInOrder).
OPS_CARRY = {"dynamic_shapes": True, "half_pairs": True, "dead_tensors": True, "loops": True}


#: A report's reason for a pair the plan swapped that stays on gRPC after all: its receiving
#: task has no room within RDMADEV_MAX_REGISTERED_BYTES (_kept_over_budget).
OVER_BUDGET = "over_budget"
#: A report's reason for a half pair (TF1) its two tasks could not set up, which carries its
#: tensors on TF's own path (half_pairs.py keep_on_tf; the task's log says why).
KEPT_ON_TF = "half_kept_on_tf"


def plan_config(config, halves=False):
    """The planner's settings for this process's rdmadev ``Config``; `halves`: whether half
    pairs are swapped (as dynamic channels of RDMADEV_DYNAMIC_CAPACITY), else kept."""
    carries = dict(OPS_CARRY, half_pairs=OPS_CARRY["half_pairs"] and halves)
    chosen = {name: getattr(config, name) for name in ("zero_copy_min_bytes", "bundle_below_bytes")
              if getattr(config, name) is not None}  # else the planner's defaults
    return PlanConfig(slots=config.slots, deadline_s=config.deadline_s, carries=carries,
                      default_dynamic_capacity=config.dynamic_capacity,
                      half_pair_capacity=config.dynamic_capacity if halves else None, **chosen)


def lineage_scope(function):
    """The name of `function` across its instantiations (opening.lineage): without TF's
    instantiation counter and an optimized function's opt-in token, so a retrace, a new
    tf.function of the same step, and the same step traced by a coordinator started again
    share it (``__inference_step__rdmadev_6c891183_22`` -> ``__inference_step``)."""
    return re.sub(r"_\d+$", "", function.split(opt_in_marker(), 1)[0])


def rewrites(partitions, function="", marked=(), task=""):
    """Plans `partitions` ({device: GraphDef bytes}) of an instantiation of `function`, which
    is or calls the rdmadev.optimize'd functions `marked`, and sets up the swapped channels
    through the runtime of `task`, the task partitioning when the pass can tell (a TF1
    task's own partition; "" else): a process may run several tasks (an in-process cluster),
    and without a task the coordinator's runtime plans (runtime.of_task).

    Returns:
        The ``PassView`` of the plan that the pass applies (empty when nothing is swapped).
    """
    rt = runtime.of_task(task)
    if rt is None:
        log.warning("rdmadev pass: this process has no rdmadev runtime (start tasks with "
                    "`rdmadev serve`, call rdmadev.enable()/optimize() in the coordinator); "
                    "the function stays on gRPC")
        return PassView()
    instance = f"{os.getpid():x}.{next(_instances)}"
    # Only a TF1 GraphMgr plans with no function name; a task runtime (it has a ChannelTable)
    # is where halves meet.
    halves = not function and rt.table is not None
    # The native side's rules and slot layout (rules.h, channel.h), from the bindings.
    plan = graph_pass.plan_partitions(partitions, plan_config(rt.config, halves),
                                      instance_id=instance, rules=_core.PLANNER_RULES)
    swap = [t for t in plan.transfers if t.decision == "swap"]
    try:
        fabrics, registered = evictions.open_within_budget(
            rt.call, instance, [t for t in swap if t.halves == "both"],
            {r.region_id: r.bytes for r in plan.regions}, function, marked,
            lineage_scope(function), table=rt.table)
    except ProtocolError as e:
        if e.over_budget is None:
            raise
        return _kept_over_budget(rt, instance, plan, function, marked, e)
    swapped, kept, capacities = [], [], {}
    for t in plan.transfers:
        route = f"{t.send_task} -> {t.recv_task}"
        if t.decision != "swap":
            kept.append((t.tensor_name, route, t.reason))
            continue
        fabric = fabrics.get(t.channel_key, f"{t.halves} half") + ("+zc" if t.zero_copy else "")
        if t.kind == "control":  # TF's dummy tensor for a control edge: a signal, no data
            swapped.append((t.tensor_name, route, reports.CONTROL, 0, fabric))
        else:
            swapped.append((t.tensor_name, route, t.dtype, t.bytes, fabric))
            if t.bytes is None and t.halves != "recv":  # a receiving half's slots: what its sender says
                capacities[t.tensor_name] = [t.capacity_bytes, t.capacity_bytes == t.bound_bytes]
    report = reports.Report(instance, swapped, kept, registered, function=function,
                            task=rt.name, marked=list(marked),
                            looped=[t.tensor_name for t in swap if t.in_loop], capacities=capacities,
                            bundled={t.tensor_name: t.bundle[:BUNDLE_ID_SHOWN] for t in swap if t.bundle},
                            via_host={t.tensor_name: [d for d, h in ((t.send_device, t.send_host),
                                                                     (t.recv_device, t.recv_host)) if h]
                                      for t in swap if t.via_host})
    if halves:
        _meet_halves(rt, [t for t in swap if t.halves != "both"], report)
    reports.record(report)
    log.info("%s", report)
    return PassView.of(plan, max_bytes=rt.config.max_tensor_bytes)


def _kept_over_budget(rt, instance, plan, function, marked, refused):
    """What rewrites returns when a receiving task has no room for the plan within its
    RDMADEV_MAX_REGISTERED_BYTES, even with every instantiation this process could evict gone
    (evictions.py): the instantiation stays on TF's gRPC path, as TF would run it, its report
    saying why (``over_budget``) and one WARNING naming the task and the fix."""
    kept = [(t.tensor_name, f"{t.send_task} -> {t.recv_task}",
             OVER_BUDGET if t.decision == "swap" else t.reason) for t in plan.transfers]
    report = reports.Report(instance, [], kept, {}, function=function, task=rt.name,
                            marked=list(marked))
    reports.record(report)
    log.warning("rdmadev: instance %s%s stays on gRPC: %s has no room for its channels within "
                "its registered-memory budget, and nothing this process planned is left to "
                "evict there; %s", instance, f" ({function})" if function else "",
                refused.over_budget, refused)  # which names the bytes, the limit and the fix
    return PassView()


def _meet_halves(rt, halves, report):
    """Records the sending halves of `halves` (swapped Transfers planned on one side) as
    wanted here and offers the receiving ones to their senders (ChannelTable.offer_halves);
    `report` learns each sender's fabric and the bytes registered once they met."""
    sending = [t for t in halves if t.halves == "send"]
    # The receiver sizes the slots: a static tensor's bytes, else the bound the policy took.
    rt.table.want_halves({t.channel_key: t.bytes if t.bytes is not None else
                          t.capacity_bytes if t.bound_bytes is not None else None for t in sending},
                         {t.channel_key: t.recv_task for t in sending},
                         functools.partial(_kept_sending, report,
                                           {t.channel_key: t.tensor_name for t in sending}))
    by_sender = {}
    for t in halves:
        if t.halves == "recv":
            by_sender.setdefault(t.send_task, []).append(
                {"key": t.channel_key, "lineage": lineage("", t), "slots": t.slots,
                 "capacity_bytes": t.capacity_bytes, "rank_capacity": t.rank_capacity})
    for sender, channels in by_sender.items():
        rt.table.offer_halves(sender, channels, functools.partial(_met, report, sender))


def _kept_sending(report, names, keys):
    """`report` says the sending halves `keys` (their tensors: `names`, ``{key: tensor name}``)
    are kept on TF's path."""
    kept = {names[k] for k in keys}
    report.kept += [(s[0], s[1], KEPT_ON_TF) for s in report.swapped if s[0] in kept]
    report.swapped = [s for s in report.swapped if s[0] not in kept]


def _met(report, sender, fabric, registered):
    """Completes `report` once the receiving halves from `sender` met theirs, or (`fabric`
    None) were kept on TF's path."""
    route = f"{sender} -> {report.task}"
    if fabric is None:
        report.kept += [(s[0], route, KEPT_ON_TF) for s in report.swapped if s[1] == route]
        report.swapped = [s for s in report.swapped if s[1] != route]
        return
    report.swapped = [(*s[:4], s[4].replace("recv half", f"{fabric} half", 1) if s[1] == route else s[4])
                      for s in report.swapped]
    report.registered[report.task] = report.registered.get(report.task, 0) + registered
