"""Half pairs: the channels of TF1 tasks, each of which plans only its own half
(HalfPairs, a part of ChannelTable that owns its state: ``table.halves``).

A TF1 task plans only its own partition (each task's GraphMgr runs the pass on what it
was sent), so no process sees both halves of a pair. Both halves derive the same key from
the rendezvous attrs (graph_pass.channel_id) and meet through the receiver, with no step
or pass waiting on the other task (a master registers its own task's partition in line):

    sender's pass:   want_halves({key: bytes})    (local)
    receiver's pass: offer_halves(sender, ...)    (local), then in a thread:
        half_sizes  -> sender    (asked every HALF_POLL_S until its pass wanted every key)
        allocates the region: slots of the sender's known size, else the planned capacity;
        as many as a static channel gets when the size is known (it never chunks)
        attach_halves -> sender  (attach_senders)

Either pass may run first. The kernels wait for their half to be bound (the registry's
deadline) and hold it while they live; the last one TF destroys unbinds it (the `owned` attr:
_native/tf/kernels/ops.cc). A pair whose connection broke is met again by reopen
(recovery.py: ``held``, ``meet_again``).

A pair the two tasks cannot set up stays on TF's own path (``keep_on_tf``), as TF would run it:
the receiving task runs without rdmadev or plans no TF1 graph (its "facts" say so; the sender
keeps its half), the sending task does either or never plans its half within the deadline, or
the receiving task has no room for the slots within RDMADEV_MAX_REGISTERED_BYTES (the receiver
keeps its half and tells the sender: ``keep_halves``). A half pair's nodes keep TF's rendezvous
attrs, and a kernel whose half is kept puts or takes the tensor in its step's rendezvous as TF's
own kernels do (_native/tf/kernels/tf_path.h), so a task without rdmadev runs TF's kernels at
the other end. A pair is kept in both tasks for as long as they live (a pair met again on one
side only would send a step's tensor one way and wait for it the other): the sender answers
``half_sizes`` with the keys it keeps and refuses to attach them, and the receiver then keeps
them too. A failure that is not for good (a connection broke while the pair was being met:
``_for_good``) fails the steps that use the pair until it is met again.
"""
import logging
import threading
import time

from graph_pass.plan import Config as PlanConfig

from .. import _core
from ..errors import ProtocolError, RegionError
from .channel_common import reason_of
from .growth import channel_lineage, laid_out

__all__ = ["HalfPairs", "HALF_PAIRS", "HALF_FIX", "HALF_POLL_S"]

#: Label of the regions half pairs meet in (in place of an instantiation id: none planned both).
HALF_PAIRS = "halves"

#: The fix named when a half pair cannot be set up: both tasks must run rdmadev.
HALF_FIX = ("start every task with the grpc+rdmadev protocol (or RDMADEV_AUTO=1), with the "
            "same RDMADEV_SECRET and rdmadev version in each")

#: The fix named when a task's pass does not rewrite TF1 graphs, so it never plans its halves.
PLANS_NO_HALVES_FIX = ("start it with RDMADEV_AUTO=1 (`rdmadev serve`), or as a server of the "
                       "grpc+rdmadev protocol, as its peers are")

#: How often, and how far apart in seconds, a task asks a peer before concluding from its
#: silence that it runs without rdmadev (its pairs then keep TF's path for good): a refused
#: connection is that, or a task starting or restarting that very moment.
ASK_TRIES, ASK_EVERY_S = 3, 0.5

#: Seconds one ``half_sizes`` request waits at the sender for its pass before answering with
#: what is still missing; the receiver asks again until its deadline. Short, so the control
#: connection it holds stays free for other requests in between.
HALF_POLL_S = 1.0

log = logging.getLogger("rdmadev.cluster.channels")  # channel setup logs as one, whichever part


class _Unmet(ProtocolError):
    """Half pairs their sender will never meet: it keeps them on TF's path, or never planned
    them within the deadline (_sender_sizes)."""


def _half_in_use(key, half, bound):
    """Whether `half` of the half pair `key` still belongs to a TF graph here: held by a
    kernel, bound (`bound`: _core.bound_channels()), or lost to a broken connection while
    bound and let go by no kernel since (the last kernel to go unbinds its half)."""
    return (_core.half_held(key, half) or f"{half}:{key}" in bound
            or _core.half_lost(key, half))


