"""Heartbeats: a task's watch over the peer tasks it has channels with.

Waits notice a peer that is *gone* at once: its process exited or its connection closed, and
the fabric sees it (shm: a pidfd; tcp: the socket; verbs: the side channel). A peer that is
*silent* is not gone: stopped (SIGSTOP, a debugger), starved, or cut off by the network, it
keeps its connections, and its waits would end only at RDMADEV_DEADLINE_S. So a task pings
the control service of every peer it has an endpoint to, every ``RDMADEV_LIVENESS_S /
PINGS_PER_LIVENESS`` seconds on LANES connection(s), each by a coroutine of the task's event
loop (a silent peer never delays the others' pings, and a task runs no thread per peer:
event_loop.py). A peer is heard by its answers and by its own pings (``heard_from``): both
tasks of a pair ping each other, so each hears the other on two connections, and a segment
lost on a lossy link stalls only one of them.
A peer that was heard on neither for RDMADEV_LIVENESS_S is marked silent on each of its endpoints
(``Endpoint.set_silent``), logged at WARNING and listed in the counters' ``silent_peers``.
Waits on it go on, as TF's own waits on a task do: a stopped or cut-off task that comes back
finishes its step, on gRPC as here, and ClusterCoordinator must not take a stalled worker
for a lost ps (the ps's wait on it would fail, and TF reads every error that comes through
the ps as the ps's). A wait that reaches RDMADEV_DEADLINE_S quotes the mark. Once the peer
answers again it is marked heard.

A peer is found silent between RDMADEV_LIVENESS_S and RDMADEV_LIVENESS_S + 2 x the ping
interval after its last answer (one interval for the answer it missed, one for the check).

Example:
    >>> beats = Heartbeats(10.0, table.peer_endpoints, connect, "/job:ps/replica:0/task:0")
    >>> beats.silent()
    []
"""
import asyncio
import logging
import threading
import time

from ..errors import ClosedError, errno_hint
from .event_loop import EventLoop

__all__ = ["Heartbeats", "LANES", "PINGS_PER_LIVENESS"]

#: Pings a peer gets per liveness period on each lane: it is found silent only after missing
#: about this many in a row, so one slow answer on a loaded host is not a failure.
PINGS_PER_LIVENESS = 4
#: Connections a task pings each peer on. TCP retransmits a lost segment after 0.2, 0.6, 1.4,
#: 3.0 s ..., and a ping waiting for its retransmission holds the connection's next pings
#: behind it, so on a lossy link one connection goes quiet for seconds while the peer is
#: running; another connection's pings are exchanges of their own. Measured on a veth pair
#: dropping 20 % of the packets both ways (pings every 0.1 s for 240 s, 2026-11-28): answers
#: more than 2 s apart 8 and 9 times on one connection, 4 times across two, the longest gap
#: 12-15 s on one and 5 s across two. The second connection is the peer's own lane to this
#: task, whose pings count as hearing it (heard_from): two lanes a task would double every
#: pair's connections (issue 60). A task serves 1 + LANES control connections of each peer
#: (control.MAX_CONNECTIONS).
LANES = 1

log = logging.getLogger(__name__)
log.addHandler(logging.NullHandler())


class _Lane:
    """One connection a peer is pinged on, by a coroutine on the heartbeats' loop, every
    interval after `delay`."""

    def __init__(self, peer, delay):
        self.peer = peer
        self.client = None
        self.local_failure = ""  # why its last ping failed here, when this task is to blame
        self.future = peer.beats.loop.submit(self._ping(delay))

    async def _ping(self, delay):
        peer, beats = self.peer, self.peer.beats
        try:
            await asyncio.sleep(delay)
            while True:
                started = time.monotonic()
                try:
                    if self.client is None:
                        self.client = await _connect(beats.loop.workers, beats.connect,
                                                     peer.task, beats.liveness_s)
                    await self.client.ping(beats.task)
                    peer.heard = max(peer.heard, time.monotonic())
                    self.local_failure = ""
                except Exception as e:  # no answer: silence is judged by the watch, not here
                    hint = errno_hint(getattr(e, "errno", 0))  # e.g. out of descriptors
                    self.local_failure = f"{e}" if hint else ""
                    self.drop_client()
                await asyncio.sleep(max(0.0, beats.interval - (time.monotonic() - started)))
        finally:
            self.drop_client()

    def stop(self):
        """Ends its pings (the connection closes on the loop)."""
        self.future.cancel()

    def drop_client(self):
        client, self.client = self.client, None
        if client is not None:
            client.close()


async def _connect(workers, connect, task, timeout):
    """`connect(task, timeout)` (blocking: the handshake) on one of `workers`; a connection
    made after its lane was stopped is closed."""
    made = asyncio.get_running_loop().run_in_executor(workers, connect, task, timeout)
    try:
        return await asyncio.shield(made)
    except asyncio.CancelledError:
        made.add_done_callback(lambda f: f.cancelled() or f.exception() or f.result().close())
        raise


