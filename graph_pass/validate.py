"""Pass 4, validate: check a plan's invariants; every problem names the node or region and the fix.

Invariants: the plan has this graph_pass's schema and version, and the native layout when one is
given (else the layout it records is checked for itself); every transfer has a
decision and a reason that matches it; channel ids and keys are unique (the members of a bundle share one key, one layout, and do not
overlap in its slots); every write has exactly
one wait (in the plan, and in the graph when given); each swapped transfer sits in exactly one
region of its own task pair, with an aligned, correctly sized slot layout; channels in a region
and regions in a task do not overlap; region and task sizes add up.
"""

import logging
from collections import Counter

from .errors import ConfigError, ValidationError
from .layout import Layout, round_up
from .load import NS
from .plan import PLAN_SCHEMA, PLAN_VERSION
from .policy import REASONS

__all__ = ["validate", "problems"]

log = logging.getLogger(__name__)
log.addHandler(logging.NullHandler())

_REPLAN = "re-run plan_regions on the transfers instead of editing the plan"


def _check_header(plan, rules, out):
    """The plan's schema and version, and its layout (returned: the one to check it with, None
    when it has none)."""
    if plan.schema != PLAN_SCHEMA or plan.version != PLAN_VERSION:
        out.append(f"plan is {plan.schema!r} v{plan.version}, expected {PLAN_SCHEMA!r} v{PLAN_VERSION}: "
                   f"re-plan with this graph_pass")
    if rules is not None:
        native = rules.layout.to_dict()
        if plan.layout != native:
            diff = sorted(k for k in set(plan.layout) | set(native) if plan.layout.get(k) != native.get(k))
            out.append(f"plan layout differs from the native one in {diff}: "
                       + ", ".join(f"{k}={plan.layout.get(k)!r} (native {native.get(k)!r})" for k in diff)
                       + "; re-plan with the graph_pass and native library installed together")
        return rules.layout
    try:
        return Layout.from_dict(plan.layout)
    except ConfigError as exc:
        out.append(f"plan layout: {exc}; re-plan with this graph_pass")
        return None


def _check_transfer(t, plan, regions, layout, out):
    who = f"{t.send_op or t.recv_op or 'pair'} {t.label!r} ({t.tensor_name})"
    if t.decision not in ("swap", "keep"):
        out.append(f"{who} has no decision: {_REPLAN}")
        return
    if t.reason not in REASONS:
        out.append(f"{who} is {'kept' if t.decision == 'keep' else 'swapped'} without a known reason "
                   f"({t.reason!r}): every decision needs a reason from graph_pass.policy.REASONS; {_REPLAN}")
    elif REASONS[t.reason][0] != t.decision:
        out.append(f"{who} has decision {t.decision!r} but reason {t.reason!r} means "
                   f"{REASONS[t.reason][0]!r}: {_REPLAN}")
    if t.decision == "keep":
        if t.region is not None:
            out.append(f"{who} is kept on gRPC but placed in region {t.region}: {_REPLAN}")
        return
    own = t.bundle or t.channel_id
    if t.halves == "both" and plan.instance_id and t.channel_key != f"{own}@{plan.instance_id}":
        out.append(f"{who} has channel key {t.channel_key!r}, expected '{own}@{plan.instance_id}': "
                   f"{_REPLAN}")
    carried = plan.config.carries
    if t.halves != "both" and not carried["half_pairs"]:
        out.append(f"{who} is swapped with only its {t.halves} half planned, but config.carries says the ops do not "
                   f"carry half pairs: {_REPLAN}")
    if t.halves == "both" and t.rank_capacity is not None and not carried["dynamic_shapes"]:
        out.append(f"{who} is swapped as a dynamic channel, but config.carries says the ops do not carry dynamic "
                   f"shapes: {_REPLAN}")
    region = regions.get(t.region)
    if region is None:
        out.append(f"{who} is swapped but its region {t.region!r} is not in the plan: {_REPLAN}")
        return
    if (region.recv_task, region.send_task) != (t.recv_task, t.send_task):
        out.append(f"{who} goes {t.send_task} -> {t.recv_task} but sits in region {region.region_id}: {_REPLAN}")
    if t.slots is None or t.slots < 1 or t.slots != plan.config.slots_for(t.rank_capacity):
        out.append(f"{who} has {t.slots} slots, the config gives {plan.config.slots_for(t.rank_capacity)}: "
                   f"{_REPLAN}")
    if t.capacity_bytes is None or t.slot_bytes is None:
        out.append(f"{who} is swapped without a slot layout: {_REPLAN}")
        return
    if layout is None:
        return
    if t.bundle is not None:
        if t.bytes is None or t.rank_capacity is not None or t.halves != "both" or t.in_cond or t.in_loop \
                or t.bundle_offset is None or t.bundle_offset % layout.alignment \
                or t.bundle_offset + t.bytes > t.capacity_bytes:
            out.append(f"{who} is in bundle {t.bundle} at {t.bundle_offset} (slots of {t.capacity_bytes} B), "
                       f"but only a static pair of {t.bytes} B planned whole, outside conditionals and loops, "
                       f"fits a bundle at an aligned offset within its slots: {_REPLAN}")
    elif t.bytes is not None and t.rank_capacity is None and t.capacity_bytes != t.bytes:
        out.append(f"{who} carries {t.bytes} bytes but its static slots hold {t.capacity_bytes}: {_REPLAN}")
    expected = layout.slot_bytes(t.capacity_bytes, t.rank_capacity)
    if (t.slot_bytes, t.payload_offset) != expected:
        out.append(f"{who} has slot_bytes/payload_offset {(t.slot_bytes, t.payload_offset)}, the layout gives "
                   f"{expected} for {t.capacity_bytes} B: {_REPLAN}")
    if t.offset is None or t.offset % layout.alignment or t.task_offset != region.offset + t.offset:
        out.append(f"{who} has offset {t.offset} / task_offset {t.task_offset} in region {region.region_id} at "
                   f"{region.offset}: offsets must be {layout.alignment}-aligned and consistent; {_REPLAN}")


