"""Registered memory as a budgeted cache: the instantiations this process planned give their
channels back when a task needs room for a new plan, and get them again before they run.

TF keeps every trace of a function alive, and each instantiation's channels hold their
rings on the receiving tasks until TF drops the function (instances.py): a step called with
60 batch sizes held 60 instantiations' memory. A task's RDMADEV_MAX_REGISTERED_BYTES is
therefore a budget. A receiving task that a setup would take past it refuses with a
RegionError (registered.py), and the planner (``Evictions.open_within_budget``):

    1. releases, on every task, the channels of its instantiations idle longest that have
       pairs received on that task, until what they held there covers the new plan's bytes
       (never one running now: ``calling`` counts the calls in flight of each function);
    2. opens the new plan again (one more round trip per task pair).

An evicted instantiation keeps its plan here. When TF calls its function again, ``calling``
sets its channels up again (``open_pairs`` with ``again``: the same keys and layout, the slots
its dynamic channels grew to, one round trip per task pair, making room the same way) before
TF runs the step, so no kernel ever finds a channel missing: the step runs as before, bit for
bit. The tasks count both (``evicted``, ``set_up_again`` in their counters).

What is evicted is what this process planned and can see called: the instantiations of
functions called from Python here (rdmadev.optimize, grpc+rdmadev's in-graph steps). Those a
ParameterServerStrategy worker or a TF1 task planned in TF's threads run without a Python call
to see, and are never evicted: past the budget a worker's instantiation stays on TF's gRPC path
(tf/bridge.py, ``over_budget``), and a TF1 half pair too (half_pairs.py, ``keep_on_tf``).

Example:
    >>> fabrics, registered = evictions.open_within_budget(call, instance, swapped, regions)
    >>> with evictions.calling(atomic_function):   # around every eager call (tf/calls.py)
    ...     run_the_step()
"""
import contextlib
import itertools
import logging
import threading
import weakref

from ..errors import ProtocolError
from . import instances
from .opening import open_channels

__all__ = ["Evictions", "open_within_budget", "begin_call", "end_call", "calling", "watching",
           "counters"]

log = logging.getLogger(__name__)
log.addHandler(logging.NullHandler())


class _Planned:
    """One instantiation planned here: what setting it up again takes, what it holds on each
    receiving task, and whether it is evicted. ``gate`` is held while it is released or set
    up again, so a call waits for an eviction in flight."""

    def __init__(self, instance, setup, release, registered):
        self.instance = instance
        self.setup = setup  # setup(again) -> (fabrics, registered)
        self.release = release  # release(quiescent) on every task, as evicted
        self.registered = registered  # {receiving task: bytes}
        self.used = 0  # Evictions.clock when last called (or planned)
        self.running = 0  # calls in flight
        self.clean = True  # its last call ended without an error: nothing of it in flight
        self.evicted = False
        self.gate = threading.Lock()


