"""A task's side of channels: setup, release and counters (ChannelTable).

The planning process opens an instantiation's channels with ``open_channels`` (opening.py):
one ``open_pairs`` request per receiving task, which allocates each pair's region exactly as
planned and makes one ``attach_senders`` call per sender; the sender attaches the region
once, allocates one credit region for the pair (a cache line per channel) and binds its
senders; the receiver binds its receivers. A planner that is itself the sender offers its
credit region in ``open_pairs`` and binds its senders from the answer, so no call comes back
(``credit_region``, ``bind_offered``); one that also receives from that task serves its own
open_pairs in its process and carries its attach_senders there in that request (``"attach"``).
The TF kernels find both halves by channel key in the process-wide native table, where they
live until released (``release`` requests from the planner's instances.py, a dead peer, or
this table closing).

    planner --open_pairs--> receiver --attach_senders--> sender
            <--------------          <----------------

    planner = sender --open_pairs + credit--> receiver
                     <------- ring -----------

    planner = sender and receiver --open_pairs + credit + attach--> peer
                                  <-------- ring + credit ---------

A TF1 task plans only its own half of each pair; such halves meet through the receiver
(``want_halves``/``offer_halves``: half_pairs.py), and their kernels own them. A dynamic
channel whose tensors outgrow its slots moves to a larger ring (growth.py). The channels
between two running tasks whose connection broke are set up again (recovery.py). Each of
those three is a part of ChannelTable that owns its state (``halves``, ``growth``,
``recovery``); the parts and the table talk through the few methods each documents, and
ChannelTable.handle routes each control request to the one that serves it.

Example:
    >>> fabrics, registered = open_channels(rt.call, instance, swapped, region_bytes)
"""
import collections
import functools
import logging
import os
import re
import threading

from .. import _core
from ..errors import ConfigError, ProtocolError
from .channel_common import (WATCH_INTERVAL_S, bind_halves, build_half, domain_identity,
                             let_go, planned_bytes, ring_layout)
from .control import session
from .event_loop import WORK_THREAD
from .growth import Growth
from .half_pairs import HalfPairs
from .opening import in_parallel, open_channels
from .recovery import Recovery
from .registered import RegisteredMemory

__all__ = ["ChannelTable", "open_channels", "REQUESTS", "WATCH_INTERVAL_S"]

log = logging.getLogger(__name__)
log.addHandler(logging.NullHandler())


