"""A task's side of channels: setup, release and counters (ChannelTable).

The planning process opens an instantiation's channels with ``open_channels`` (opening.py):
one ``open_pairs`` request per receiving task, which allocates each pair's region exactly as
planned and makes one ``attach_senders`` call per sender; the sender attaches the region
once, allocates one credit region for the pair (a cache line per channel) and binds its
senders; the receiver binds its receivers. The TF kernels find both halves by channel key in
the process-wide native table, where they live until released (``release`` requests from the
planner's instances.py, a dead peer, or this table closing).

    planner --open_pairs--> receiver --attach_senders--> sender
            <--------------          <----------------

A TF1 task plans only its own half of each pair; such halves meet through the receiver
(``want_halves``/``offer_halves``: half_pairs.py), and their kernels own them. A dynamic
channel whose tensors outgrow its slots moves to a larger ring (growth.py). The channels
between two running tasks whose connection broke are set up again (recovery.py). Those
three are parts of ChannelTable (its bases); its state, set up in ``__init__``, is theirs too.

Example:
    >>> fabrics, registered = open_channels(rt.call, instance, swapped, region_bytes)
"""
import collections
import contextlib
import functools
import logging
import os
import threading
import time

from .. import _core
from ..errors import ConfigError, ProtocolError, RegionError
from .channel_common import domain_identity, error_naming
from .control import session
from .growth import Growth, channel_lineage
from .half_pairs import HalfPairs
from .opening import LAYOUT_FIELDS, in_parallel, open_channels
from .recovery import Recovery

__all__ = ["ChannelTable", "open_channels", "REQUESTS", "CREDIT_BYTES"]

#: Bytes of one channel's credit line (C++ kCreditBytes in channel.h: one cache line); a
#: pair's credit region holds one line per channel.
CREDIT_BYTES = _core.CREDIT_BYTES

#: The control requests ChannelTable serves (the runtime routes them here).
REQUESTS = ("open_pairs", "attach_senders", "half_sizes", "attach_halves", "attach_grown",
            "bind_grown", "release", "reopen", "bound_senders", "counters")

#: Seconds between two looks for dead peers (their halves are then unbound): how long a dead
#: task's channels, regions and mappings outlive it here (a step on them fails at once
#: anyway: the fabric's liveness check names the peer).
WATCH_INTERVAL_S = 0.5

#: Seconds a setup that would pass RDMADEV_MAX_REGISTERED_BYTES waits for memory that unbound
#: halves keep for their peer (_reserving): a receiving ring retired for late writes goes
#: within LATE_WRITE_GRACE_S (verbs), a parked sending half once its receiver has credited
#: what it sent. Checked every KEPT_POLL_S.
KEPT_WAIT_S = _core.LATE_WRITE_GRACE_S + WATCH_INTERVAL_S
KEPT_POLL_S = 0.1

log = logging.getLogger(__name__)
log.addHandler(logging.NullHandler())

def _layout(channel):
    """The ring layout a channel entry carries: the plan's, field for field."""
    return _core.RingLayout(*(channel[f] for f in LAYOUT_FIELDS))


