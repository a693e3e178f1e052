"""Bundles: small swapped tensors of one step between the same two devices share one channel.

Each pair of a step costs rdmadev ~11-19 µs beyond the first (a kernel on each side, a write,
a signal, a wait; BENCHMARKS.md, "What each extra pair of a step costs"), whatever it carries.
A bundle is one channel whose slot holds several static tensors at planned offsets: one
``RdmadevSendBundle`` copies them into the slot and writes it with one signal, one
``RdmadevRecvBundle`` waits once and outputs each of them (pass.cc, send_op.cc, recv_op.cc).

Merging pairs into one node may deadlock a step when one member's tensor depends on another's
arrival: the bundle's write would wait for a tensor that only its own wait lets be computed.
So members share a *level*, and a bundle never joins two tensors one of which may depend on
the other. ``level(n)`` of a node is the most pair receives on any path to it, counting the
node itself if it receives: ``1 + max(level(pred))`` for a receive (its pair's send is one of
its preds), ``max(level(pred))`` otherwise. A pair's level is its receive's minus one: at least
the level of its send and of every other input of its receive. Any path from a bundle's
outputs to an input of another pair's send or receive passes a receive of the bundle, so that
pair's level is higher: a bundle's two nodes never sit on a cycle, and neither do several
bundles (levels only rise along the graph's edges). The graph must be acyclic for that: a
function with a while loop (its NextIteration edges close cycles) gets no bundles.

Members: swapped pairs with both halves planned, of static shape and below
``Config.bundle_below_bytes`` (a control edge's empty tensor too: the signal of an ordering
comes with the bundle's), outside conditionals and loops, whose send has no output edge but
its pair's. Members of a (send device, receive device, level) group are taken in channel-id
order into bundles of at most ``BUNDLE_MAX_BYTES``; a group of one stays a channel of its own.
"""

import hashlib
import logging
from collections import defaultdict

import networkx as nx

from .find_transfers import _rendezvous  # the pair key find_transfers matches halves by
from .layout import round_up
from .load import NS
from .plan import DEFAULT_BUNDLE_BELOW_BYTES

__all__ = ["BUNDLE_ID_SHOWN", "BUNDLE_MAX_BYTES", "DEFAULT_BUNDLE_BELOW_BYTES", "bundle_transfers", "bundle_id", "levels"]

log = logging.getLogger(__name__)
log.addHandler(logging.NullHandler())

#: Most payload bytes one bundle carries: its sender copies them into one buffer, and its
#: receiver outputs none of them before the last has arrived. 256 KiB keeps that copy near
#: 20 µs; a group with more bytes is split into several bundles.
BUNDLE_MAX_BYTES = 256 << 10
#: Hex digits of a bundle's id that tables and reports show: enough to tell a step's bundles apart.
BUNDLE_ID_SHOWN = 6


def bundle_id(channel_ids):
    """The id of the bundle of the pairs `channel_ids` (16 hex digits, BLAKE2b of the sorted
    ids, one per line): the same on every task that plans the same pairs."""
    text = "\n".join(sorted(channel_ids))
    return hashlib.blake2b(text.encode("utf-8"), digest_size=8).hexdigest()


def levels(graph, rules):
    """``{node key: level}`` over every node of `graph` (module docstring), or None when the
    graph has a cycle (a while loop). A pair whose halves are on one task (two devices of it)
    is a dependency too, though find_transfers gives it no edge: it is added here. `rules`:
    the ``NativeRules`` (which ops are a pair's halves)."""
    deps = graph
    if graph.graph.get(NS, {}).get("same_task_pairs", 1):  # find_transfers counted them
        sends = {_rendezvous(key, data): key for key, data in graph.nodes(data=True)
                 if data["op"] in rules.send_ops}
        unseen = [(sends[rv], key) for key, data in graph.nodes(data=True) if data["op"] in rules.recv_ops
                  for rv in [_rendezvous(key, data)] if rv in sends and not graph.has_edge(sends[rv], key)]
        if unseen:  # a copy, to leave the caller's graph as it was
            deps = nx.DiGraph(graph)
            deps.add_edges_from(unseen)
    # Kahn's order: a node is done once all of its predecessors are, its level theirs at most
    # (plus one for a receive); nodes never done are on a cycle.
    waiting = {key: len(deps.pred[key]) for key in deps}
    level = dict.fromkeys(deps, 0)
    ready = [key for key, n in waiting.items() if n == 0]
    done = 0
    while ready:
        key = ready.pop()
        done += 1
        if graph.nodes[key]["op"] in rules.recv_ops:
            level[key] += 1
        for succ in deps.succ[key]:
            level[succ] = max(level[succ], level[key])
            waiting[succ] -= 1
            if waiting[succ] == 0:
                ready.append(succ)
    return level if done == len(waiting) else None


def _ends(graph):
    """``{(channel id, "send" | "recv"): node key}`` of the pair nodes find_transfers marked."""
    return {(data[NS]["channel_id"], data[NS]["end"]): key for key, data in graph.nodes(data=True)
            if "channel_id" in data.get(NS, {})}


def _eligible(t, config, graph, ends):
    if not (t.decision == "swap" and t.halves == "both" and t.bytes is not None
            and t.bytes < config.bundle_below_bytes and not t.in_cond and not t.in_loop):
        return False
    send, recv = ends.get((t.channel_id, "send")), ends.get((t.channel_id, "recv"))
    return send is not None and recv is not None and all(dst == recv for _, dst in graph.out_edges(send))


def bundle_transfers(transfers, config, graph, rules):
    """Groups the small swapped `transfers` of `graph` into bundles: sets ``bundle`` (its id)
    and ``bundle_offset`` (where the tensor starts in the slot's payload, aligned as `rules`'
    layout says) on each member, and returns ``{bundle id: payload bytes}``. Nothing is
    bundled when ``bundle_below_bytes`` is 0, without a graph, or when the graph has a cycle."""
    if not config.bundle_below_bytes or graph is None:
        return {}
    ends = _ends(graph)
    candidates = [t for t in transfers if _eligible(t, config, graph, ends)]
    if len(candidates) < 2:
        return {}
    level = levels(graph, rules)
    if level is None:
        log.debug("bundles: the graph has a cycle (a while loop); no pair is bundled")
        return {}
    groups = defaultdict(list)
    for t in candidates:
        groups[(t.send_device, t.recv_device, level[ends[(t.channel_id, "recv")]] - 1)].append(t)
    sizes, alignment = {}, rules.layout.alignment
    for key in sorted(groups):
        bundle, used = [], 0
        for t in sorted(groups[key], key=lambda t: t.channel_id):
            start = round_up(used, alignment)
            if bundle and start + t.bytes > BUNDLE_MAX_BYTES:
                _close(bundle, sizes, alignment)
                bundle, start = [], 0
            bundle.append(t)
            used = start + t.bytes
        _close(bundle, sizes, alignment)
    log.debug("bundled %d of %d small pairs into %d bundles", sum(1 for t in candidates if t.bundle),
              len(candidates), len(sizes))
    return sizes


def _close(bundle, sizes, alignment):
    """Makes `bundle` (two or more transfers) one: their offsets laid out in order."""
    if len(bundle) < 2:
        return
    bid = bundle_id(t.channel_id for t in bundle)
    used = 0
    for t in bundle:
        t.bundle, t.bundle_offset = bid, round_up(used, alignment)
        used = t.bundle_offset + t.bytes
    sizes[bid] = used
