"""The planning process's side of channel setup: ``open_channels``, and the shape of the
setup requests the tasks' ChannelTables serve (channels.py).

Each receiving task gets one ``open_pairs`` request (receivers in parallel). A pair whose
sender is the planning task (a worker instantiating a step that updates the ps) is offered in
it with the sender's credit region, so the receiver binds its halves and answers with its ring,
and the planner binds its own: one round trip. For any other pair the receiver makes one
``attach_senders`` call to the sender (senders in parallel), except that the planner's own
call to a task it also sends to rides in the ``open_pairs`` it sends there (``"attach"``): a
worker whose step reads and updates the ps sets the step up in one round trip to the ps.

Example:
    >>> fabrics, registered = open_channels(rt.call, instance, swapped, region_bytes)
"""
import hashlib
import logging
import threading

from ..errors import ProtocolError, RegionError
from . import instances

__all__ = ["open_channels", "in_parallel", "lineage", "LAYOUT_FIELDS"]

log = logging.getLogger(__name__)
log.addHandler(logging.NullHandler())

#: The fields of a channel in setup requests besides its key: the plan's ring layout.
LAYOUT_FIELDS = ("slots", "slot_bytes", "payload_offset", "capacity_bytes", "offset")


def lineage(scope, t):
    """The name of transfer `t`'s channel across instantiations: what its receiving task
    learns of it (the slots it grew to) is kept under this name for the channels of later
    instantiations (growth.py). `scope` names the function across its
    instantiations (bridge.lineage_scope: a retrace, or the same step traced by a new
    coordinator); the tensor and the tasks it goes between are the rendezvous attrs without
    the sending task's incarnation (a restarted task plans its channels under new keys).

    Returns:
        16 lowercase hex digits: BLAKE2b (8 bytes) of the five names, one per line.
    """
    text = "\n".join((scope, t.tensor_name, t.send_task, t.recv_task, t.dtype))
    return hashlib.blake2b(text.encode("utf-8"), digest_size=8).hexdigest()


def _channel_entry(t, scope):
    """Transfer `t` as setup requests carry it."""
    return {"key": t.channel_key, "lineage": lineage(scope, t),
            **{f: getattr(t, f) for f in LAYOUT_FIELDS}}