def _check_bundles(plan, out):
    """The members of each bundle: one channel (the same key and layout), tensors that do not
    overlap in its slots, all going between the same two devices."""
    members = {}
    for t in plan.transfers:
        if t.bundle is not None:
            members.setdefault(t.bundle, []).append(t)
    for bid, ts in members.items():
        shared = {(t.channel_key, t.region, t.offset, t.slots, t.slot_bytes, t.capacity_bytes,
                   t.send_device, t.recv_device, t.decision) for t in ts}
        if len(ts) < 2 or len(shared) != 1:
            out.append(f"bundle {bid} has {len(ts)} members on {len(shared)} different channels or routes; a "
                       f"bundle is one channel of two or more swapped pairs between two devices: {_REPLAN}")
        spans = sorted((t.bundle_offset or 0, (t.bundle_offset or 0) + (t.bytes or 0), t.label) for t in ts)
        for (a0, a1, la), (b0, _, lb) in zip(spans, spans[1:]):
            if b0 < a1:
                out.append(f"bundle {bid}: {lb!r} at {b0} overlaps {la!r} (ends {a1}): {_REPLAN}")


def _check_regions(plan, by_key, layout, out):
    seen = Counter()
    for r in plan.regions:
        spans = []
        for key in r.channels:
            seen[key] += 1
            t = by_key.get(key)
            if t is None or t.decision != "swap" or t.region != r.region_id:
                out.append(f"region {r.region_id} lists channel {key!r}, which is not a swapped transfer placed "
                           f"there: {_REPLAN}")
                continue
            if t.offset is not None and t.slots and t.slot_bytes:
                spans.append((t.offset, t.offset + t.slots * t.slot_bytes, t.label))
        spans.sort()
        end, last = 0, None
        for start, stop, label in spans:
            if start < end:
                out.append(f"region {r.region_id}: channel of {label!r} at {start} overlaps {last!r} (ends {end}): "
                           f"{_REPLAN}")
            end, last = max(end, stop), label
        if r.used_bytes != sum(b - a for a, b, _ in spans) or end > r.used_bytes:
            out.append(f"region {r.region_id}: used_bytes={r.used_bytes} but its channels span {end} bytes "
                       f"(sum {sum(b - a for a, b, _ in spans)}): {_REPLAN}")
        align = layout.region_alignment if layout is not None else None
        if align and (r.bytes != round_up(r.used_bytes, align) or r.offset % align):
            out.append(f"region {r.region_id}: bytes={r.bytes}, offset={r.offset} must be {align}"
                       f"-aligned and cover used_bytes={r.used_bytes}: {_REPLAN}")
    for t in plan.transfers:
        if t.decision == "swap" and seen[t.channel_key] != 1:
            out.append(f"{t.send_op or t.recv_op} {t.label!r} ({t.tensor_name}) is listed in {seen[t.channel_key]} "
                       f"regions, expected exactly 1: {_REPLAN}")


