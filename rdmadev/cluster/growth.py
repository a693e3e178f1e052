"""Growth: a dynamic channel whose tensors outgrow its slots moves to a larger ring, and the
receiving task keeps what it grew to for the channel's later setups (Growth, a part of
ChannelTable that owns its state: ``table.growth``).

A dynamic channel's tensor larger than its slots is staged by its sender and read (or, with
no room for a stage, comes in chunks); the wait kernel records its size (RingReceiver::Want).
The receiving task's watcher then moves the channel to a ring whose slots hold it (channel.h,
"Growth"):

    receiver: allocates the larger ring
    attach_grown -> sender     (attach_senders, kept unbound)
    receiver: binds its successor
    bind_grown   -> sender     (binds the sending successor)

The write kernel moves at its next tensor (a marker on the old ring), the wait kernel
when it takes the marker; both old halves go then. Counted as "grown" (counters()).
The receiver keeps the layout a channel grew to under its lineage (`learned`, the
LEARNED_MAX most recent; opening.lineage: the function, tensor and tasks, not the
instantiation): a pair set up again after a cut (reopen), a half pair met again, and the
channel of a later instantiation (a retrace, a new coordinator's trace of the same step,
a sending task started again) get those slots at once instead of the plan's, with no
staged or chunked transfer and no growth again, where they hold what it plans (_holds).
"""
import collections
import logging
import threading

from graph_pass.layout import end_to_end, round_up

from .. import _core
from ..errors import ConfigError, ProtocolError, RegionError
from .channel_common import domain_identity
from .opening import LAYOUT_FIELDS

__all__ = ["Growth", "channel_lineage", "laid_out", "GROWN", "GROWTH_HEADROOM", "GROWTH_ALIGN",
           "GROWTH_MAX_SLOT", "LEARNED_MAX"]

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
#: (docs/history/between-graph.md).
GROWTH_MAX_SLOT = 4 << 20

#: Channels (lineages) whose grown slots a task keeps for later instantiations, the least
#: recently used forgotten first: a program's channels that grow number in the tens to
#: hundreds (the embedding benchmark: 32 at 64 KiB slots), and an entry is a few hundred bytes.
LEARNED_MAX = 4096

log = logging.getLogger("rdmadev.cluster.channels")  # channel setup logs as one, whichever part


def _holds(grown, planned):
    """True if layout `grown` (None: none) holds every tensor layout `planned` does, in as
    many slots: a channel's grown layout is used in place of what a new graph plans under its
    key only then (that graph may send another tensor under the same rendezvous key)."""
    return (grown is not None and grown["slots"] == planned["slots"]
            and grown["capacity_bytes"] >= planned["capacity_bytes"]
            and grown["payload_offset"] >= planned["payload_offset"])  # rank capacity


def channel_lineage(channel):
    """The lineage of setup entry `channel` (opening.lineage); an entry without one (made by
    hand) is a lineage of its own."""
    return channel.get("lineage") or channel["key"]


def laid_out(channels, learned):
    """Setup entries `channels` of one region, in order, each with the slots its lineage
    grew to (`learned`: lineage -> layout fields) where they hold what it plans (_holds),
    laid out as the planner lays a region out (layout.end_to_end); and the region's bytes."""
    sized = []
    for c in channels:
        grown = learned.get(channel_lineage(c))
        sized.append({**c, **grown} if _holds(grown, c) else c)
    offsets, used = end_to_end(c["slots"] * c["slot_bytes"] for c in sized)
    return ([{**c, "offset": o} for c, o in zip(sized, offsets)],
            round_up(used, _core.LAYOUT.region_alignment))