class Evictions:
    """The instantiations planned in this process, by the TF function that calls them (its
    AtomicFunction: they go with it), least recently used first when room is needed."""

    def __init__(self):
        self.lock = threading.Lock()
        self.by_owner = weakref.WeakKeyDictionary()  # AtomicFunction -> [_Planned]
        self.clock = itertools.count(1)  # call order: ties between calls are impossible
        self.evicted = 0  # instantiations released to make room (each on all its tasks)
        self.set_up_again = 0  # and set up again when called

    def open_within_budget(self, call, instance, transfers, region_bytes, function="", marked=(),
                           scope="", table=None):
        """open_channels, making room past a task's budget; the instantiation is kept for
        eviction when this thread is calling its owner (instances.owner_of_current_call).
        `table`: the planning task's ChannelTable, if a task plans (open_channels).

        Returns:
            ``({channel key: fabric}, {recv task: bytes registered there})``.
        """
        transfers = list(transfers)

        def setup(again):
            return self._within_budget(
                lambda: open_channels(call, instance, transfers, region_bytes, function, marked,
                                      scope, again=again, table=table),
                _needed(transfers, region_bytes), exclude=instance)

        fabrics, registered = setup(False)
        owner = instances.owner_of_current_call()
        if owner is not None and registered:
            tasks = sorted({t.recv_task for t in transfers} | {t.send_task for t in transfers})
            keys = [t.channel_key for t in transfers]
            self.keep(owner, instance, setup, lambda quiescent: instances.release_on_tasks(
                call, instance, tasks, keys, evicted=True, quiescent=quiescent), registered)
        return fabrics, registered

    def keep(self, owner, instance, setup, release, registered):
        """Keeps `instance`, called through `owner`, for eviction: ``setup(again)`` sets it up
        (returning ``(fabrics, {recv task: bytes})``), ``release(quiescent)`` releases it on
        every task (`quiescent`: its last call ended cleanly, so no write of it is in flight and
        no receiving ring need be kept for a late one), and it holds `registered` (``{recv
        task: bytes}``) now."""
        planned = _Planned(instance, setup, release, dict(registered))
        with self.lock:
            planned.used = next(self.clock)
            self.by_owner.setdefault(owner, []).append(planned)

    def _within_budget(self, setup, needed, exclude):
        """setup(), after evicting what a refusing task needs released, for as long as that
        frees something there."""
        while True:
            try:
                return setup()
            except ProtocolError as e:
                task = e.over_budget
                if task is None or not self.make_room(task, needed.get(task, 0), exclude):
                    raise

    def make_room(self, task, needed, exclude=None):
        """Evicts the idle instantiations planned here with pairs received on `task`, least
        recently used first, until they held `needed` bytes there; whether any was."""
        chosen, freed = [], 0
        with self.lock:
            idle = sorted((p for planned in self.by_owner.values() for p in planned
                           if p.registered.get(task) and not p.running and not p.evicted
                           and p.instance != exclude), key=lambda p: p.used)
            for p in idle:
                if freed >= needed:
                    break
                if not p.gate.acquire(blocking=False):  # set up or released right now
                    continue
                p.evicted = True  # a call from now on waits at the gate, then sets it up
                chosen.append((p, p.clean))
                freed += p.registered[task]
        for p, clean in chosen:
            try:
                p.release(clean)
            finally:
                p.gate.release()
        with self.lock:
            self.evicted += len(chosen)
        if chosen:
            log.info("rdmadev: evicted %d idle instantiation(s) holding %d bytes on %s to make "
                     "room for %d (RDMADEV_MAX_REGISTERED_BYTES)", len(chosen), freed, task,
                     needed)
        return bool(chosen)

    def begin_call(self, owner):
        """Before one eager call of `owner` (an AtomicFunction): its instantiations count as
        running (never evicted meanwhile) until ``end_call(<what this returns>)``, and those
        evicted are set up again first. Raises what setting one up again raised (then the
        call is over: no end_call)."""
        with self.lock:
            planned = list(self.by_owner.get(owner, ()))
            now = next(self.clock)
            for p in planned:
                p.running += 1
                p.used = now
        try:
            for p in planned:
                if p.evicted:
                    self._set_up_again(p)
        except BaseException:
            self.end_call(planned, clean=False)
            raise
        return planned

    def end_call(self, planned, clean=True):
        """After the call begin_call returned `planned` for; `clean`: it ended without an
        error (a failed step may leave a transfer of it in flight)."""
        with self.lock:
            for p in planned:
                p.running -= 1
                p.clean = clean

    @contextlib.contextmanager
    def calling(self, owner):
        """begin_call and end_call around a block."""
        planned = self.begin_call(owner)
        clean = False
        try:
            yield
            clean = True
        finally:
            self.end_call(planned, clean)

    def _set_up_again(self, p):
        with p.gate:
            if not p.evicted:
                return  # another call did it while this one waited
            _, p.registered = p.setup(True)
            p.evicted = False
        with self.lock:
            self.set_up_again += 1

    def watching(self, owner):
        """Whether `owner` has instantiations planned here (the call wrapper's fast path)."""
        return owner in self.by_owner

    def counters(self):
        """``{"planned": instantiations kept, "evicted_now": of them evicted, "evicted":
        evictions so far, "set_up_again": of them set up again}``, in this process."""
        with self.lock:
            planned = [p for ps in self.by_owner.values() for p in ps]
            return {"planned": len(planned), "evicted_now": sum(p.evicted for p in planned),
                    "evicted": self.evicted, "set_up_again": self.set_up_again}


def _needed(transfers, region_bytes):
    """{receiving task: bytes its pairs of `transfers` register there}."""
    regions = {}
    for t in transfers:
        regions.setdefault(t.recv_task, {})[t.region] = region_bytes[t.region]
    return {task: sum(r.values()) for task, r in regions.items()}


_the = Evictions()
open_within_budget = _the.open_within_budget
begin_call = _the.begin_call
end_call = _the.end_call
calling = _the.calling
watching = _the.watching
counters = _the.counters