def _check_tasks(plan, out):
    regions = {r.region_id: r for r in plan.regions}
    owner = Counter()
    for b in plan.tasks:
        spans = []
        for rid in b.regions:
            owner[rid] += 1
            r = regions.get(rid)
            if r is None or r.recv_task != b.task:
                out.append(f"task {b.task} lists region {rid!r}, which is not a region received by it: {_REPLAN}")
                continue
            spans.append((r.offset, r.offset + r.bytes, rid))
        spans.sort()
        for (a0, a1, ra), (b0, _, rb) in zip(spans, spans[1:]):
            if b0 < a1:
                out.append(f"task {b.task}: region {rb} at {b0} overlaps region {ra} (ends {a1}): {_REPLAN}")
        total = sum(b1 - b0 for b0, b1, _ in spans)
        if b.total_bytes != total:
            out.append(f"task {b.task}: total_bytes={b.total_bytes} but its regions add up to {total}: {_REPLAN}")
    for rid in regions:
        if owner[rid] != 1:
            out.append(f"region {rid} belongs to {owner[rid]} task blocks, expected exactly 1: {_REPLAN}")


def _check_graph(plan, graph, out):
    ends = Counter()
    for key, data in graph.nodes(data=True):
        cid = data.get(NS, {}).get("channel_id")
        if cid is not None:
            ends[(cid, data[NS]["end"])] += 1
    for t in plan.swapped():
        for end, node in (("send", t.send_node), ("recv", t.recv_node)):
            if node is not None and ends[(t.channel_id, end)] != 1:
                role = "write" if end == "send" else "wait"
                out.append(f"{t.label!r} ({t.tensor_name}): the graph has {ends[(t.channel_id, end)]} {end} nodes for "
                           f"this channel, so its {role} would not have exactly one partner; plan this graph again "
                           f"with find_transfers")


def problems(plan, graph=None, rules=None):
    """Return the list of broken invariants of ``plan`` (empty when it is valid).

    Args:
        plan: a ``Plan``.
        graph: optionally the loaded graph the plan came from, to check writes against waits there.
        rules: optionally the ``NativeRules`` the plan must agree with (its layout); without
            them the plan's slots are checked against the layout it records.

    Returns:
        A list of messages, each naming the node or region at fault and the fix.
    """
    out = []
    layout = _check_header(plan, rules, out)
    regions = {r.region_id: r for r in plan.regions}
    for what in ("channel_id", "channel_key"):
        owners = plan.transfers
        if what == "channel_key":  # the members of a bundle share its channel: one owner per bundle
            owners = {(t.bundle, t.channel_key) if t.bundle else id(t): t for t in plan.transfers}.values()
        counts = Counter(getattr(t, what) for t in owners)
        for t in plan.transfers:
            if counts[getattr(t, what)] > 1:
                out.append(f"{t.label!r} ({t.tensor_name}) shares {what} {getattr(t, what)!r} with another transfer: "
                           f"rendezvous keys must be unique; plan each instantiation separately")
    for t in plan.transfers:
        _check_transfer(t, plan, regions, layout, out)
        if t.decision == "swap" and t.halves == "both" and (not t.send_node or not t.recv_node):
            out.append(f"{t.label!r}: a swapped pair needs one write and one wait: {_REPLAN}")
    by_key = {t.channel_key: t for t in plan.transfers}
    _check_bundles(plan, out)
    _check_regions(plan, by_key, layout, out)
    _check_tasks(plan, out)
    if graph is not None:
        _check_graph(plan, graph, out)
    return out


def validate(plan, graph=None, rules=None):
    """Check every invariant of ``plan``; raise if any is broken.

    Args:
        plan: a ``Plan``.
        graph: optionally the loaded graph the plan came from.
        rules: optionally the ``NativeRules`` the plan must agree with (see ``problems``).

    Returns:
        ``plan`` itself, so calls chain: ``validate(plan_regions(...))``.

    Raises:
        ValidationError: with ``.problems``, one message per broken invariant.
    """
    found = problems(plan, graph, rules)
    if found:
        raise ValidationError(found)
    return plan