class _Peer:
    """One peer task's lanes and whether it is marked silent."""

    def __init__(self, task, beats):
        self.task = task
        self.beats = beats
        self.heard = time.monotonic()  # its last answer or ping (or when the watch began)
        self.silent_since = None  # time.monotonic() of the mark, None while it answers
        self.lanes = [_Lane(self, i * beats.interval / LANES) for i in range(LANES)]

    def stop(self):
        for lane in self.lanes:
            lane.stop()


class Heartbeats:
    """Pings every peer task this task has endpoints to; marks silent and heard (see module).
    Its pings and its watch run on `loop` (the task's EventLoop; one of its own when None).

    Args:
        liveness_s: seconds without an answer before a peer is silent (RDMADEV_LIVENESS_S).
        endpoints_of: ``() -> {peer task: [Endpoint]}``, the endpoints to mark
            (``ChannelTable.peer_endpoints``); a peer leaves the watch when it leaves this.
        connect: ``(task, timeout) -> ControlClient`` to that task's control service.
        task: this task's name, for log lines.
    """

    def __init__(self, liveness_s, endpoints_of, connect, task, loop=None):
        self.liveness_s = liveness_s
        self.interval = liveness_s / PINGS_PER_LIVENESS
        self.endpoints_of = endpoints_of
        self.connect = connect
        self.task = task
        self.peers = {}  # task -> _Peer
        self.lock = threading.Lock()
        self.own_loop = loop is None
        self.loop = loop or EventLoop(f"heartbeats {task}")
        self.watch = self.loop.submit(self._watch())

    def heard_from(self, task):
        """`task` pinged this task (the ``ping`` control request): it runs."""
        with self.lock:
            peer = self.peers.get(task)
        if peer is not None:
            peer.heard = max(peer.heard, time.monotonic())

    def silent(self):
        """The peer tasks marked silent now."""
        with self.lock:
            return sorted(t for t, p in self.peers.items() if p.silent_since is not None)

    async def _watch(self):
        loop = asyncio.get_running_loop()
        last = time.monotonic()
        while True:
            await asyncio.sleep(self.interval)
            now = time.monotonic()
            paused = now - last > self.liveness_s  # this process was stopped or starved
            last = now
            try:  # on a worker: the endpoints are read under the channel table's lock
                await loop.run_in_executor(self.loop.workers,
                                           lambda: self._judge(self.endpoints_of(), now, paused))
            except Exception as e:  # never let the watch die
                log.info("rdmadev: heartbeat watch of %s failed: %s", self.task, e)

    def _judge(self, endpoints, now, paused):
        with self.lock:
            for task in endpoints.keys() - self.peers.keys():
                self.peers[task] = _Peer(task, self)
            for task in self.peers.keys() - endpoints.keys():
                self.peers.pop(task).stop()
            peers = list(self.peers.values())
        for p in peers:
            if paused:  # our own pause is not the peers' silence
                p.heard = max(p.heard, now - self.interval)
            quiet = now - p.heard
            if quiet > self.liveness_s:
                local = next((l.local_failure for l in p.lanes if l.local_failure), "")
                cause = (f"this task could not ping it: {local}" if local else
                         f"stopped, overloaded or cut off; RDMADEV_LIVENESS_S={self.liveness_s:g}")
                if p.silent_since is None:
                    p.silent_since = now
                    log.warning("rdmadev: task %s has not answered heartbeats for %.1f s (%s): "
                                "waits on it go on until it answers or RDMADEV_DEADLINE_S",
                                p.task, quiet, cause)
                since = time.strftime("%H:%M:%S", time.gmtime(time.time() - quiet))
                why = (f"silent: no answer to rdmadev heartbeats since {since} UTC" +
                       (f": {cause}" if local else f" ({cause})"))
                _mark(endpoints[p.task], why, only_unmarked=True)  # and those made since
            elif p.silent_since is not None:
                log.warning("rdmadev: task %s answers again after %.1f s", p.task,
                            now - p.silent_since)
                p.silent_since = None
                _mark(endpoints[p.task], "")

    def connections(self):
        """The ping connections open now: one per lane that reached its peer (LANES per
        watched peer, once they all have)."""
        with self.lock:
            peers = list(self.peers.values())
        return sum(lane.client is not None for p in peers for lane in p.lanes)

    def close(self):
        """Stops every ping and the watch (endpoints keep their marks: they close next)."""
        self.watch.cancel()
        with self.lock:
            peers, self.peers = list(self.peers.values()), {}
        for p in peers:
            p.stop()
        if self.own_loop:
            self.loop.close()


def _mark(endpoints, why, only_unmarked=False):
    """Marks `endpoints` silent for `why` ("" clears the mark). One the channel table closed
    since it handed them over (a broken connection: channels.py) is skipped: it has left the
    watch by the next round, and the others still get their mark."""
    for ep in endpoints:
        try:
            if not (only_unmarked and ep.silent):
                ep.set_silent(why)
        except ClosedError:
            pass
