"""Heartbeats: a task's watch over the peer tasks it has channels with.

Waits notice a peer that is *gone* at once: its process exited or its connection closed, and
the fabric sees it (shm: a pidfd; tcp: the socket; verbs: the side channel). A peer that is
*silent* is not gone: stopped (SIGSTOP, a debugger), starved, or cut off by the network, it
keeps its connections, and its waits would end only at RDMADEV_DEADLINE_S. So a task pings
every peer it has an endpoint to, every ``RDMADEV_LIVENESS_S / PINGS_PER_LIVENESS`` seconds,
by datagram: one UDP socket per task, at its control service's address and port, whatever the
number of peers, served by the task's event loop (event_loop.py). A ping carries a fresh
nonce and the answer echoes it, both under an HMAC of the cluster secret, so only an answer to
one of this task's own recent pings counts: a replayed or forged datagram hears nobody.

Datagrams have no head-of-line blocking: a lost one delays nothing after it, where a ping on
a TCP connection waits for the retransmission of a lost segment (0.2, 0.6, 1.4, 3.0 s ...)
and holds the next pings behind it (measured on a veth pair dropping 20 % of the packets,
2026-11-28: answers more than 2 s apart 8-9 times in 240 s on one connection, the longest gap
12-15 s). A peer whose datagram answers stop for two intervals (UDP filtered between the
hosts, or its socket could not bind) is also pinged on the control link to it (links.py), as
long as that goes on; every message a peer sends on its link counts as hearing it too.

A peer heard by none of these for RDMADEV_LIVENESS_S is marked silent on each of its endpoints
(``Endpoint.set_silent``), logged at WARNING and listed in the counters' ``silent_peers``.
Waits on it go on, as TF's own waits on a task do: a stopped or cut-off task that comes back
finishes its step, on gRPC as here, and ClusterCoordinator must not take a stalled worker
for a lost ps (the ps's wait on it would fail, and TF reads every error that comes through
the ps as the ps's). A wait that reaches RDMADEV_DEADLINE_S quotes the mark. Once the peer
answers again it is marked heard.

A peer is found silent between RDMADEV_LIVENESS_S and RDMADEV_LIVENESS_S + 2 x the ping
interval after its last answer (one interval for the answer it missed, one for the check).

Example:
    >>> beats = Heartbeats(10.0, table.peer_endpoints, task, secret, listener, address_of,
    ...                    ping_on_link, loop)
    >>> beats.silent()
    []
"""
import asyncio
import collections
import hashlib
import hmac
import logging
import os
import socket
import struct
import threading
import time

from ..errors import ClosedError, errno_hint
from .event_loop import EventLoop

__all__ = ["Heartbeats", "PINGS_PER_LIVENESS"]

#: Pings a peer gets per liveness period: it is found silent only after missing about this
#: many in a row, so a few lost datagrams or one slow answer on a loaded host are not a
#: failure (at 20 % loss each way a ping and its answer both pass 64 % of the time: all of
#: 8 lost is 3e-4).
PINGS_PER_LIVENESS = 8
#: Binds a heartbeat's HMAC key to this service: a proof made for another never passes here.
KEY_TAG = b"rdmadev-heartbeat-v1"
#: What every heartbeat datagram starts with; then the kind (PING or ANSWER).
MAGIC = b"RDHB1"
PING, ANSWER = b"p", b"a"
NONCE_BYTES = 16
#: Largest datagram read: two task names and a MAC fit many times over; anything larger is
#: not a heartbeat.
MAX_DATAGRAM = 1024
_NAMES = struct.Struct("!HH")
_MAC_BYTES = hashlib.sha256().digest_size

log = logging.getLogger(__name__)
log.addHandler(logging.NullHandler())


class _Peer:
    """What the watch knows of one peer task."""

    def __init__(self, task, address):
        self.task = task
        self.address = address  # its heartbeat socket's address (sendto), None if unresolved
        self.heard = time.monotonic()  # its last answer or message (or when the watch began)
        self.answered = None  # time.monotonic() of its last datagram answer
        self.silent_since = None  # time.monotonic() of the mark, None while it answers
        self.nonces = collections.deque(maxlen=PINGS_PER_LIVENESS)  # of its pings in flight
        self.on_link = None  # the asyncio task pinging it on its link, while one runs
        self.local_failure = ""  # why its last ping failed here, when this task is to blame