class HalfPairs:
    """A task's half pairs (the module's docstring). Its state is its own, under its own lock:

    - ``wanted``: key -> bytes (None: run-time shape) of the sending halves planned here,
      ``wanted_at``: key -> when its pass last planned it (time.monotonic), and ``on_kept``:
      key -> what its pass asked to be called with the keys kept on TF's path;
    - ``offered``: sender task -> {key: channel entry}, the receiving halves offered here
      (kept to meet them again after a broken connection);
    - a lock held while half pairs are set up, one setup at a time (``one_at_a_time``).

    Args:
        table: the ChannelTable it is a part of. HalfPairs asks it to attach sending halves
            (``attach_senders``), and reads its ``config``, ``task``, ``call`` and ``closing``.
        growth: the table's Growth, which sets up pairs with the slots they learned
            (``open_as_learned``) and is told of receiving halves forgotten here (``untrack``).
    """

    #: The control requests it serves (ChannelTable.handle routes them here).
    REQUESTS = ("half_sizes", "attach_halves", "keep_halves")

    def __init__(self, table, growth):
        self.table = table
        self.growth = growth
        self.lock = threading.Lock()
        self.wanting = threading.Condition(self.lock)  # notified when `wanted` grows
        self.meeting = threading.Lock()  # one half-pair setup at a time (_meet, reopen)
        self.wanted = {}
        self.wanted_at = {}
        self.on_kept = {}
        self.offered = {}

    def want_halves(self, sizes, receivers=None, on_kept=None):
        """Records the sending halves this task's pass planned: ``{key: bytes per tensor, or
        None when its shape is known only at run time}``. `receivers` (``{key: receiving
        task}``): each is asked, in the background, whether it runs rdmadev at all; the halves
        to one that does not answer are kept on TF's path at once rather than waited for until
        the deadline. ``on_kept(keys)`` is called with those of `sizes` kept on TF's path."""
        with self.wanting:
            self._forget_unwanted_locked()
            self.wanted.update(sizes)
            self.wanted_at.update(dict.fromkeys(sizes, time.monotonic()))
            if on_kept is not None:
                self.on_kept.update(dict.fromkeys(sizes, on_kept))
            self.wanting.notify_all()
        kept = {key for key in sizes if _core.half_kept_on_tf(key, "send")}
        if kept and on_kept is not None:  # kept before this pass planned them (keep_halves)
            on_kept(sorted(kept))
        by_receiver = {}
        for key, task in (receivers or {}).items():
            if key in kept:
                continue
            _core.unfail_half(key, "send")  # a new graph: its halves are being set up again
            by_receiver.setdefault(task, []).append(key)
        if by_receiver:
            threading.Thread(target=self._ask_receivers, args=(by_receiver,), daemon=True,
                             name=f"rdmadev-halves {self.table.task}").start()

    def _forget_unwanted_locked(self):
        """Forgets the sending halves planned here more than a deadline ago whose graphs went
        (under self.lock): no kernel holds them, neither is bound nor lost to a broken
        connection. Their receiver asks for their sizes within its deadline of the pass that
        planned them (_sender_sizes), or to set up again a half a graph still holds (reopen);
        a graph registered later with the same key plans it again."""
        cutoff = time.monotonic() - self.table.config.deadline_s
        old = [k for k, at in self.wanted_at.items() if at < cutoff]
        if not old:
            return
        bound = set(_core.bound_channels())
        for key in old:
            if not _half_in_use(key, "send", bound):
                del self.wanted[key], self.wanted_at[key]
                self.on_kept.pop(key, None)

    def _ask_receivers(self, by_receiver):
        for task, keys in by_receiver.items():
            try:
                plans = self._plans_halves(task)
            except Exception as e:  # it runs without rdmadev: TF's own _Recv waits there
                self.keep_on_tf(keys, "send", f"their receiving task {task} does not answer "
                                              f"rdmadev's control requests: {reason_of(e)}")
                continue
            if plans is False:  # its graph keeps TF's own _Recv
                self.keep_on_tf(keys, "send", f"their receiving task {task} does not plan TF1 "
                                              "graphs (its pass rewrites only rdmadev.optimize'd "
                                              "functions)", PLANS_NO_HALVES_FIX)

    def _plans_halves(self, task):
        """Whether `task`'s partition pass plans its halves of TF1 pairs (it rewrites every
        graph: its "pass_mode" fact is "all"), None when it does not say (its TF layer is not
        loaded yet). Raises what the request raised: a task without rdmadev does not answer."""
        mode = self._ask(task, {"op": "facts"}).get("pass_mode")
        return None if mode is None else mode == "all"

    def keep_on_tf(self, keys, half, why, hint=HALF_FIX):
        """Keeps `half` of the half pairs `keys` on TF's own path for as long as this process
        lives (the module's docstring; _core.keep_half_on_tf), and says so once, with `why`
        and `hint`."""
        for key in keys:
            _core.keep_half_on_tf(key, half)
        told = {}
        with self.lock:
            if half == "recv":  # not met again after a broken connection (held)
                for offered in self.offered.values():
                    for key in keys:
                        offered.pop(key, None)
            else:
                for key in keys:
                    if key in self.on_kept:
                        told.setdefault(self.on_kept[key], []).append(key)
        for on_kept, mine in told.items():
            on_kept(mine)
        log.warning("rdmadev: %d half pair(s) %s %s (first %s) stay on TF's gRPC path: %s; %s",
                    len(keys), "from" if half == "send" else "to", self.table.task, keys[0],
                    why, hint)

    def keep_halves(self, r):
        """The receiving task ``r["receiver"]`` keeps the half pairs ``r["keys"]`` on TF's path
        (``r["why"]``): so does their sending half here."""
        keys = [k for k in r["keys"] if not _core.half_kept_on_tf(k, "send")]
        if keys:
            self.keep_on_tf(keys, "send", f"{r['receiver']} keeps them: {r['why']}",
                            hint="see that task's log")
        return {"kept": len(r["keys"])}

    def offer_halves(self, sender, channels, on_met=None):
        """Sets up, in the background, the receiving halves `channels` (entries with "key",
        "slots", "capacity_bytes" and "rank_capacity") from task `sender`, skipping those bound
        here already (the session's earlier graph shares them) and those kept on TF's path.
        ``on_met(fabric, bytes)`` is called once they are bound; if they cannot be, they are
        kept on TF's path (keep_on_tf), and ``on_met(None, why)`` is called."""
        channels = [c for c in channels if not _core.half_kept_on_tf(c["key"], "recv")]
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
        except Exception as e:
            why = f"setting them up with task {sender} failed: {reason_of(e)}"
            keys, hint = [c["key"] for c in channels], getattr(e, "hint", None) or HALF_FIX
            if not self._for_good(sender, keys, e):
                self._fail(keys, why, hint)
                return
            self.keep_on_tf(keys, "recv", why, hint)
            self._tell_sender_kept(sender, keys, why)
            if on_met is not None:
                on_met(None, why)

    def _for_good(self, sender, keys, e):
        """Whether `e`, raised meeting the half pairs `keys` with `sender`, is for good: the
        sender will never meet them (_Unmet; asked again here, as it may have kept them since
        it said their sizes), a task has no room for them within its budget, or the sender does
        not answer (it runs without rdmadev, or is gone). Else it is transient (a connection
        broke meanwhile), and the pairs are met again (recovery.py's reopen, or a later graph's
        offer)."""
        if isinstance(e, (_Unmet, RegionError)) or getattr(e, "kind", None) == "RegionError":
            return True
        try:
            got = self._ask(sender, {"op": "half_sizes", "keys": keys, "wait_s": 0})
        except Exception:
            return True
        return bool(got.get("kept"))

    def _ask(self, task, request):
        """`task`'s answer to `request`, asked up to ASK_TRIES times; raises the last failure."""
        for attempt in range(ASK_TRIES):
            try:
                return self.table.call(task, request)
            except Exception:
                if attempt == ASK_TRIES - 1 or self.table.closing.wait(ASK_EVERY_S):
                    raise

    def _fail(self, keys, why, hint):
        """Fails the steps waiting for the receiving halves `keys` at once, until they are met
        again (a failure for now: _for_good), and says so."""
        for key in keys:
            _core.fail_half(key, "recv", why, hint)
        log.warning("rdmadev: %d half pair(s) to %s (first %s) stay unbound until they are met "
                    "again, and the steps using them fail: %s", len(keys), self.table.task,
                    keys[0], why)

    def _tell_sender_kept(self, sender, keys, why):
        """Tells `sender` that this task keeps the half pairs `keys` on TF's path (keep_halves).
        A sender that runs without rdmadev does not answer, and needs no telling: its _Send is
        TF's own."""
        try:
            self._ask(sender, {"op": "keep_halves", "receiver": self.table.task, "keys": keys,
                               "why": why})
        except Exception as e:
            log.info("rdmadev: could not tell %s to keep %d half pair(s) on TF's path: %s",
                     sender, len(keys), reason_of(e))

    def _meet_now(self, sender, channels, sizes):
        """Lays out the receiving halves `channels` from `sender` in one region, slots sized
        by what the sender planned (`sizes`: half_sizes), or as their lineage grew here before
        (a pair met again after a cut, a new session's graph, a sender started again), and
        binds both halves of each; returns (fabric, region bytes)."""
        config = self.table.config
        sized = []
        for c in sorted(channels, key=lambda c: c["key"]):
            known = sizes.get(c["key"])
            fits = type(known) is int and 0 <= known <= config.max_tensor_bytes
            capacity = known if fits else c["capacity_bytes"]
            slot, payload = _core.LAYOUT.slot_bytes(capacity, c["rank_capacity"])
            # a known size is a static channel's, as planned here for this config
            slots = PlanConfig(slots=config.slots).slots_for(None) if fits else c["slots"]
            sized.append({"key": c["key"], "lineage": channel_lineage(c), "slots": slots,
                          "slot_bytes": slot, "payload_offset": payload,
                          "capacity_bytes": capacity})
        laid, size = laid_out(sized, {})
        p, done = self.growth.open_as_learned(HALF_PAIRS, {"sender": sender, "channels": laid,
                                                           "bytes": size}, attach="attach_halves")
        return done["fabric"], p["bytes"]

    def _sender_sizes(self, sender, keys):
        """``{key: bytes or None}`` from task `sender` once its pass planned every key of
        `keys`, asking every HALF_POLL_S until this task's deadline."""
        deadline_s = self.table.config.deadline_s
        deadline = time.monotonic() + deadline_s
        asked = False
        while True:
            got = self.table.call(sender, {"op": "half_sizes", "keys": keys,
                                           "wait_s": HALF_POLL_S})
            if got.get("kept"):
                raise _Unmet(f"task {sender} keeps the sending half of {len(got['kept'])} "
                             f"of them on TF's path (first {got['kept'][0]})",
                             hint="see that task's log")
            if not got["missing"]:
                return got["sizes"]
            if not asked:  # its pass has not planned them yet: will it ever?
                asked = True
                if self._plans_halves(sender) is False:
                    raise _Unmet(f"task {sender} does not plan TF1 graphs (its pass rewrites "
                                 "only rdmadev.optimize'd functions)", hint=PLANS_NO_HALVES_FIX)
            if time.monotonic() > deadline or self.table.closing.is_set():
                raise _Unmet(
                    f"task {sender} never planned the sending half of {len(got['missing'])} "
                    f"channel(s) {self.table.task} planned to receive (first "
                    f"{got['missing'][0]}) within {deadline_s:g} s",
                    hint=HALF_FIX)

    def half_sizes(self, r):
        """What this task's pass planned of the sending halves ``r["keys"]``, waiting up to
        ``r["wait_s"]`` (at most HALF_POLL_S) for all of them: ``{"sizes": {key: bytes or
        None}, "missing": [keys not planned yet], "kept": [keys kept on TF's path here]}``
        (any kept: at once, and the receiver keeps them all)."""
        kept = sorted(k for k in r["keys"] if _core.half_kept_on_tf(k, "send"))
        if kept:
            return {"sizes": {}, "missing": [], "kept": kept}
        keys = set(r["keys"])
        wait_s = min(float(r.get("wait_s", 0)), HALF_POLL_S)
        with self.wanting:
            self.wanting.wait_for(lambda: keys <= self.wanted.keys(), timeout=wait_s)
            return {"sizes": {k: self.wanted[k] for k in keys & self.wanted.keys()},
                    "missing": sorted(keys - self.wanted.keys())}

    def attach_halves(self, r):
        """attach_senders for half pairs this task's pass planned (half_sizes said so)."""
        kept = [c["key"] for c in r["channels"] if _core.half_kept_on_tf(c["key"], "send")]
        if kept:
            raise ProtocolError(f"task {self.table.task} keeps the sending half of channel "
                                f"{kept[0]} on TF's path: {r['receiver']} must keep its own",
                                hint="see this task's log")
        with self.wanting:
            missing = sorted({c["key"] for c in r["channels"]} - self.wanted.keys())
        if missing:
            raise ProtocolError(f"task {self.table.task} did not plan the sending half of "
                                f"channel {missing[0]} that {r['receiver']} asks to attach",
                                hint="run the same rdmadev version in every task")
        return self.table.attach_senders(r)

    def counters(self):
        """``{"wanted": sending halves planned here it still answers for}``
        (ChannelTable.counters)."""
        with self.lock:
            return {"wanted": len(self.wanted)}

    # -- recovery's side: meeting again the half pairs of a broken connection --

    def one_at_a_time(self):
        """The lock held while half pairs are set up (a context manager): recovery holds it
        around ``held`` and ``meet_again``, so that two setups of one key never cross (that
        would bind a sender to the other's ring)."""
        return self.meeting

    def held(self, sender):
        """The receiving halves of half pairs from `sender` that a TF graph here still holds,
        or whose kernels it is still creating: _half_in_use (a graph's pass offers and meets
        its halves, binding them, a moment before TF creates its kernels). The others are
        forgotten: their graphs went."""
        with self.lock:
            offered = self.offered.get(sender, {})
            bound = set(_core.bound_channels())
            gone = [k for k in offered if not _half_in_use(k, "recv", bound)]
            for key in gone:
                del offered[key]
            kept = list(offered.values())
        self.growth.untrack(gone)
        return kept

    def meet_again(self, sender, channels):
        """Meets again the half pairs `channels` from `sender` (one region, as _meet does), under
        ``one_at_a_time``. Raises what setting them up raised."""
        self._meet_now(sender, channels, self._sender_sizes(sender, [c["key"] for c in channels]))