class Growth:
    """The growth of the receiving halves bound here and the slots their lineages learned
    (the module's docstring). Its state is its own, under its own lock:

    - ``grown``: key -> (RingSender, lease, receiver), sending successors set up by
      ``attach_grown`` and kept unbound until ``bind_grown``;
    - ``not_grown``: keys of receiving halves whose growth failed (they keep their slots);
    - ``learned``: lineage -> the layout it grew to, the LEARNED_MAX most recently used;
    - ``lineage_of``: key -> lineage of the receiving halves bound here (``track``).

    Args:
        table: the ChannelTable it is a part of. Growth asks it to set up a pair
            (``open_pair``) and to attach sending halves (``attach_senders``), and reads its
            ``config``, ``domain``, ``task``, ``call`` and ``closing``. The table and the
            other parts set pairs up with the slots learned here (``open_as_learned``).
    """

    #: The control requests it serves (ChannelTable.handle routes them here).
    REQUESTS = ("attach_grown", "bind_grown")

    def __init__(self, table):
        self.table = table
        self.lock = threading.Lock()
        self.grown = {}
        self.not_grown = set()
        self.learned = collections.OrderedDict()
        self.lineage_of = {}

    # -- the table's side: what it sets up, releases and counts --

    def track(self, channels):
        """Records the lineage of each of `channels` (setup entries) whose receiving half is
        about to be bound here: what it grows to is learned under that lineage."""
        with self.lock:
            self.lineage_of.update((c["key"], channel_lineage(c)) for c in channels)

    def untrack(self, keys):
        """Forgets the lineages of the receiving halves `keys` (not bound after all, or gone)."""
        with self.lock:
            for key in keys:
                self.lineage_of.pop(key, None)

    def released(self, keys, half):
        """Forgets what it holds for `half` ("send", "recv" or "both") of `keys`, released:
        a failed growth, a sending successor not bound yet, a receiving half's lineage."""
        with self.lock:
            for key in keys:
                self.not_grown.discard(key)
                if half != "recv":
                    self.grown.pop(key, None)
                if half != "send":
                    self.lineage_of.pop(key, None)

    def clear(self):
        """Forgets everything (the table closes)."""
        with self.lock:
            self.grown.clear()
            self.learned.clear()
            self.lineage_of.clear()

    def counters(self):
        """``{"learned": lineages whose grown slots this task keeps}`` (ChannelTable.counters)."""
        with self.lock:
            return {"learned": len(self.learned)}

    def with_learned(self, p):
        """Pair `p` of an open_pairs request, laid out again end to end with the slots its
        channels' lineages grew to here (laid_out), if any did; else `p` as planned."""
        with self.lock:
            for lineage in {channel_lineage(c) for c in p["channels"]} & self.learned.keys():
                self.learned.move_to_end(lineage)  # used: kept the longest
            if not any(_holds(self.learned.get(channel_lineage(c)), c) for c in p["channels"]):
                return p
            channels, size = laid_out(p["channels"], self.learned)
        return {**p, "channels": channels, "bytes": size}

    def open_as_learned(self, instance, planned, attach="attach_senders", offer=None, via=None):
        """ChannelTable.open_pair of pair `planned` laid out with the slots its channels learned
        (with_learned), or as planned if that larger region cannot be registered (past
        RDMADEV_MAX_REGISTERED_BYTES): learned slots spare a staged transfer, they never cost
        a setup. Returns (the pair as set up, open_pair's result)."""
        p = self.with_learned(planned)
        if p is not planned:
            try:
                return p, self.table.open_pair(instance, p, attach, offer, via)
            except RegionError as e:  # refused before the offer or `via` was used
                log.info("rdmadev: the pair from %s is set up with its planned slots, not the "
                         "%d bytes its channels grew to: %s", p["sender"], p["bytes"], e)
        return planned, self.table.open_pair(instance, planned, attach, offer, via)

    def learn(self, key, layout):
        """Keeps `layout`, to which the receiving half `key` grew, for its lineage: the larger
        of it and what the lineage had, its LEARNED_MAX most recent."""
        with self.lock:
            lineage = self.lineage_of.get(key, key)
            known = self.learned.pop(lineage, None)
            self.learned[lineage] = known if _holds(known, layout) else layout
            while len(self.learned) > LEARNED_MAX:
                self.learned.popitem(last=False)

    def drop_successors(self, sender, keys):
        """Best effort: tells `sender` to drop the successors of `keys` it set up (the
        receiving side of their growth failed)."""
        try:
            self.table.call(sender, {"op": "bind_grown", "keys": list(keys), "drop": True})
        except Exception as e:  # the peer may be gone; what it held went with it
            log.info("rdmadev: could not tell %s to drop %d grown channel(s): %s", sender,
                     len(keys), e)

    def grow_channels(self):
        """Moves every receiving half here whose tensors outgrew its slots to a larger ring
        (up to GROWTH_MAX_SLOT); one that cannot grow keeps its slots (a WARNING says why),
        and its larger tensors go on staged. The table's watcher calls it."""
        for g in _core.growing_channels(self.table.domain):
            with self.lock:
                skip = g["key"] in self.not_grown
            if skip or self.table.closing.is_set():
                continue
            if g["capacity_bytes"] >= GROWTH_MAX_SLOT:  # larger tensors stay staged
                self._not_grown(g["key"])
                continue
            try:
                self._grow(g)
            except Exception as e:
                self._not_grown(g["key"])
                log.warning("rdmadev: channel %s from %s keeps its %d-byte slots, and its "
                            "tensors of up to %d bytes go staged: %s", g["key"], g["peer"],
                            g["capacity_bytes"], g["wanted"], e)

    def _not_grown(self, key):
        with self.lock:
            self.not_grown.add(key)

    def _grow(self, g):
        wanted, limit = g["wanted"], self.table.config.max_tensor_bytes
        capacity = min(round_up(wanted + wanted // GROWTH_HEADROOM, GROWTH_ALIGN),
                       GROWTH_MAX_SLOT, limit)
        if capacity < min(wanted, GROWTH_MAX_SLOT):
            raise ConfigError(f"a slot of {wanted} bytes exceeds RDMADEV_MAX_TENSOR_BYTES={limit}",
                              hint="raise RDMADEV_MAX_TENSOR_BYTES on every task")
        slot, payload = _core.LAYOUT.slot_bytes(capacity, g["rank_capacity"])
        channel = {"key": g["key"], "slots": g["slots"], "slot_bytes": slot,
                   "payload_offset": payload, "capacity_bytes": capacity, "offset": 0}
        size = round_up(g["slots"] * slot, _core.LAYOUT.region_alignment)
        self.table.open_pair(GROWN, {"sender": g["peer"], "bytes": size, "channels": [channel]},
                             attach="attach_grown")
        # the receiving successor is bound: the sender may move
        self.table.call(g["peer"], {"op": "bind_grown", "keys": [g["key"]]})
        self.learn(g["key"], {f: channel[f] for f in LAYOUT_FIELDS if f != "offset"})
        log.info("rdmadev: channel %s from %s moved to %d-byte slots (tensors of %d bytes did "
                 "not fit its %d)", g["key"], g["peer"], capacity, wanted, g["capacity_bytes"])

    # -- the requests it serves --

    def attach_grown(self, r):
        """attach_senders for the larger ring of channels this task sends to
        ``r["receiver"]``, kept until ``bind_grown``."""
        bound = set(_core.bound_channels())
        missing = [c["key"] for c in r["channels"] if "send:" + c["key"] not in bound]
        if missing:
            raise ProtocolError(f"task {self.table.task} has no sending half of channel "
                                f"{missing[0]} for {r['receiver']} to grow",
                                hint="run the same rdmadev version in every task")
        return self.table.attach_senders(r, hold=self._hold)

    def _hold(self, made):
        """Keeps the sending successors `made` (key -> (RingSender, lease, receiver)) that
        attach_senders set up, until bind_grown."""
        with self.lock:
            self.grown.update(made)

    def bind_grown(self, r):
        """Binds the sending successors of ``r["keys"]`` set up by ``attach_grown`` (with
        ``"drop"``: drops them; the receiver's setup failed). Returns how many."""
        with self.lock:
            held = {k: self.grown.pop(k) for k in r["keys"] if k in self.grown}
        missing = [k for k in r["keys"] if k not in held]
        if missing and not r.get("drop"):
            raise ProtocolError(f"task {self.table.task} has no grown sending half of channel "
                                f"{missing[0]} to bind (released meanwhile?)",
                                hint="the channel keeps its slots until it is set up again")
        for key, (sender, lease, receiver) in held.items():
            if r.get("drop"):
                sender.close()
            else:
                sender.bind(key, lease, peer=receiver, successor=True,
                            reader=domain_identity(receiver))
        return len(held)