class Heartbeats:
    """Pings every peer task this task has endpoints to; marks silent and heard (see module).
    Runs on `loop` (the task's EventLoop; one of its own when None).

    Args:
        liveness_s: seconds without an answer before a peer is silent (RDMADEV_LIVENESS_S).
        endpoints_of: ``() -> {peer task: [Endpoint]}``, the endpoints to mark
            (``ChannelTable.peer_endpoints``); a peer leaves the watch when it leaves this.
        task: this task's name, as its datagrams say it.
        secret: the cluster secret (bytes).
        listener: the control service's listening socket: datagrams use its address.
        address_of: ``task -> (host, port)`` of that task's control service.
        ping_on_link: ``async (task, timeout) -> result``, a ping on the link to that task.
    """

    def __init__(self, liveness_s, endpoints_of, task, secret, listener, address_of,
                 ping_on_link, loop=None):
        self.liveness_s = liveness_s
        self.interval = liveness_s / PINGS_PER_LIVENESS
        self.endpoints_of = endpoints_of
        self.task = task
        self.name = task.encode()
        self.key = hmac.new(secret, KEY_TAG, hashlib.sha256).digest()
        self.address_of = address_of
        self.ping_on_link = ping_on_link
        self.peers = {}  # task -> _Peer
        self.refused = 0  # datagrams that were not a heartbeat of this cluster for this task
        self.lock = threading.Lock()
        self.own_loop = loop is None
        self.loop = loop or EventLoop(f"heartbeats {task}")
        self.sock = self._bind(listener)
        if self.sock is not None:
            self.loop.call(self.loop.loop.add_reader, self.sock.fileno(), self._readable)
        self.watch = self.loop.submit(self._watch())

    def _bind(self, listener):
        """A UDP socket at the control service's address, or None (logged: peers then ping
        this task on its links)."""
        sock = socket.socket(listener.family, socket.SOCK_DGRAM)
        try:
            sock.bind(listener.getsockname()[:2])
        except OSError as e:
            sock.close()
            log.warning("rdmadev: %s cannot answer heartbeats by datagram at %s: %s; its peers "
                        "ping it on its control links instead", self.task,
                        listener.getsockname()[:2], e.strerror or e)
            return None
        sock.setblocking(False)
        return sock

    def heard_from(self, task):
        """`task` sent a message on its link to this task: it runs."""
        with self.lock:
            peer = self.peers.get(task)
        if peer is not None:
            peer.heard = max(peer.heard, time.monotonic())

    def silent(self):
        """The peer tasks marked silent now."""
        with self.lock:
            return sorted(t for t, p in self.peers.items() if p.silent_since is not None)

    def heard_by_datagram(self):
        """Peers whose datagram answers came within the last liveness period."""
        now = time.monotonic()
        with self.lock:
            return sum(p.answered is not None and now - p.answered <= self.liveness_s
                       for p in self.peers.values())

    def _datagram(self, kind, nonce, to):
        body = MAGIC + kind + nonce + _NAMES.pack(len(self.name), len(to)) + self.name + to
        return body + hmac.new(self.key, body, hashlib.sha256).digest()

    def _parse(self, data):
        """(kind, nonce, sender) of a heartbeat datagram addressed to this task, or None."""
        head = len(MAGIC) + 1 + NONCE_BYTES
        if len(data) < head + _NAMES.size + _MAC_BYTES or not data.startswith(MAGIC):
            return None
        body, mac = data[:-_MAC_BYTES], data[-_MAC_BYTES:]
        if not hmac.compare_digest(mac, hmac.new(self.key, body, hashlib.sha256).digest()):
            return None
        sender_n, to_n = _NAMES.unpack_from(body, head)
        names = body[head + _NAMES.size:]
        if len(names) != sender_n + to_n or names[sender_n:] != self.name:
            return None
        return body[len(MAGIC):len(MAGIC) + 1], body[len(MAGIC) + 1:head], names[:sender_n]

    def _readable(self):
        """On the loop: answers the pings that came, and hears the peers that answered."""
        while True:
            try:
                data, source = self.sock.recvfrom(MAX_DATAGRAM)
            except (BlockingIOError, InterruptedError):
                return
            except OSError:  # e.g. ECONNREFUSED reported for an earlier sendto
                continue
            parsed = self._parse(data)
            if parsed is None:
                self.refused += 1
                continue
            kind, nonce, sender = parsed
            if kind == PING:
                self._send(self._datagram(ANSWER, nonce, sender), source)
            elif kind == ANSWER:
                with self.lock:
                    peer = self.peers.get(sender.decode(errors="replace"))
                if peer is not None and nonce in peer.nonces:
                    peer.nonces.remove(nonce)
                    peer.heard = peer.answered = time.monotonic()
                    peer.local_failure = ""

    def _send(self, datagram, address):
        try:
            self.sock.sendto(datagram, address)
            return ""
        except (BlockingIOError, InterruptedError):  # a full send buffer: as good as lost
            return ""
        except OSError as e:
            return f"{e.strerror or e}" if errno_hint(e.errno) else ""

    def _ping(self, peer, now):
        """On the loop: one ping of `peer` by datagram, and on its link when its datagram
        answers stopped for two intervals."""
        if self.sock is not None and peer.address is not None:
            nonce = os.urandom(NONCE_BYTES)
            peer.nonces.append(nonce)
            peer.local_failure = self._send(
                self._datagram(PING, nonce, peer.task.encode()), peer.address)
        by_datagram = peer.answered is not None and now - peer.answered <= 2 * self.interval
        if not by_datagram and peer.on_link is None:
            peer.on_link = asyncio.ensure_future(self._ping_on_link(peer))

    async def _ping_on_link(self, peer):
        try:
            await self.ping_on_link(peer.task, self.liveness_s)
            peer.heard = max(peer.heard, time.monotonic())
        except asyncio.CancelledError:
            raise
        except Exception as e:  # no answer: silence is judged by the watch, not here
            hint = errno_hint(getattr(e, "errno", 0))  # e.g. out of descriptors
            if hint:
                peer.local_failure = f"{e}"
        finally:
            peer.on_link = None

    async def _watch(self):
        loop = asyncio.get_running_loop()
        last = time.monotonic()
        while True:
            await asyncio.sleep(self.interval)
            now = time.monotonic()
            paused = now - last > self.liveness_s  # this process was stopped or starved
            last = now
            try:  # on a worker: the endpoints are read under the channel table's lock
                peers = await loop.run_in_executor(
                    self.loop.workers, lambda: self._judge(self.endpoints_of(), now, paused))
                for peer in peers:
                    self._ping(peer, now)
            except Exception as e:  # never let the watch die
                log.info("rdmadev: heartbeat watch of %s failed: %s", self.task, e)

    def _resolve(self, task):
        """The sendto address of `task`'s heartbeat socket, or None (resolved again next
        round)."""
        host, port = self.address_of(task)
        try:
            return socket.getaddrinfo(host, port, self.sock.family if self.sock else 0,
                                      socket.SOCK_DGRAM)[0][4]
        except (OSError, IndexError):
            return None

    def _judge(self, endpoints, now, paused):
        """On a worker: the watched peers follow `endpoints`; each is marked silent or heard.
        Returns the peers to ping."""
        for task in endpoints.keys() - self.peers.keys():
            peer = _Peer(task, self._resolve(task))
            with self.lock:
                self.peers[task] = peer
        with self.lock:
            gone = [self.peers.pop(t) for t in self.peers.keys() - endpoints.keys()]
            peers = list(self.peers.values())
        for p in gone:
            if p.on_link is not None:
                self.loop.loop.call_soon_threadsafe(p.on_link.cancel)
        for p in peers:
            if p.address is None:
                p.address = self._resolve(p.task)
            if paused:  # our own pause is not the peers' silence
                p.heard = max(p.heard, now - self.interval)
            quiet = now - p.heard
            if quiet > self.liveness_s:
                local = p.local_failure
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
        return peers

    def close(self):
        """Stops every ping and the watch (endpoints keep their marks: they close next)."""
        self.watch.cancel()

        def stop():
            if self.sock is not None:
                self.loop.loop.remove_reader(self.sock.fileno())
            with self.lock:
                peers, self.peers = list(self.peers.values()), {}
            for p in peers:
                if p.on_link is not None:
                    p.on_link.cancel()
        if self.loop.thread.is_alive():
            self.loop.call(stop)
        if self.sock is not None:
            self.sock.close()
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