def _planned_bytes(size, layouts, label):
    """`size`, the bytes asked for a pair's region, if it is what the plan gives channels
    `layouts`: their extent rounded up to the layout's region_alignment (a peer cannot ask for more)."""
    extent = max(l.offset + l.bytes for l in layouts)
    planned = -(-extent // _core.LAYOUT.region_alignment) * _core.LAYOUT.region_alignment
    if type(size) is not int or not extent <= size <= planned:
        raise ProtocolError(f"region {label} of {size!r} bytes is not what the plan gives its "
                            f"{len(layouts)} channel(s) ({extent} bytes, {planned} once "
                            "aligned); nothing was allocated",
                            hint="run the same rdmadev version in every task")
    return size


def _let_go(*held):
    """Closes what a failed setup holds (regions, leases, attachments; None skipped) at once:
    the traceback keeps the failing frame, and with it these, alive for as long as the
    caller keeps the error."""
    for h in held:
        if h is not None:
            h.close()


def _bind_halves(channels, half, lease, peer, make, failing, successor=False):
    """Builds (``make(i, channel)``) and binds `half` ("send" or "recv") of every channel of
    one pair, holding `lease` (as successors: growth). On any failure the halves bound so far
    are unbound and the error is raised with ``failing(key)`` before its message."""
    try:
        for i, c in enumerate(channels):
            try:
                h = make(i, c)
            except Exception as e:
                raise error_naming(e, failing(c["key"])) from None
            if half == "send":  # the receiver alone may read what the sender stages
                h.bind(c["key"], lease, peer=peer, successor=successor,
                       reader=domain_identity(peer))
            else:
                h.bind(c["key"], lease, peer=peer, successor=successor)
    except BaseException:
        if not successor:  # a grown pair has one channel: nothing of it was bound
            for c in channels:
                _core.unbind_channel(c["key"], half)
        raise


class ChannelTable(HalfPairs, Growth, Recovery):
    """One task's side of channel setup and release: serves REQUESTS.

    Bound halves live in the native channel table, holding leases on the regions they use;
    nothing here keeps a channel alive. A half goes on a ``release`` request (from the
    planning process once the function went: instances.py), when its peer task dies (the
    watcher thread started here sees the endpoint die), or when this table closes. TF
    kernels do not own halves: TF re-creates the kernels of functions it still runs.

    Args:
        domain: this task's Domain.
        config: its rdmadev Config (fabric, deadline).
        call: ``call(task, request) -> result`` to reach peers (``Runtime.call``); needed by
            a receiving task, which calls each sender once per instantiation and tells it
            about a failed setup (without it no watcher runs).
        task: this task's name (``/job:ps/replica:0/task:0``), told to peers.
    """

    def __init__(self, domain, config, call=None, task=None):
        self.domain = domain
        self.config = config
        self.call = call
        self.task = task
        self.endpoints = {}  # peer domain address -> Endpoint
        self.peers = {}  # peer domain address -> its task name
        self.lock = threading.Lock()
        self.reserved = 0  # bytes of regions being allocated (see _reserving)
        self.notices = {"sent": 0, "failed": 0}  # release requests to peers (failed setups)
        self.reopened = 0  # pairs set up again after their connection broke (reopen)
        self.reopening = threading.Lock()  # one reopen at a time: both tasks may ask
        self.closing = threading.Event()
        self.received = {}  # instance -> its open_pairs entries received here, until released
        self.wanted = {}  # key -> bytes (None: run-time shape) of the sending halves planned here
        self.wanted_at = {}  # key -> when its pass last planned it (time.monotonic)
        self.offered = {}  # sender task -> {key: channel entry}: receiving halves offered here
        self.meeting = threading.Lock()  # one half-pair setup at a time (_meet, reopen)
        self.wanting = threading.Condition(self.lock)  # notified when `wanted` grows
        self.grown = {}  # key -> (RingSender, lease, receiver): set up, not bound (growth)
        self.not_grown = set()  # keys whose growth failed: they keep their slots
        self.learned = collections.OrderedDict()  # lineage -> layout it grew to (LEARNED_MAX)
        self.lineage_of = {}  # key -> lineage of the receiving halves bound here
        self.watcher = None
        if call is not None:
            self.watcher = threading.Thread(target=self._watch_peers, daemon=True,
                                            name=f"rdmadev-peers {task}")
            self.watcher.start()

    def handle(self, request):
        """Serves one of REQUESTS."""
        return getattr(self, request["op"])(request)

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

    def open_pairs(self, r):
        """Sets up every pair of request `r` whose receiver is this task (senders in parallel).

        Returns:
            ``{"pairs": [{"sender", "fabric", "registered"}, ...]}`` in request order.
        """
        if self.call is None:
            raise ConfigError(f"task {self.task} cannot set up channels: its ChannelTable has no "
                              "control client", hint="construct ChannelTable(call=Runtime.call)")
        instance = r["instance"]
        opened = in_parallel(lambda p: self._open_as_learned(instance, p), r["pairs"])
        with self.lock:
            self.received.setdefault(instance, []).extend(p for p, _ in opened)
        planner = session()
        if planner is not None:  # released here should the planner die before it asks
            planner.hold(("pairs", instance), functools.partial(self._release_received, instance))
        return {"pairs": [done for _, done in opened]}

    def _release_received(self, instance, notify_in_background=False):
        """Unbinds the receiving halves of the pairs `instance` opened here and tells each
        sender to unbind its halves (once: a later call finds nothing). In the background,
        the request being served does not wait on a sender that is cut off."""
        with self.lock:
            pairs = self.received.pop(instance, [])
        notices = [(p["sender"], [c["key"] for c in p["channels"]]) for p in pairs]
        for _, keys in notices:
            self.release({"keys": keys, "half": "recv"})

        def notify():
            for sender, keys in notices:
                self._notify(sender, keys, "send")
        if notices and notify_in_background:
            threading.Thread(target=notify, daemon=True,
                             name=f"rdmadev-release {instance}").start()
        else:
            notify()

    def _open_pair(self, instance, p, attach="attach_senders"):
        grown = attach == "attach_grown"
        sender, channels = p["sender"], p["channels"]
        keys = [c["key"] for c in channels]
        label = f"{instance}/{self.task}<-{sender}"
        layouts = [_layout(c) for c in channels]  # a bad plan fails before anything is allocated
        size = _planned_bytes(p["bytes"], layouts, f"{label} (first channel {keys[0]})")
        # growth is optional (the channel goes on in chunks) and runs on the watcher's thread
        with self._reserving(size, f"{label} (first channel {keys[0]})", wait=not grown):
            region = self.domain.allocate(size, label=label, grant=[domain_identity(sender)])
        lease, credit = _core.RegionLease(region), None
        if not grown:  # before the halves are bound: their growth (_learn) looks it up
            with self.lock:
                self.lineage_of.update((c["key"], channel_lineage(c)) for c in channels)
        try:
            try:
                sent = self.call(sender, {
                    "op": attach, "receiver": self.task, "address": self.domain.address,
                    "ring": region.descriptor.hex(), "channels": channels})
            except Exception as e:
                raise ProtocolError(
                    f"sender task {sender} could not set up its {len(channels)} channel(s) to "
                    f"{self.task} (first {keys[0]}): {e}") from None
            try:
                ep = self._endpoint(sent["address"], sender)
                credit = ep.attach(bytes.fromhex(sent["credit"]))
                _bind_halves(
                    channels, "recv", lease, sender,
                    lambda i, c: _core.RingReceiver(region, layouts[i], ep, credit, epoch=0,
                                                    credit_offset=i * CREDIT_BYTES),
                    lambda key: f"receiver task {self.task} could not set up channel {key} "
                                f"from {sender}", successor=grown)
            except BaseException:
                if grown:
                    self._drop_grown(sender, keys)
                else:
                    self._notify(sender, keys, "send")
                raise
        except BaseException:
            if not grown:
                with self.lock:
                    for key in keys:
                        self.lineage_of.pop(key, None)
            _let_go(credit, lease, region)
            raise
        if grown:  # the receiving successor is bound: the sender may move
            self.call(sender, {"op": "bind_grown", "keys": keys})
        return {"sender": sender, "fabric": sent["fabric"], "registered": p["bytes"]}

    @contextlib.contextmanager
    def _reserving(self, size, label, wait=True):
        """Holds `size` bytes against the task's RDMADEV_MAX_REGISTERED_BYTES while a region
        of that size is allocated (pairs are set up in parallel), or raises RegionError.
        `wait`: memory that unbound halves still keep for their peer (parked, retired: a pair
        set up again after its connection broke replaces a ring kept for late writes) is
        waited for, up to KEPT_WAIT_S, before the setup is refused."""
        limit = self.config.max_registered_bytes
        deadline = time.monotonic() + KEPT_WAIT_S
        while True:
            with self.lock:
                registered = self.domain.region_stats[1] + self.reserved
                if registered + size <= limit:
                    self.reserved += size
                    break
            kept = 0
            if wait:
                held = _core.channel_counts(self.domain)
                kept = held["parked"] + held["retired"]
            if not kept or time.monotonic() > deadline:
                waited = (f"; {kept} unbound channel half(s) still keep theirs for their peer "
                          f"after {KEPT_WAIT_S:g} s") if kept else ""
                raise RegionError(
                    f"region {label} of {size} bytes would take task {self.task}'s registered "
                    f"memory to {registered + size} bytes, past its limit of {limit}{waited}",
                    hint="raise RDMADEV_MAX_REGISTERED_BYTES in this task (default: half of "
                         "RAM), or plan smaller tensors or fewer slots (RDMADEV_SLOTS)")
            _core.release_drained()
            time.sleep(KEPT_POLL_S)
        try:
            yield
        finally:
            with self.lock:
                self.reserved -= size

    # -- sending task --

    def attach_senders(self, r, grown=False):
        """Binds the sending halves of one pair: attaches the receiver's region once and
        gives every channel a line of one fresh credit region. `grown`: keeps them for
        ``bind_grown`` instead (growth).

        Returns:
            ``{"address": this domain, "credit": descriptor hex, "fabric": name}``.
        """
        receiver, channels = r["receiver"], r["channels"]
        ep = self._endpoint(r["address"], receiver)
        ring = ep.attach(bytes.fromhex(r["ring"]))
        credit = self.domain.allocate(CREDIT_BYTES * len(channels), label=f"credit<-{receiver}",
                                      grant=[domain_identity(receiver)])
        lease = _core.RegionLease(credit)

        def make(i, c):
            return _core.RingSender(ep, ring, _layout(c), credit, epoch=0,
                                    credit_offset=i * CREDIT_BYTES)

        def failing(key):
            return f"sender task {self.task} could not set up channel {key} to {receiver}"
        try:
            if grown:
                made = {}
                for i, c in enumerate(channels):
                    try:
                        made[c["key"]] = (make(i, c), lease, receiver)
                    except Exception as e:
                        raise error_naming(e, failing(c["key"])) from None
                with self.lock:
                    self.grown.update(made)
            else:
                _bind_halves(channels, "send", lease, receiver, make, failing)
        except BaseException:
            _let_go(ring, lease, credit)
            raise
        return {"address": self.domain.address, "credit": credit.descriptor.hex(),
                "fabric": ep.fabric}

    # -- release --

    def release(self, r):
        """Unbinds `half` ("send", "recv" or "both") of every channel in ``r["keys"]`` here
        (their regions go with their last half). Returns how many halves went.

        With ``r["instance"]`` (the planner's release), the senders of the pairs that
        instance opened here are told too: a planner interrupted between its requests (kill
        -9 or Ctrl-C while it exits) may never reach them, and this task's hold on its
        connection (open_pairs) is let go now, so no one else would. With ``r["failed"]``
        (``[why, fix]``: their pair could not be set up again, reopen), the steps that wait
        for those halves fail with it at once; without, a reason given earlier is dropped."""
        half = r.get("half", "both")
        with self.lock:
            for key in r["keys"]:
                self.not_grown.discard(key)
                if half != "recv":
                    self.grown.pop(key, None)
                if half != "send":
                    self.lineage_of.pop(key, None)
            if half != "send" and "instance" not in r:  # the planner's: _release_received
                released = set(r["keys"])  # pairs whose receiving halves went (reopen skips them)
                for instance, pairs in list(self.received.items()):
                    kept = [p for p in pairs if not {c["key"] for c in p["channels"]} <= released]
                    if kept:
                        self.received[instance] = kept
                    else:
                        del self.received[instance]
        # A sending half its receiver may still read or credit is parked (registry.h); for
        # less time once the receiver says it unbound its half (_notify).
        park_s = _core.RELEASED_GRACE_S if r.get("receiver_unbound") else _core.PARKED_GRACE_S
        n = sum(_core.unbind_channel(key, half, park_s) for key in r["keys"])
        for h in ("send", "recv") if half == "both" else (half,):
            for key in r["keys"]:
                if r.get("failed"):
                    _core.fail_half(key, h, *r["failed"])
                else:
                    _core.unfail_half(key, h)
        if "instance" in r:
            planner = session()
            if planner is not None:
                planner.let_go(("pairs", r["instance"]))
            self._release_received(r["instance"], notify_in_background=True)
        return n

    def _notify(self, peer, keys, half, failed=None):
        """Best effort: tells `peer` to unbind its `half` of `keys`, saying that this task,
        their receiver, unbound its own (and, `failed`, why the steps using them fail and the
        fix: ``[why, fix]``)."""
        if self.call is None or not keys:
            return
        try:
            request = {"op": "release", "keys": list(keys), "half": half, "receiver_unbound": True}
            if failed:
                request["failed"] = failed
            self.call(peer, request)
            self.notices["sent"] += 1
        except Exception as e:  # the peer may be gone; its channels went with it
            self.notices["failed"] += 1
            log.info("rdmadev: could not tell %s to release %d channel(s): %s", peer, len(keys), e)

    def peer_endpoints(self):
        """``{peer task: [Endpoint]}``: the endpoints to each peer task (the heartbeats'
        view: liveness.py marks them silent and heard)."""
        with self.lock:
            grouped = {}
            for address, ep in self.endpoints.items():
                grouped.setdefault(self.peers[address], []).append(ep)
            return grouped

    def _watch_peers(self):
        """Unbinds the halves of peers that died, frees the memory of sending halves parked
        until their receiver was done with it (_core.release_drained) and grows channels
        whose tensors outgrew their slots, every WATCH_INTERVAL_S until closed."""
        while not self.closing.wait(WATCH_INTERVAL_S):
            try:
                self._sweep_dead_peers()
                _core.release_drained()
                self._grow_channels()
            except Exception as e:  # never let the watcher die
                log.info("rdmadev: peer sweep or growth failed: %s", e)

    def counters(self, r=None):
        """This task's channel resources (the ``counters`` control request).

        Returns:
            ``{"channels", "senders", "receivers", "parked", "retired", "regions",
            "registered_bytes", "transfers", "sent", "received", "discarded", "abandoned",
            "superseded", "grown", "staged", "stages", "warm", "waits", "fds", "memfd_maps",
            "notices", "reopened", "learned", "wanted", "peers", "silent_peers", "py_threads"}``:
            channel halves bound
            here, sending halves unbound but parked (their receiver had not credited all they sent;
            their memory goes once it has), receiving halves unbound but retired (verbs: their ring
            stays registered for the sender's late writes, LATE_WRITE_GRACE_S), regions and their
            bytes in this task's Domain, transfers completed by this process (of the received, those
            a failed step left behind and that were discarded unread; receives that ended without a
            transfer, and those a later step's receive took the place of), larger rings registered
            for channels whose tensors outgrew their slots (growth), tensors sent staged and the
            stages registered for them, received tensors of 32 MiB or more copied into a buffer
            kept from an earlier step (where TF's CPU allocator is malloc), waits pending on the
            progress thread, open file descriptors,
            mappings of rdmadev memfds (its own regions and peers' mapped here), release requests
            sent to peers and failed, pairs set up again after their connection broke (reopen),
            channel lineages whose grown slots this task keeps for later setups (growth), the
            sending halves of half pairs this task's passes planned and still answers for, the peer
            tasks this task has endpoints to and those marked silent (liveness.py), Python threads
            (rdmadev's own: control connections, heartbeats, watchers; TF's threads are native).
        """
        bound = _core.channel_counts(self.domain)
        moved = _core.transfer_counts()
        regions, registered = self.domain.region_stats
        return {"channels": bound["senders"] + bound["receivers"], **bound,
                "regions": regions, "registered_bytes": registered,
                "transfers": moved["sent"] + moved["received"], **moved,
                "waits": self.domain.pending_waits, "fds": len(os.listdir("/proc/self/fd")),
                "memfd_maps": _memfd_maps(), "notices": dict(self.notices),
                "reopened": self.reopened, "learned": len(self.learned),
                "wanted": len(self.wanted),
                "peers": sorted(self.peer_endpoints()),
                "silent_peers": sorted(t for t, eps in self.peer_endpoints().items()
                                       if any(ep.silent for ep in eps)),
                "py_threads": threading.active_count()}

    def close(self):
        """Stops the watcher and unbinds every channel half of this task (the Domain's close
        frees what remains)."""
        self.closing.set()
        with self.lock:
            self.grown.clear()
            self.received.clear()
            self.learned.clear()
            self.lineage_of.clear()
        _core.unbind_domain(self.domain)
        if self.watcher is not None and self.watcher is not threading.current_thread():
            self.watcher.join(2 * WATCH_INTERVAL_S)


def _memfd_maps():
    """Mappings of rdmadev region memfds in this process (its regions and peers')."""
    with open("/proc/self/maps") as f:
        return sum(1 for line in f if "/memfd:rdmadev:" in line)