class ChannelTable:
    """One task's side of channel setup and release: serves REQUESTS.

    Bound halves live in the native channel table, holding leases on the regions they use;
    nothing here keeps a channel alive. A half goes on a ``release`` request (from the
    planning process once the function went: instances.py), when its peer task dies (the
    watcher thread started here sees the endpoint die), or when this table closes. TF
    kernels do not own halves: TF re-creates the kernels of functions it still runs.

    The table owns its endpoints to peers, the pairs received here (``received``), the
    registered memory being allocated, release, counters and the watcher; its parts
    ``halves`` (HalfPairs), ``growth`` (Growth) and ``recovery`` (Recovery) own theirs. They
    read its ``config``, ``domain``, ``task``, ``call`` and ``closing`` and use the methods
    marked "for the parts" below.

    Args:
        domain: this task's Domain.
        config: its rdmadev Config (fabric, deadline).
        call: ``call(task, request) -> result`` to reach peers (``Runtime.call``); needed by
            a receiving task, which calls each sender once per instantiation and tells it
            about a failed setup (without it no watcher runs).
        task: this task's name (``/job:ps/replica:0/task:0``), told to peers.
    """

    #: The control requests the table serves itself (module REQUESTS: with its parts').
    OWN_REQUESTS = ("open_pairs", "attach_senders", "release", "counters")

    def __init__(self, domain, config, call=None, task=None):
        self.domain = domain
        self.config = config
        self.call = call
        self.task = task
        self.endpoints = {}  # peer domain address -> Endpoint
        self.peers = {}  # peer domain address -> its task name
        self.lock = threading.Lock()
        self.memory = RegisteredMemory(self)  # the regions being allocated, held to the limit
        self.notices = {"sent": 0, "failed": 0}  # release requests to peers (failed setups)
        # pairs received here released to make room for another plan, and set up again when
        # their instantiation ran again (the planner's evictions.py asks)
        self.evictions = {"evicted": 0, "set_up_again": 0}
        self.closing = threading.Event()
        self.received = {}  # instance -> its open_pairs entries received here, until released
        self.growth = Growth(self)
        self.halves = HalfPairs(self, self.growth)
        self.recovery = Recovery(self, self.halves, self.growth)
        self.serving = dict.fromkeys(self.OWN_REQUESTS, self)  # request -> who serves it
        for part in (self.halves, self.growth, self.recovery):
            self.serving.update(dict.fromkeys(part.REQUESTS, part))
        self.watcher = None
        if call is not None:
            self.watcher = threading.Thread(target=self._watch_peers, daemon=True,
                                            name=f"rdmadev-peers {task}")
            self.watcher.start()

    def handle(self, request):
        """Serves one of REQUESTS (here, or in the part that serves it)."""
        op = request["op"]
        return getattr(self.serving[op], op)(request)

    def want_halves(self, sizes, receivers=None, on_kept=None):
        """HalfPairs.want_halves: the sending halves this task's pass planned (TF1)."""
        self.halves.want_halves(sizes, receivers, on_kept)

    def offer_halves(self, sender, channels, on_met=None):
        """HalfPairs.offer_halves: the receiving halves this task's pass planned (TF1)."""
        self.halves.offer_halves(sender, channels, on_met)

    def _endpoint(self, address, task):
        """The live endpoint to `task` at Domain `address`, connected if there is none (one
        found dead goes first, as the watcher's sweep would have it go)."""
        with self.lock:
            self.peers[address] = task
            ep = self.endpoints.get(address)
            dead = ep if ep is not None and not ep.alive()[0] else None
            if dead is not None:
                buried = self._bury_locked(address, dead)
            if ep is None or dead is not None:
                ep = self.endpoints[address] = self.domain.connect(address, self.config.fabric,
                                                                   timeout=self.config.deadline_s)
        if dead is not None:
            self._buried(address, dead, *buried)
        return ep

    # -- receiving task --

    def open_pairs(self, r, via=None):
        """Sets up every pair of request `r` whose receiver is this task (senders in parallel);
        then, if `r` carries ``"attach"`` (an attach_senders request of the planner, which
        sends to this task and receives from it), binds the sending halves it asks for.
        `via` (for the planner, in its own process): ``{sender: fn(attach request) ->
        answer}``, how this task's attach reaches those senders (carried in the planner's
        open_pairs to them: opening.py).

        Returns:
            ``{"pairs": [{"sender", "fabric", "registered"}, ...]}`` in request order, and
            ``"attached"`` (attach_senders' answer) when `r` carried ``"attach"``.
        """
        if self.call is None:
            raise ConfigError(f"task {self.task} cannot set up channels: its ChannelTable has no "
                              "control client", hint="construct ChannelTable(call=Runtime.call)")
        instance = r["instance"]

        def open_one(entry):  # an offer is used once: recovery meets a pair again afresh
            entry = dict(entry)
            offer = entry.pop("offer", None)
            if offer is not None and not (type(offer) is dict and all(
                    type(offer.get(k)) is str for k in ("address", "credit"))):
                raise ProtocolError(f"task {self.task} got a malformed offer of sender "
                                    f"{entry.get('sender')!r}: {str(offer)[:80]!r}; nothing "
                                    "was allocated",
                                    hint="run the same rdmadev version in every task")
            return self.growth.open_as_learned(instance, entry, offer=offer,
                                               via=(via or {}).get(entry.get("sender")))
        opened = in_parallel(open_one, r["pairs"])
        with self.lock:
            self.received.setdefault(instance, []).extend(p for p, _ in opened)
            if r.get("again"):
                self.evictions["set_up_again"] += len(opened)
        planner = session()
        if planner is not None:  # released here should the planner die before it asks
            planner.hold(("pairs", instance), functools.partial(self._release_received, instance))
        answer = {"pairs": [done for _, done in opened]}
        if "attach" in r:  # after the pairs: one refused past the budget attached nothing
            answer["attached"] = self.attach_senders(r["attach"])
        return answer

    def received_from(self, sender):
        """For the parts: ``[(instance, pair)]`` of the pairs from `sender` that instantiations
        opened here and still hold (open_pairs entries)."""
        with self.lock:
            return [(i, p) for i, pairs in self.received.items() for p in pairs
                    if p["sender"] == sender]

    def still_received(self, instance):
        """For the parts: whether pairs `instance` opened here are still held (not released)."""
        with self.lock:
            return instance in self.received

    def _release_received(self, instance, notify_in_background=False, quiescent=False):
        """Unbinds the receiving halves of the pairs `instance` opened here and tells each
        sender to unbind its halves (once: a later call finds nothing). In the background,
        the request being served does not wait on a sender that is cut off. `quiescent`:
        nothing is in flight on them (release), so no memory is kept for late writes."""
        with self.lock:
            pairs = self.received.pop(instance, [])
        notices = [(p["sender"], [c["key"] for c in p["channels"]]) for p in pairs]
        for _, keys in notices:
            self.release({"keys": keys, "half": "recv", "quiescent": quiescent})

        def notify():
            for sender, keys in notices:
                self.notify(sender, keys, "send", quiescent=quiescent)
        if notices and notify_in_background:
            threading.Thread(target=notify, daemon=True,
                             name=f"rdmadev-release {instance}").start()
        else:
            notify()

    def open_pair(self, instance, p, attach="attach_senders", offer=None, via=None):
        """For the parts: sets up pair `p` (an open_pairs entry) of `instance` as it is laid
        out, its sender attaching with request `attach` (Growth.open_as_learned lays it out
        with the slots its channels learned first), sent by ``via(request)`` if given (the
        planner carries it in its own request to the sender: open_pairs), else called; or,
        given the sender's `offer` (its ``{"address", "credit"}``: the sender planned the
        pair, credit_region), with no call: the sender binds its halves from what this
        returns (bind_offered).

        Returns:
            ``{"sender", "fabric", "registered"}``, and with an offer ``"address"``, ``"ring"``
            (this region's descriptor) and ``"channels"`` (as laid out here).
        """
        grown = attach == "attach_grown"
        sender, channels = p["sender"], p["channels"]
        keys = [c["key"] for c in channels]
        label = f"{instance}/{self.task}<-{sender}"
        layouts = [ring_layout(c) for c in channels]  # a bad plan fails before allocating
        size = planned_bytes(p["bytes"], layouts, f"{label} (first channel {keys[0]})")
        # growth is optional (the channel goes on in chunks) and runs on the watcher's thread
        with self.memory.reserving(size, f"{label} (first channel {keys[0]})",
                                    wait=not grown):
            region = self.domain.allocate(size, label=label, grant=[domain_identity(sender)])
        lease, credit = _core.RegionLease(region), None
        if not grown:  # before the halves are bound: their growth (Growth.learn) looks it up
            self.growth.track(channels)
        try:
            try:
                sent = offer or (via or functools.partial(self.call, sender))({
                    "op": attach, "receiver": self.task, "address": self.domain.address,
                    "ring": region.descriptor.hex(), "channels": channels})
            except Exception as e:
                raise ProtocolError(
                    f"sender task {sender} could not set up its {len(channels)} channel(s) to "
                    f"{self.task} (first {keys[0]}): {e}") from None
            try:
                ep = self._endpoint(sent["address"], sender)
                credit = ep.attach(bytes.fromhex(sent["credit"]))
                bind_halves(
                    channels, "recv", lease, sender,
                    lambda i, c: _core.RingReceiver(region, layouts[i], ep, credit, epoch=0,
                                                    credit_offset=i * _core.CREDIT_BYTES),
                    lambda key: f"receiver task {self.task} could not set up channel {key} "
                                f"from {sender}", successor=grown)
            except BaseException:
                if grown:
                    self.growth.drop_successors(sender, keys)
                elif offer is None:  # an offering sender bound nothing yet
                    self.notify(sender, keys, "send")
                raise
        except BaseException:
            if not grown:  # no step runs before its plan is set up: nothing was written
                self.growth.untrack(keys)
                region.quiet()
            let_go(credit, lease, region)
            raise
        if offer is not None:
            return {"sender": sender, "fabric": ep.fabric, "registered": p["bytes"],
                    "address": self.domain.address, "ring": region.descriptor.hex(),
                    "channels": channels}
        return {"sender": sender, "fabric": sent["fabric"], "registered": p["bytes"]}

    # -- sending task --

    def attach_senders(self, r, hold=None):
        """Binds the sending halves of one pair: attaches the receiver's region once and
        gives every channel a line of one fresh credit region. `hold` (for the parts): called
        with ``{key: (RingSender, lease, receiver)}`` instead of binding them (Growth keeps
        them for ``bind_grown``).

        Returns:
            ``{"address": this domain, "credit": descriptor hex, "fabric": name}``.
        """
        receiver, channels = r["receiver"], r["channels"]
        ep = self._endpoint(r["address"], receiver)
        ring = ep.attach(bytes.fromhex(r["ring"]))
        credit = self.credit_region(receiver, len(channels))
        self._bind_senders(receiver, ep, ring, channels, credit, hold)
        return {"address": self.domain.address, "credit": credit.descriptor.hex(),
                "fabric": ep.fabric}

    def bind_offered(self, receiver, credit, opened):
        """For the planner: binds the sending halves of the pair `receiver` opened from this
        task's offer (`credit`: credit_region; `opened`: open_pair's result), as
        attach_senders binds them. On failure `credit` is closed."""
        try:
            ep = self._endpoint(opened["address"], receiver)
            ring = ep.attach(bytes.fromhex(opened["ring"]))
        except BaseException:
            let_go(credit)
            raise
        self._bind_senders(receiver, ep, ring, opened["channels"], credit)

    def credit_region(self, receiver, n):
        """The credit region of a pair of `n` channels sent to `receiver` (a cache line
        each), which the receiver alone may write. The planner (opening.py) allocates it
        for a pair it sends on and offers it in open_pairs (``{"address", "credit"}``), so
        the receiver binds its halves without calling back; bind_offered binds this task's
        once it answered, and the planner closes it should the request fail."""
        return self.domain.allocate(_core.CREDIT_BYTES * n, label=f"credit<-{receiver}",
                                    grant=[domain_identity(receiver)])

    def _bind_senders(self, receiver, ep, ring, channels, credit, hold=None):
        """Binds (or hands `hold`) the sending halves of `channels` to `receiver`, writing
        into its `ring` through `ep`, credited in `credit`; on failure closes all three."""
        lease = _core.RegionLease(credit)

        def make(i, c):
            return _core.RingSender(ep, ring, ring_layout(c), credit, epoch=0,
                                    credit_offset=i * _core.CREDIT_BYTES)

        def failing(key):
            return f"sender task {self.task} could not set up channel {key} to {receiver}"
        try:
            if hold is not None:  # bound later by the part holding them
                hold({c["key"]: (build_half(make, i, c, failing), lease, receiver)
                      for i, c in enumerate(channels)})
            else:
                bind_halves(channels, "send", lease, receiver, make, failing)
        except BaseException:
            if hold is None:  # not a grown pair's: no step ran on it, nothing was credited
                credit.quiet()
            let_go(ring, lease, credit)
            raise

    # -- release --

    def release(self, r):
        """Unbinds `half` ("send", "recv" or "both") of every channel in ``r["keys"]`` here
        (their regions go with their last half). Returns how many halves went.

        With ``r["instance"]`` (the planner's release), the senders of the pairs that
        instance opened here are told too: a planner interrupted between its requests (kill
        -9 or Ctrl-C while it exits) may never reach them, and this task's hold on its
        connection (open_pairs) is let go now, so no one else would. With ``r["failed"]``
        (``[why, fix]``: their pair could not be set up again, reopen), the steps that wait
        for those halves fail with it at once; without, a reason given earlier is dropped.
        With ``r["quiescent"]`` nothing is parked or retired (evictions.py)."""
        half = r.get("half", "both")
        self.growth.released(r["keys"], half)
        if half != "send" and "instance" not in r:  # the planner's: _release_received
            released = set(r["keys"])  # pairs whose receiving halves went (reopen skips them)
            with self.lock:
                for instance, pairs in list(self.received.items()):
                    kept = [p for p in pairs if not {c["key"] for c in p["channels"]} <= released]
                    if kept:
                        self.received[instance] = kept
                    else:
                        del self.received[instance]
        # A sending half its receiver may still read or credit is parked (registry.h); for
        # less time once the receiver says it unbound its half (notify). A quiescent release
        # (an instantiation evicted after a clean call: every transfer it sent was taken and
        # none is in flight) keeps nothing: a receiving ring kept for late writes (verbs)
        # would hold its memory LATE_WRITE_GRACE_S from the plan it was evicted for.
        park_s = _core.RELEASED_GRACE_S if r.get("receiver_unbound") else _core.PARKED_GRACE_S
        if r.get("quiescent"):
            park_s = 0
        n = sum(_core.unbind_channel(key, half, park_s) for key in r["keys"])
        for h in ("send", "recv") if half == "both" else (half,):
            for key in r["keys"]:
                if r.get("failed"):
                    _core.fail_half(key, h, *r["failed"])
                else:
                    _core.unfail_half(key, h)
        if "instance" in r:
            if r.get("evicted"):
                with self.lock:
                    self.evictions["evicted"] += len(self.received.get(r["instance"], ()))
            planner = session()
            if planner is not None:
                planner.let_go(("pairs", r["instance"]))
            self._release_received(r["instance"], notify_in_background=True,
                                   quiescent=bool(r.get("quiescent")))
        return n

    def notify(self, peer, keys, half, failed=None, quiescent=False):
        """For the parts: best effort, tells `peer` to unbind its `half` of `keys`, saying
        that this task, their receiver, unbound its own (and, `failed`, why the steps using
        them fail and the fix: ``[why, fix]``; `quiescent`: nothing is in flight on them)."""
        if self.call is None or not keys:
            return
        try:
            request = {"op": "release", "keys": list(keys), "half": half, "receiver_unbound": True}
            if failed:
                request["failed"] = failed
            if quiescent:
                request["quiescent"] = True
            self.call(peer, request)
            self.notices["sent"] += 1
        except Exception as e:  # the peer may be gone; its channels went with it
            self.notices["failed"] += 1
            log.info("rdmadev: could not tell %s to release %d channel(s): %s", peer, len(keys), e)

    # -- peers --

    def peer_endpoints(self):
        """``{peer task: [Endpoint]}``: the endpoints to each peer task (the heartbeats'
        view: liveness.py marks them silent and heard)."""
        with self.lock:
            grouped = {}
            for address, ep in self.endpoints.items():
                grouped.setdefault(self.peers[address], []).append(ep)
            return grouped

    def silent_peers(self):
        """The peer tasks with an endpoint marked silent, read under self.lock: an endpoint
        leaves self.endpoints under it before _buried closes it."""
        with self.lock:
            return sorted({self.peers[a] for a, ep in self.endpoints.items() if ep.silent})

    def sweep_dead_peers(self):
        """For the parts (and the watcher): unbinds the halves whose peer's endpoint died,
        and has those of peers that still run set up again (_buried)."""
        with self.lock:
            dead = [(a, ep) for a, ep in self.endpoints.items() if not ep.alive()[0]]
            buried = [self._bury_locked(address, ep) for address, ep in dead]
        for (address, ep), (n, why) in zip(dead, buried):
            self._buried(address, ep, n, why)

    def _bury_locked(self, address, ep):
        """Forgets the dead endpoint `ep` to `address` and unbinds every half on it, under
        self.lock: a half bound on the endpoint that replaces it is bound after this (halves
        with the same task on another endpoint stay: a peer restarted at once, its new
        instantiations set up already, within WATCH_INTERVAL_S).
        Until then, a step looking for one of them fails at once, as Unavailable: one that
        began before the break must not take the halves set up again for the steps after.
        Returns how many halves went and why the endpoint died."""
        del self.endpoints[address]
        task = self.peers.get(address)
        why = ep.alive()[1] if not ep.closed else "closed"
        if not task:
            return 0, why
        lost = (f"task {task} is gone or the connection to it broke ({why}); the channels of a "
                "task that still runs are set up again")
        return _core.unbind_peer(self.domain, task, lost, via=ep), why

    def _buried(self, address, ep, unbound, why):
        """Says `why` the endpoint to `address` died (`unbound` halves went with it), closes
        it, and has Recovery set up again the channels between this task and its peer if
        that task still runs: a connection can break with both tasks running (a failed verbs
        transfer or queue pair, a tcp connection cut)."""
        task = self.peers.get(address)
        log.info("rdmadev: connection to %s (%s) is gone: %s; unbound %d channel half(s)", task,
                 address, why, unbound)
        ep.close()
        if task is not None and not self.closing.is_set():
            self.recovery.broke(task, address)

    def _watch_peers(self):
        """Unbinds the halves of peers that died, frees the memory of sending halves parked
        until their receiver was done with it (_core.release_drained), lets go of the chunks
        whose regions all went (Domain.trim) and grows channels whose tensors outgrew their
        slots, every WATCH_INTERVAL_S until closed."""
        while not self.closing.wait(WATCH_INTERVAL_S):
            try:
                self.sweep_dead_peers()
                _core.release_drained()
                self.domain.trim()
                self.growth.grow_channels()
            except Exception as e:  # never let the watcher die
                log.info("rdmadev: peer sweep or growth failed: %s", e)

    def counters(self, r=None):
        """This task's channel resources (the ``counters`` control request).

        Returns:
            ``{"channels", "senders", "receivers", "parked", "retired", "regions",
            "registered_bytes", "planned_bytes", "budget_bytes", "chunks", "chunk_bytes",
            "quarantined_bytes", "evicted", "set_up_again",
            "transfers", "sent", "received", "discarded", "abandoned",
            "superseded", "grown", "staged", "stages", "warm", "waits", "fds", "memfd_maps",
            "notices", "reopened", "learned", "wanted", "peers", "silent_peers", "py_threads",
            "work_threads", "thread_names"}``:
            channel halves bound here, sending halves unbound but parked (their receiver had not
            credited all they sent; their memory goes once it has), receiving halves unbound but
            retired (verbs: their ring stays registered for the sender's late writes,
            LATE_WRITE_GRACE_S), regions and their bytes in this task's Domain (held: its
            own channels' rings and credits, stages), the bytes the plans of the pairs
            received here need (in use) and RDMADEV_MAX_REGISTERED_BYTES (the budget), the
            chunks the regions are placed in (mapped and, on verbs, registered once each), their
            bytes, and those of released regions' spans quarantined for late writes, pairs
            received here released to make room for another plan and set up again since
            (evictions.py), transfers
            completed by this process (of the received, those a failed step left behind and that
            were discarded unread; receives that ended without a transfer, and those a later
            step's receive took the place of), larger rings registered for channels whose
            tensors outgrew their slots (growth), tensors sent staged and the stages registered
            for them, received tensors of 32 MiB or more copied into a buffer kept from an
            earlier step (where TF's CPU allocator is malloc), waits pending on the progress
            thread, open file descriptors, mappings of rdmadev memfds (its own regions and
            peers' mapped here), release requests sent to peers and failed, pairs set up again
            after their connection broke (reopen), channel lineages whose grown slots this task
            keeps for later setups (growth), the sending halves of half pairs this task's passes
            planned and still answers for, the peer tasks this task has endpoints to and those
            marked silent (liveness.py), Python threads (rdmadev's own: each task's event
            loop, which serves its control connections and heartbeats, and watchers; TF's
            threads are native, and those of its pools that ran the pass or a kernel's Python
            are threading's dummies, not counted), the event loops' worker threads alive now
            (they come and go with blocking work: event_loop.py) and how many threads run under
            each name (a leaked one says what it is).
        """
        bound = _core.channel_counts(self.domain)
        moved = _core.transfer_counts()
        regions, registered = self.domain.region_stats
        chunks = self.domain.chunk_stats
        peers = self.peer_endpoints()
        with self.lock:
            planned = sum(p["bytes"] for pairs in self.received.values() for p in pairs)
            evictions = dict(self.evictions)
        return {"channels": bound["senders"] + bound["receivers"], **bound,
                "regions": regions, "registered_bytes": registered, "planned_bytes": planned,
                "budget_bytes": self.config.max_registered_bytes, "chunks": chunks["chunks"],
                "chunk_bytes": chunks["bytes"], "quarantined_bytes": chunks["quarantined"],
                **evictions,
                "transfers": moved["sent"] + moved["received"], **moved,
                "waits": self.domain.pending_waits, "fds": len(os.listdir("/proc/self/fd")),
                "memfd_maps": _memfd_maps(), "notices": dict(self.notices),
                **self.recovery.counters(), **self.growth.counters(), **self.halves.counters(),
                "peers": sorted(peers), "silent_peers": self.silent_peers(),
                **_python_threads()}

    def close(self):
        """Stops the watcher and unbinds every channel half of this task (the Domain's close
        frees what remains)."""
        self.closing.set()
        with self.lock:
            self.received.clear()
        self.growth.clear()
        _core.unbind_domain(self.domain)
        if self.watcher is not None and self.watcher is not threading.current_thread():
            self.watcher.join(2 * WATCH_INTERVAL_S)


