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
(``want_halves``/``offer_halves``, "half pairs" below), and their kernels own them. A
dynamic channel whose tensors outgrow its slots moves to a larger ring ("growth" below).

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

from graph_pass.devices import split_task
from graph_pass.layout import REGION_ALIGNMENT, end_to_end, round_up, slot_bytes
from graph_pass.plan import Config as PlanConfig

from .. import _core
from ..errors import ConfigError, ProtocolError, RdmadevError, RegionError
from .control import session
from .opening import LAYOUT_FIELDS, in_parallel, open_channels

__all__ = ["ChannelTable", "open_channels", "REQUESTS", "CREDIT_BYTES"]

#: Bytes of one channel's credit line (C++ kCreditBytes in channel.h: one cache line); a
#: pair's credit region holds one line per channel.
CREDIT_BYTES = _core.CREDIT_BYTES

#: The control requests ChannelTable serves (the runtime routes them here).
REQUESTS = ("open_pairs", "attach_senders", "half_sizes", "attach_halves", "attach_grown",
            "bind_grown", "release", "reopen", "bound_senders", "counters")

#: Label of the regions half pairs meet in (in place of an instantiation id: none planned both).
HALF_PAIRS = "halves"

#: Label of the regions grown channels move to.
GROWN = "grown"

#: A grown channel's slots hold the largest tensor that was staged (or chunked) plus 1/GROWTH_HEADROOM
#: of it, rounded up to GROWTH_ALIGN bytes: sizes that creep up (sequences of varying length)
#: then re-register a logarithmic number of times, and a ring wastes at most a quarter.
GROWTH_HEADROOM = 4
GROWTH_ALIGN = 64 << 10
#: Slots grow to at most this many bytes; larger tensors keep being staged (stage.h). A ring
#: has two slots, so unbounded growth would register twice the largest tensor on the receiver
#: (alexnet's 150 MB gradient at 224 px: 380 MB per worker on the ps) where a stage registers
#: it and a quarter once, on the sender. Against unbounded growth, the same hour (when larger
#: tensors went in chunks of this size), neither tf_cnn_benchmarks alexnet (1.27x against
#: 1.23x gRPC) nor cnn.py --between_graph alexnet (1.89x against 1.95x) moved beyond the noise
#: (BENCHMARKS.md, "Between-graph").
GROWTH_MAX_SLOT = 4 << 20

#: Channels (lineages) whose grown slots a task keeps for later instantiations, the least
#: recently used forgotten first: a program's channels that grow number in the tens to
#: hundreds (the embedding benchmark: 32 at 64 KiB slots), and an entry is a few hundred bytes.
LEARNED_MAX = 4096

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

#: The fix named when a half pair cannot be set up: both tasks must run rdmadev.
HALF_FIX = ("start every task with the grpc+rdmadev protocol (or RDMADEV_AUTO=1), with the "
            "same RDMADEV_SECRET and rdmadev version in each")

#: The fix named when the channels of a connection that broke cannot be set up again.
REOPEN_FIX = ("retrace or re-create the function or TF1 session that uses them (or restart "
              "the job); `rdmadev doctor` checks the fabric between the two tasks")

#: Seconds one ``half_sizes`` request waits at the sender for its pass before answering with
#: what is still missing; the receiver asks again until its deadline. Short, so the control
#: connection it holds stays free for other requests in between.
HALF_POLL_S = 1.0

log = logging.getLogger(__name__)
log.addHandler(logging.NullHandler())

def _layout(channel):
    """The ring layout a channel entry carries: the plan's, field for field."""
    return _core.RingLayout(*(channel[f] for f in LAYOUT_FIELDS))


def _identity(task):
    """The Domain identity ("job:index") of task name `task` (what fabrics authenticate)."""
    job, index = split_task(task)
    return f"{job}:{index}"