def in_parallel(fn, items):
    """[fn(item) for item in items], concurrently when there are several, each on a thread of
    its own (started here: a pool's bookkeeping cost more than the threads). Every call runs
    to completion; the first failure (in item order) is raised after all have ended."""
    items = list(items)
    if len(items) <= 1:
        return [fn(item) for item in items]
    results, failures = [None] * len(items), [None] * len(items)

    def run(i):
        try:
            results[i] = fn(items[i])
        except BaseException as e:  # raised below, on the caller's thread
            failures[i] = e
    threads = [threading.Thread(target=run, args=(i,), name="rdmadev-setup", daemon=True)
               for i in range(len(items))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for e in failures:
        if e is not None:
            raise e
    return results


def open_channels(call, instance, transfers, region_bytes, function="", marked=(), scope="",
                  again=False, table=None):
    """Sets up the channels of an instantiation's swapped transfers: one ``open_pairs``
    request per receiving task (in parallel), one ``attach_senders`` round trip from each
    receiver to each of its senders (in parallel) but the planning task. A planning task
    sends one request to each peer: it offers the pairs it sends on, and carries its own
    attach_senders to a peer that also receives from it in the open_pairs it sends there.

    Args:
        call: ``call(task, request) -> result`` (``Runtime.call``).
        instance: the instantiation id (prefix of region labels).
        transfers: the graph_pass Transfers decided "swap" (the members of a bundle set up
            its channel once).
        region_bytes: ``{region id: bytes}`` of the plan's regions.
        function: the name of the function instantiated, and `marked` the optimized functions
            it is or calls (releases follow them: instances.py).
        scope: the function's name across its instantiations (lineage).
        again: the instantiation's channels were evicted and are set up again (counted by
            the tasks as ``set_up_again``: evictions.py).
        table: the planning task's ChannelTable when a task plans: the pairs it sends on are
            offered with their credit region (ChannelTable.credit_region), and it binds its
            halves from the receiver's answer (bind_offered); its own open_pairs is served
            here, its attach_senders carried to the peers it sends to (``"attach"``).
    Returns:
        ``({channel key: fabric}, {recv task: bytes registered there})``.
    Raises:
        ProtocolError: naming the receiving task, and the sender and channel where known;
            ``over_budget`` is that task when it refused for lack of registered memory
            (RDMADEV_MAX_REGISTERED_BYTES), else None.
    """
    transfers = list({t.channel_key: t for t in transfers}.values())  # a bundle's share one channel
    pairs = {}  # recv task -> send task -> [transfer]
    for t in transfers:
        pairs.setdefault(t.recv_task, {}).setdefault(t.send_task, []).append(t)

    planner = table.task if table is not None else None
    # A task the planner both sends to and receives from gets one request: the planner's own
    # open_pairs (served in this process) carries its attach_senders to that task in the
    # open_pairs it sends there (ChannelTable.open_pairs' `via`).
    carried = [s for s in pairs.get(planner, ()) if s in pairs and s != planner]
    answers, carried_failures = {}, {}

    def open_receiver(recv_task, attach=None):
        senders = pairs[recv_task]
        entries = [{"sender": s, "bytes": region_bytes[ts[0].region],
                    "channels": [_channel_entry(t, scope) for t in ts]}
                   for s, ts in senders.items()]
        offered = None  # this task's credit region for the pair it sends on, offered
        try:
            if planner in senders and planner != recv_task:
                offered = table.credit_region(recv_task, len(senders[planner]))
                mine = next(e for e in entries if e["sender"] == planner)
                mine["offer"] = {"address": table.domain.address,
                                 "credit": offered.descriptor.hex()}
            request = {"op": "open_pairs", "instance": instance, "pairs": entries}
            if again:
                request["again"] = True
            if attach is not None:
                request["attach"] = attach
            if recv_task == planner and carried:
                answer = table.open_pairs(request, via={s: carry(s) for s in carried})
            else:
                answer = call(recv_task, request)
        except Exception as e:
            if offered is not None:  # the receiver may hold it: its span waits out late writes
                offered.close()
            failed = next((carried_failures[s] for s in carried if s in carried_failures), None)
            if recv_task == planner and failed is not None:  # the carrying request's own
                raise failed from None
            refused = ProtocolError(f"receiving task {recv_task} could not set up channels "
                                    f"from {', '.join(senders)}: {e}")
            # Past the budget: a peer's refusal names its class (kind), the planner's own
            # open_pairs (served in this process) raises it.
            if getattr(e, "kind", "") == "RegionError" or isinstance(e, RegionError):
                refused.over_budget = recv_task
            raise refused from None
        if offered is not None:
            opened = next(d for d in answer["pairs"] if d["sender"] == planner)
            try:
                table.bind_offered(recv_task, offered, opened)
            except Exception as e:
                raise ProtocolError(f"task {planner} could not bind its sending halves to "
                                    f"{recv_task}: {e}") from None
        answers[recv_task] = answer["pairs"]
        return answer

    def carry(sender):
        def via(attach):  # the planner's attach_senders to `sender`, in its open_pairs there
            try:
                answer = open_receiver(sender, attach)
                if "attached" not in answer:
                    raise ProtocolError(f"task {sender} set up its pairs but not the attach "
                                        "carried with them",
                                        hint="run the same rdmadev version in every task")
                return answer["attached"]
            except Exception as e:
                carried_failures[sender] = e
                raise
        return via

    try:
        in_parallel(open_receiver, [t for t in pairs if t not in carried])
    except Exception:
        # Pairs that did open would otherwise stay bound: nothing will ever use them. No step
        # ran on them (the instantiation is still being planned, or waits at its gate to be
        # set up again: evictions.py), so nothing is in flight and no memory is kept.
        keys = [t.channel_key for t in transfers]
        tasks = {t.recv_task for t in transfers} | {t.send_task for t in transfers}
        for task in sorted(tasks):
            try:
                call(task, {"op": "release", "keys": keys, "half": "both", "quiescent": True})
            except Exception as e:
                log.info("rdmadev: could not release the channels of %s at %s: %s",
                         instance, task, e)
        raise
    instances.track(call, instance, transfers, function, marked)
    fabrics, registered = {}, {}
    for recv_task, done in answers.items():
        for p in done:
            for t in pairs[recv_task][p["sender"]]:
                fabrics[t.channel_key] = p["fabric"]
            registered[recv_task] = registered.get(recv_task, 0) + p["registered"]
    return fabrics, registered