#: The control requests ChannelTable serves, its own and its parts' (the runtime routes them
#: here; ChannelTable.handle finds the part).
REQUESTS = (ChannelTable.OWN_REQUESTS + HalfPairs.REQUESTS + Growth.REQUESTS
            + Recovery.REQUESTS)


def _memfd_maps():
    """Mappings of rdmadev region memfds in this process (its regions and peers')."""
    with open("/proc/self/maps") as f:
        return sum(1 for line in f if "/memfd:rdmadev:" in line)


def _python_threads():
    """``{"py_threads": count, "work_threads": count, "thread_names": {name: count}}`` of the
    threads this process started in Python, numbers in names dropped. The event loops'
    workers (event_loop.Workers: they run while there is blocking work, and end IDLE_S after
    it) are counted apart from the others, which last. A native thread of TF's pools that ran
    Python (the pass, the bridge) appears to `threading` as a dummy that lives as long as that
    thread: TF's, not counted."""
    own = [t for t in threading.enumerate() if not isinstance(t, threading._DummyThread)]
    names = collections.Counter(re.sub(r"-?\d+", "", t.name).strip() for t in own)
    work = sum(t.name.startswith(WORK_THREAD) for t in own)
    return {"py_threads": len(own) - work, "work_threads": work,
            "thread_names": dict(sorted(names.items()))}