def _reason(e):
    """What exception `e` says, without its fix (the caller names its own)."""
    return e.args[0] if isinstance(e, RdmadevError) and e.args else f"{type(e).__name__}: {e}"


def _naming(e, what):
    """Exception `e` again, its message prefixed with `what` (errno and hint kept)."""
    if isinstance(e, RdmadevError):
        return type(e)(f"{what}: {_reason(e)}", e.errno, e.hint)
    return ProtocolError(f"{what}: {_reason(e)}")


def _planned_bytes(size, layouts, label):
    """`size`, the bytes asked for a pair's region, if it is what the plan gives channels
    `layouts`: their extent rounded up to REGION_ALIGNMENT (a peer cannot ask for more)."""
    extent = max(l.offset + l.bytes for l in layouts)
    planned = -(-extent // REGION_ALIGNMENT) * REGION_ALIGNMENT
    if type(size) is not int or not extent <= size <= planned:
        raise ProtocolError(f"region {label} of {size!r} bytes is not what the plan gives its "
                            f"{len(layouts)} channel(s) ({extent} bytes, {planned} once "
                            "aligned); nothing was allocated",
                            hint="run the same rdmadev version in every task")
    return size


def _holds(grown, planned):
    """True if layout `grown` (None: none) holds every tensor layout `planned` does, in as
    many slots: a channel's grown layout is used in place of what a new graph plans under its
    key only then (that graph may send another tensor under the same rendezvous key)."""
    return (grown is not None and grown["slots"] == planned["slots"]
            and grown["capacity_bytes"] >= planned["capacity_bytes"]
            and grown["payload_offset"] >= planned["payload_offset"])  # rank capacity


def _lineage(channel):
    """The lineage of setup entry `channel` (opening.lineage); an entry without one (made by
    hand) is a lineage of its own."""
    return channel.get("lineage") or channel["key"]


def _laid_out(channels, learned):
    """Setup entries `channels` of one region, in order, each with the slots its lineage
    grew to (`learned`: lineage -> layout fields) where they hold what it plans (_holds),
    laid out as the planner lays a region out (layout.end_to_end); and the region's bytes."""
    sized = [{**c, **(learned[_lineage(c)] if _holds(learned.get(_lineage(c)), c) else {})}
             for c in channels]
    offsets, used = end_to_end(c["slots"] * c["slot_bytes"] for c in sized)
    return ([{**c, "offset": o} for c, o in zip(sized, offsets)],
            round_up(used, REGION_ALIGNMENT))


def _let_go(*held):
    """Closes what a failed setup holds (regions, leases, attachments; None skipped) at once:
    the traceback keeps the failing frame, and with it these, alive for as long as the
    caller keeps the error."""
    for h in held:
        if h is not None:
            h.close()


def _half_in_use(key, half, bound):
    """Whether `half` of the half pair `key` still belongs to a TF graph here: held by a
    kernel, bound (`bound`: _core.bound_channels()), or lost to a broken connection while
    bound and let go by no kernel since (the last kernel to go unbinds its half)."""
    return (_core.half_held(key, half) or f"{half}:{key}" in bound
            or _core.half_lost(key, half))


def _bind_halves(channels, half, lease, peer, make, failing, successor=False):
    """Builds (``make(i, channel)``) and binds `half` ("send" or "recv") of every channel of
    one pair, holding `lease` (as successors: growth). On any failure the halves bound so far
    are unbound and the error is raised with ``failing(key)`` before its message."""
    try:
        for i, c in enumerate(channels):
            try:
                h = make(i, c)
            except Exception as e:
                raise _naming(e, failing(c["key"])) from None
            if half == "send":  # the receiver alone may read what the sender stages
                h.bind(c["key"], lease, peer=peer, successor=successor, reader=_identity(peer))
            else:
                h.bind(c["key"], lease, peer=peer, successor=successor)
    except BaseException:
        if not successor:  # a grown pair has one channel: nothing of it was bound
            for c in channels:
                _core.unbind_channel(c["key"], half)
        raise


class ChannelTable:
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

    def _with_learned(self, p):
        """Pair `p` of an open_pairs request, laid out again end to end with the slots its
        channels' lineages grew to here (_laid_out), if any did; else `p` as planned."""
        with self.lock:
            for lineage in {_lineage(c) for c in p["channels"]} & self.learned.keys():
                self.learned.move_to_end(lineage)  # used: kept the longest
            if not any(_holds(self.learned.get(_lineage(c)), c) for c in p["channels"]):
                return p
            channels, size = _laid_out(p["channels"], self.learned)
        return {**p, "channels": channels, "bytes": size}

    def _open_as_learned(self, instance, planned, attach="attach_senders"):
        """_open_pair of pair `planned` laid out with the slots its channels learned
        (_with_learned), or as planned if that larger region cannot be registered (past
        RDMADEV_MAX_REGISTERED_BYTES): learned slots spare a staged transfer, they never cost
        a setup. Returns (the pair as set up, _open_pair's result)."""
        p = self._with_learned(planned)
        if p is not planned:
            try:
                return p, self._open_pair(instance, p, attach)
            except RegionError as e:
                log.info("rdmadev: the pair from %s is set up with its planned slots, not the "
                         "%d bytes its channels grew to: %s", p["sender"], p["bytes"], e)
        return planned, self._open_pair(instance, planned, attach)

    def _learn(self, key, layout):
        """Keeps `layout`, to which the receiving half `key` grew, for its lineage (under
        self.lock): the larger of it and what the lineage had, its LEARNED_MAX most recent."""
        lineage = self.lineage_of.get(key, key)
        known = self.learned.pop(lineage, None)
        self.learned[lineage] = known if _holds(known, layout) else layout
        while len(self.learned) > LEARNED_MAX:
            self.learned.popitem(last=False)

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
            region = self.domain.allocate(size, label=label, grant=[_identity(sender)])
        lease, credit = _core.RegionLease(region), None
        if not grown:  # before the halves are bound: their growth (_learn) looks it up
            with self.lock:
                self.lineage_of.update((c["key"], _lineage(c)) for c in channels)
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
                                      grant=[_identity(receiver)])
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
                        raise _naming(e, failing(c["key"])) from None
                with self.lock:
                    self.grown.update(made)
            else:
                _bind_halves(channels, "send", lease, receiver, make, failing)
        except BaseException:
            _let_go(ring, lease, credit)
            raise
        return {"address": self.domain.address, "credit": credit.descriptor.hex(),
                "fabric": ep.fabric}

    # -- half pairs --
    #
    # A TF1 task plans only its own partition (each task's GraphMgr runs the pass on what it
    # was sent), so no process sees both halves of a pair. Both halves derive the same key from
    # the rendezvous attrs (graph_pass.channel_id) and meet through the receiver, with no step
    # or pass waiting on the other task (a master registers its own task's partition in line):
    #
    #     sender's pass:   want_halves({key: bytes})    (local)
    #     receiver's pass: offer_halves(sender, ...)    (local), then in a thread:
    #         half_sizes  -> sender    (asked every HALF_POLL_S until its pass wanted every key)
    #         allocates the region: slots of the sender's known size, else the planned capacity;
    #         as many as a static channel gets when the size is known (it never chunks)
    #         attach_halves -> sender  (attach_senders)
    #
    # Either pass may run first; a half that never meets its peer fails at the deadline, or at
    # once when setting it up failed (the peer task runs without rdmadev: _give_up). A pair
    # whose connection broke is met again by reopen ("broken connections" below). The
    # kernels wait for their half to be bound (the registry's deadline) and hold it while they
    # live; the last one TF destroys unbinds it (the `owned` attr: _native/tf/ops.cc).

    def want_halves(self, sizes, receivers=None):
        """Records the sending halves this task's pass planned: ``{key: bytes per tensor, or
        None when its shape is known only at run time}``. `receivers` (``{key: receiving
        task}``): each is asked, in the background, whether it runs rdmadev at all; the halves
        to one that does not answer fail at once (HALF_FIX) rather than at the deadline."""
        with self.wanting:
            self._forget_unwanted_locked()
            self.wanted.update(sizes)
            self.wanted_at.update(dict.fromkeys(sizes, time.monotonic()))
            self.wanting.notify_all()
        by_receiver = {}
        for key, task in (receivers or {}).items():
            _core.unfail_half(key, "send")  # a new graph: its halves are being set up again
            by_receiver.setdefault(task, []).append(key)
        if by_receiver:
            threading.Thread(target=self._ask_receivers, args=(by_receiver,), daemon=True,
                             name=f"rdmadev-halves {self.task}").start()

    def _forget_unwanted_locked(self):
        """Forgets the sending halves planned here more than a deadline ago whose graphs went
        (under self.lock): no kernel holds them, neither is bound nor lost to a broken
        connection. Their receiver asks for their sizes within its deadline of the pass that
        planned them (_sender_sizes), or to set up again a half a graph still holds (reopen);
        a graph registered later with the same key plans it again."""
        cutoff = time.monotonic() - self.config.deadline_s
        old = [k for k, at in self.wanted_at.items() if at < cutoff]
        if not old:
            return
        bound = set(_core.bound_channels())
        for key in old:
            if not _half_in_use(key, "send", bound):
                del self.wanted[key], self.wanted_at[key]

    def _ask_receivers(self, by_receiver):
        for task, keys in by_receiver.items():
            try:
                self.call(task, {"op": "ping"})
            except Exception as e:
                self._give_up(keys, "send", f"its receiving task {task} does not answer rdmadev's "
                                            f"control requests, so it never sets up its side: {_reason(e)}")

    def _give_up(self, keys, half, why, hint=HALF_FIX):
        """Fails `half` of `keys` now (their kernels' waits end with `why`, then `hint`), and
        says so."""
        for key in keys:
            _core.fail_half(key, half, why, hint)
        log.warning("rdmadev: %d half pair(s) of %s stay unbound (first %s), and the steps using "
                    "them fail: %s", len(keys), self.task, keys[0], why)

    def offer_halves(self, sender, channels, on_met=None):
        """Sets up, in the background, the receiving halves `channels` (entries with "key",
        "slots", "capacity_bytes" and "rank_capacity") from task `sender`, skipping those bound
        here already (the session's earlier graph shares them). ``on_met(fabric, bytes)`` is
        called once they are bound; if they cannot be, their kernels fail (HALF_FIX)."""
        with self.lock:  # kept for setting them up again after a broken connection (reopen)
            self.offered.setdefault(sender, {}).update((c["key"], c) for c in channels)
        bound = set(_core.bound_channels())
        todo = [c for c in channels if "recv:" + c["key"] not in bound]
        for c in todo:
            _core.unfail_half(c["key"], "recv")
        if todo:
            threading.Thread(target=self._meet, args=(sender, todo, on_met), daemon=True,
                             name=f"rdmadev-halves {sender}").start()

    def _meet(self, sender, channels, on_met):
        try:
            # waits for the sender's pass (up to the deadline) before it takes `meeting`
            sizes = self._sender_sizes(sender, [c["key"] for c in channels])
            with self.meeting:  # a reopen or an earlier graph's offer may have bound some
                bound = set(_core.bound_channels())
                channels = [c for c in channels if "recv:" + c["key"] not in bound]
                if not channels:
                    return
                fabric, size = self._meet_now(sender, channels, sizes)
            if on_met is not None:
                on_met(fabric, size)
        except Exception as e:  # nothing tries again until a new graph offers them
            self._give_up([c["key"] for c in channels], "recv",
                          f"setting up the pair from task {sender} failed: {_reason(e)}",
                          getattr(e, "hint", None) or HALF_FIX)

    def _meet_now(self, sender, channels, sizes):
        """Lays out the receiving halves `channels` from `sender` in one region, slots sized
        by what the sender planned (`sizes`: half_sizes), or as their lineage grew here before
        (a pair met again after a cut, a new session's graph, a sender started again), and
        binds both halves of each; returns (fabric, region bytes)."""
        sized = []
        for c in sorted(channels, key=lambda c: c["key"]):
            known = sizes.get(c["key"])
            fits = type(known) is int and 0 <= known <= self.config.max_tensor_bytes
            capacity = known if fits else c["capacity_bytes"]
            slot, payload = slot_bytes(capacity, c["rank_capacity"])
            # a known size is a static channel's, as planned here for this config
            slots = PlanConfig(slots=self.config.slots).slots_for(None) if fits else c["slots"]
            sized.append({"key": c["key"], "lineage": _lineage(c), "slots": slots,
                          "slot_bytes": slot, "payload_offset": payload,
                          "capacity_bytes": capacity})
        laid, size = _laid_out(sized, {})
        p, done = self._open_as_learned(HALF_PAIRS, {"sender": sender, "channels": laid,
                                                     "bytes": size}, attach="attach_halves")
        return done["fabric"], p["bytes"]

    def _sender_sizes(self, sender, keys):
        """``{key: bytes or None}`` from task `sender` once its pass planned every key of
        `keys`, asking every HALF_POLL_S until this task's deadline."""
        deadline = time.monotonic() + self.config.deadline_s
        while True:
            got = self.call(sender, {"op": "half_sizes", "keys": keys, "wait_s": HALF_POLL_S})
            if not got["missing"]:
                return got["sizes"]
            if time.monotonic() > deadline or self.closing.is_set():
                raise ProtocolError(
                    f"task {sender} never planned the sending half of {len(got['missing'])} "
                    f"channel(s) {self.task} planned to receive (first {got['missing'][0]}) "
                    f"within {self.config.deadline_s:g} s",
                    hint=HALF_FIX)

    def half_sizes(self, r):
        """What this task's pass planned of the sending halves ``r["keys"]``, waiting up to
        ``r["wait_s"]`` (at most HALF_POLL_S) for all of them: ``{"sizes": {key: bytes or
        None}, "missing": [keys not planned yet]}``."""
        keys = set(r["keys"])
        wait_s = min(float(r.get("wait_s", 0)), HALF_POLL_S)
        with self.wanting:
            self.wanting.wait_for(lambda: keys <= self.wanted.keys(), timeout=wait_s)
            return {"sizes": {k: self.wanted[k] for k in keys & self.wanted.keys()},
                    "missing": sorted(keys - self.wanted.keys())}

    def attach_halves(self, r):
        """attach_senders for half pairs this task's pass planned (half_sizes said so)."""
        with self.wanting:
            missing = sorted({c["key"] for c in r["channels"]} - self.wanted.keys())
        if missing:
            raise ProtocolError(f"task {self.task} did not plan the sending half of channel "
                                f"{missing[0]} that {r['receiver']} asks to attach",
                                hint="run the same rdmadev version in every task")
        return self.attach_senders(r)

    # -- growth --
    #
    # A dynamic channel's tensor larger than its slots is staged by its sender and read (or,
    # with no room for a stage, comes in chunks); the wait kernel records its size
    # (RingReceiver::Want). The receiving task's
    # watcher then moves the channel to a ring whose slots hold it (channel.h, "Growth"):
    #
    #     receiver: allocates the larger ring
    #     attach_grown -> sender     (attach_senders, kept unbound)
    #     receiver: binds its successor
    #     bind_grown   -> sender     (binds the sending successor)
    #
    # The write kernel moves at its next tensor (a marker on the old ring), the wait kernel
    # when it takes the marker; both old halves go then. Counted as "grown" (counters()).
    # The receiver keeps the layout a channel grew to under its lineage (`learned`, the
    # LEARNED_MAX most recent; opening.lineage: the function, tensor and tasks, not the
    # instantiation): a pair set up again after a cut (reopen), a half pair met again, and the
    # channel of a later instantiation (a retrace, a new coordinator's trace of the same step,
    # a sending task started again) get those slots at once instead of the plan's, with no
    # staged or chunked transfer and no growth again, where they hold what it plans (_holds).

    def _grow_channels(self):
        """Moves every receiving half here whose tensors outgrew its slots to a larger ring
        (up to GROWTH_MAX_SLOT); one that cannot grow keeps its slots (a WARNING says why),
        and its larger tensors go on staged."""
        for g in _core.growing_channels(self.domain):
            if g["key"] in self.not_grown or self.closing.is_set():
                continue
            if g["capacity_bytes"] >= GROWTH_MAX_SLOT:  # larger tensors stay staged
                self.not_grown.add(g["key"])
                continue
            try:
                self._grow(g)
            except Exception as e:
                self.not_grown.add(g["key"])
                log.warning("rdmadev: channel %s from %s keeps its %d-byte slots, and its "
                            "tensors of up to %d bytes go staged: %s", g["key"], g["peer"],
                            g["capacity_bytes"], g["wanted"], e)

    def _grow(self, g):
        wanted, limit = g["wanted"], self.config.max_tensor_bytes
        capacity = min(round_up(wanted + wanted // GROWTH_HEADROOM, GROWTH_ALIGN),
                       GROWTH_MAX_SLOT, limit)
        if capacity < min(wanted, GROWTH_MAX_SLOT):
            raise ConfigError(f"a slot of {wanted} bytes exceeds RDMADEV_MAX_TENSOR_BYTES={limit}",
                              hint="raise RDMADEV_MAX_TENSOR_BYTES on every task")
        slot, payload = slot_bytes(capacity, g["rank_capacity"])
        channel = {"key": g["key"], "slots": g["slots"], "slot_bytes": slot,
                   "payload_offset": payload, "capacity_bytes": capacity, "offset": 0}
        size = round_up(g["slots"] * slot, REGION_ALIGNMENT)
        self._open_pair(GROWN, {"sender": g["peer"], "bytes": size, "channels": [channel]},
                        attach="attach_grown")
        with self.lock:
            self._learn(g["key"], {f: channel[f] for f in LAYOUT_FIELDS if f != "offset"})
        log.info("rdmadev: channel %s from %s moved to %d-byte slots (tensors of %d bytes did "
                 "not fit its %d)", g["key"], g["peer"], capacity, wanted, g["capacity_bytes"])

    def attach_grown(self, r):
        """attach_senders for the larger ring of channels this task sends to
        ``r["receiver"]``, kept until ``bind_grown``."""
        bound = set(_core.bound_channels())
        missing = [c["key"] for c in r["channels"] if "send:" + c["key"] not in bound]
        if missing:
            raise ProtocolError(f"task {self.task} has no sending half of channel {missing[0]} "
                                f"for {r['receiver']} to grow",
                                hint="run the same rdmadev version in every task")
        return self.attach_senders(r, grown=True)

    def bind_grown(self, r):
        """Binds the sending successors of ``r["keys"]`` set up by ``attach_grown`` (with
        ``"drop"``: drops them; the receiver's setup failed). Returns how many."""
        with self.lock:
            held = {k: self.grown.pop(k) for k in r["keys"] if k in self.grown}
        missing = [k for k in r["keys"] if k not in held]
        if missing and not r.get("drop"):
            raise ProtocolError(f"task {self.task} has no grown sending half of channel "
                                f"{missing[0]} to bind (released meanwhile?)",
                                hint="the channel keeps its slots until it is set up again")
        for key, (sender, lease, receiver) in held.items():
            if r.get("drop"):
                sender.close()
            else:
                sender.bind(key, lease, peer=receiver, successor=True, reader=_identity(receiver))
        return len(held)

    def _drop_grown(self, sender, keys):
        """Best effort: tells `sender` to drop the successors of `keys` it set up."""
        try:
            self.call(sender, {"op": "bind_grown", "keys": list(keys), "drop": True})
        except Exception as e:  # the peer may be gone; what it held went with it
            log.info("rdmadev: could not tell %s to drop %d grown channel(s): %s", sender,
                     len(keys), e)

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

    # -- broken connections --
    #
    # A connection can break while both of its tasks run: a verbs transfer or queue pair
    # that failed (a write later than the late-write grace, a link down past the retry
    # budget), a tcp connection cut (a refused frame, a reset). The watcher of a task that
    # sees it unbinds every half with the peer (_bury_locked); steps of the instantiations TF
    # still holds would then find no halves. So each task that saw it (_recover):
    #
    #     ping   -> peer                        the same process still? (its Domain address)
    #     reopen    here (sender: the peer)     pairs the peer sends here, set up again
    #     reopen -> peer (sender: this task)    pairs this task sends the peer
    #
    # reopen sets up again, as open_pairs did, each pair from its sender that an instantiation
    # still holds here and that lost a half on either task (bound_senders asks the sender):
    # both tasks may see one break, and a pair set up again is whole the second time. Half
    # pairs (TF1) are met again likewise, those whose receiving half a graph's kernels still
    # hold here, or will (_held_halves_locked), one setup at a time with new graphs' offers
    # (meeting: two setups of one key crossing would bind a sender to the other's ring). The
    # step the break hit fails, and so does one that looks for the halves before they are
    # bound again (Unavailable: they are marked lost, registry.h UnbindPeer); the next run on
    # fresh rings (epoch 0 on both sides; a late write of the failed step carries its step tag
    # and is discarded).

    def _recover(self, task, address):
        """_buried's background half: sets up again the pairs between this task and `task`
        (see above), if `task` is the process its Domain `address` belonged to."""
        try:
            same = self.call(task, {"op": "ping"})["address"] == address
        except Exception as e:  # gone: TF fails the steps that need it
            log.info("rdmadev: %s does not answer (%s); its channels here stay unbound", task,
                     _reason(e))
            return
        if not same or self.closing.is_set():  # restarted: TF instantiates its functions again
            return
        try:
            n = self.reopen({"sender": task})["reopened"]
            n += self.call(task, {"op": "reopen", "sender": self.task})["reopened"]
        except Exception as e:
            log.warning("rdmadev: the connection between %s and %s broke while both run, and "
                        "their channels could not all be set up again: %s", self.task, task,
                        _reason(e))
            return
        if n:
            log.warning("rdmadev: the connection between %s and %s broke while both run; "
                        "%d region(s) of channels between them were set up again", self.task,
                        task, n)

    def reopen(self, r):
        """Sets up again each pair task ``r["sender"]`` sends here that lost a half to a
        broken connection, on this task or the sender (see above).

        Returns:
            ``{"reopened": pairs set up again}``.
        """
        sender = r["sender"]
        with self.reopening, self.meeting:
            self._sweep_dead_peers()  # a break this task has not looked at yet
            with self.lock:
                held = [(i, p) for i, pairs in self.received.items() for p in pairs
                        if p["sender"] == sender]
                halves = self._held_halves_locked(sender)
            if not (held or halves) or self.closing.is_set():
                return {"reopened": 0}
            keys = [c["key"] for _, p in held for c in p["channels"]] + [c["key"] for c in halves]
            whole = set(self.call(sender, {"op": "bound_senders", "keys": keys}))
            whole &= {k[len("recv:"):] for k in _core.bound_channels() if k.startswith("recv:")}
            broken = [(i, p) for i, p in held if any(c["key"] not in whole for c in p["channels"])]
            n = sum(self._reopen_pair(instance, p) for instance, p in broken)
            torn = [c for c in halves if c["key"] not in whole]
            if torn:
                n += self._reopen_halves(sender, torn)
            self.reopened += n
            return {"reopened": n}

    def _held_halves_locked(self, sender):
        """The receiving halves of half pairs from `sender` that a TF graph here still holds,
        or whose kernels it is still creating (under self.lock): _half_in_use (a graph's pass
        offers and meets its halves, binding them, a moment before TF creates its kernels).
        The others are forgotten: their graphs went."""
        offered = self.offered.get(sender, {})
        bound = set(_core.bound_channels())
        for key in [k for k in offered if not _half_in_use(k, "recv", bound)]:
            del offered[key]
            self.lineage_of.pop(key, None)
        return list(offered.values())

    def _reopen_pair(self, instance, p):
        """open_pairs again for one pair of `instance`, with the slots its channels grew to
        (learned): True if it is set up. If that fails, the steps using its channels fail at
        once on both tasks, saying why (and the fix of the cause, when it names one)."""
        sender, keys = p["sender"], [c["key"] for c in p["channels"]]
        try:  # a channel may have grown since the pair was opened
            self._open_as_learned(instance, p)
        except Exception as e:
            self._not_reopened(sender, keys, e)
            return False
        with self.lock:
            released = instance not in self.received
        if released:  # meanwhile: what was just bound goes too
            self.release({"keys": keys, "half": "recv"})
            self._notify(sender, keys, "send")
        return True

    def _reopen_halves(self, sender, channels):
        """Meets again the half pairs `channels` from `sender` (one region, as _meet does):
        True if they are set up; if not, their steps fail at once on both tasks, saying why."""
        keys = [c["key"] for c in channels]
        try:
            self._meet_now(sender, channels, self._sender_sizes(sender, keys))
        except Exception as e:
            self._not_reopened(sender, keys, e)
            return False
        return True

    def _not_reopened(self, sender, keys, e):
        """The channels `keys` from `sender` could not be set up again (`e`): the steps using
        them fail at once on both tasks with why (and the fix of the cause, when it names one)."""
        failed = [f"its connection to task {sender} broke and setting the pair up again "
                  f"failed: {_reason(e)}", getattr(e, "hint", None) or REOPEN_FIX]
        self.release({"keys": keys, "half": "recv", "failed": failed})
        self._notify(sender, keys, "send", failed=failed)
        log.warning("rdmadev: %d channel(s) from %s to %s (first %s) stay unbound, and the "
                    "steps using them fail: %s", len(keys), sender, self.task, keys[0],
                    failed[0])

    def bound_senders(self, r):
        """The channels of ``r["keys"]`` whose sending half is bound here, on a connection
        that has not broken (reopen asks)."""
        self._sweep_dead_peers()
        bound = set(_core.bound_channels())
        return [k for k in r["keys"] if "send:" + k in bound]

    def peer_endpoints(self):
        """``{peer task: [Endpoint]}``: the endpoints to each peer task (the heartbeats'
        view: liveness.py marks them silent and heard)."""
        with self.lock:
            grouped = {}
            for address, ep in self.endpoints.items():
                grouped.setdefault(self.peers[address], []).append(ep)
            return grouped

    def _sweep_dead_peers(self):
        """Unbinds the halves whose peer's endpoint died, and sets up again those of peers
        that still run (_buried)."""
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
        it, and, in the background, sets up again the channels between this task and its
        peer if that task still runs (_recover): a connection can break with both tasks
        running (a failed verbs transfer or queue pair, a tcp connection cut)."""
        task = self.peers.get(address)
        log.info("rdmadev: connection to %s (%s) is gone: %s; unbound %d channel half(s)", task,
                 address, why, unbound)
        ep.close()
        if task is not None and not self.closing.is_set():
            threading.Thread(target=self._recover, args=(task, address), daemon=True,
                             name=f"rdmadev-recover {task}").start()

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
