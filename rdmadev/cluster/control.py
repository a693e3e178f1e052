"""rdmadev's control connections between tasks: small authenticated JSON requests that
set up channels (the receiver allocates its region exactly as planned and hands its
descriptor to the sender). Bytes of tensors never travel here.

Two tasks talk on one connection both ways, a Link: each message is a length-prefixed JSON
object, a request ``{"op", "id", ...}`` or a reply ``{"ok", "result" | "error", "kind", "re"}``
answering the request whose id ``re`` names; a task keeps one link per peer task (links.py).

Every task serves on the host of its cluster-spec address at port
``tf_port + RDMADEV_CONTROL_PORT_OFFSET`` (or ``tf_port - offset`` when that exceeds 65535).
Both ends prove knowledge of the cluster secret before any request is read, with rdmadev's one
handshake (``_native/core/handshake.h``, the same code the tcp and verbs fabrics run) under its
own tag, so a proof made for a fabric never passes here.

Example:
    >>> client = ControlClient(("127.0.0.1", 12222), secret)   # one call at a time (tools)
    >>> client.call({"op": "ping"})
    >>> link, _ = dial(("127.0.0.1", 12222), secret, task, handler, loop, 60.0)
    >>> link.call({"op": "ping"}, 60.0)
"""
import asyncio
import collections
import concurrent.futures
import errno
import json
import itertools
import logging
import socket
import struct
import threading
import time

from .. import _core
from ..config import Config
from ..errors import (AuthError, DeadlineExceeded, PeerLostError, ProtocolError, RdmadevError,
                      RegionError, errno_hint)
from .event_loop import EventLoop
from .spec import split_address

__all__ = ["ControlServer", "ControlClient", "Link", "dial", "Session", "session", "control_address"]

log = logging.getLogger(__name__)
log.addHandler(logging.NullHandler())

#: Handshake tag of the control service (see handshake.h: the tag binds a proof to its service).
HANDSHAKE_TAG = "rdmadev-control-v1"
# Largest request or reply: a few descriptors and addresses; anything bigger is hostile.
MAX_MESSAGE_BYTES = 1 << 20
# Seconds a peer may take for the whole handshake (an absolute deadline, not per read) before
# its connection is dropped: the fabrics' kHandshakeSeconds.
HANDSHAKE_TIMEOUT_S = 10.0
# Connections still in their handshake, at most: a legitimate peer is through it in
# milliseconds, so when more arrive the oldest is dropped. A flood of silent sockets then holds
# this many descriptors and threads at most, and cannot keep a real peer out (its connection is
# the newest while it proves the secret).
MAX_HANDSHAKING = 64
# Authenticated connections, at most: a peer task holds one (its link, links.py), a
# coordinator process one, so this serves a job of ~4000 tasks. Every task trusts
# every holder of the cluster secret (docs/faults/security.md, "Trust model"), so this only bounds
# threads and descriptors should a peer misbehave.
MAX_CONNECTIONS = 4096
# Seconds the accept loop waits after accept() failed for lack of descriptors or memory
# (EMFILE, ENFILE, ENOBUFS, ENOMEM): the connection stays queued and is reported again at
# once, so retrying at once would spin a core (the native acceptor's kAcceptBackoffMs).
ACCEPT_BACKOFF_S = 0.1


def control_address(task_address, offset=None):
    """(host, port) of the control service of the task whose TF address is `task_address`."""
    if offset is None:
        offset = Config.from_env().control_port_offset
    host, port = split_address(task_address)
    port = port + offset if port + offset <= 65535 else port - offset
    return host, port


def _frame(obj):
    """`obj` as a control message: its JSON's length (4 bytes, little-endian), then the JSON."""
    data = json.dumps(obj).encode()
    return struct.pack("<I", len(data)) + data


def _send(sock, obj):
    sock.sendall(_frame(obj))


def _closed_by_peer():
    return PeerLostError("control connection closed by the peer",
                         hint="the peer task died or rejected this request (see its log)")


def _recv_exact(sock, n):
    buf = bytearray()
    while len(buf) < n:
        chunk = sock.recv(n - len(buf))
        if not chunk:
            raise _closed_by_peer()
        buf += chunk
    return bytes(buf)


async def _recv_exact_async(loop, sock, n):
    buf = bytearray()
    while len(buf) < n:
        chunk = await loop.sock_recv(sock, n - len(buf))
        if not chunk:
            raise _closed_by_peer()
        buf += chunk
    return bytes(buf)


def _length(prefix):
    """The body length a message's prefix announces, refused past MAX_MESSAGE_BYTES."""
    (n,) = struct.unpack("<I", prefix)
    if n > MAX_MESSAGE_BYTES:
        raise ProtocolError(f"control message of {n} bytes exceeds {MAX_MESSAGE_BYTES}")
    return n


def _decode(data):
    try:
        return json.loads(data)
    except (ValueError, RecursionError) as e:  # not JSON, not UTF-8, or nested too deep
        raise ProtocolError(f"control message of {len(data)} bytes is not valid JSON: "
                            f"{type(e).__name__}: {str(e)[:200]}") from None


def _recv(sock):
    return _decode(_recv_exact(sock, _length(_recv_exact(sock, 4))))


async def _recv_async(loop, sock):
    """_recv on a non-blocking socket, on `loop`."""
    return _decode(await _recv_exact_async(loop, sock, _length(
        await _recv_exact_async(loop, sock, 4))))


#: Lines a peer can cause at will (failed authentication, malformed requests, refused
#: connections), per server and kind: at most LOG_LINES_PER_WINDOW per LOG_WINDOW_S, then one
#: line saying the rest are left out (the same budget as the native LogBudget, common.h).
LOG_LINES_PER_WINDOW = 10
LOG_WINDOW_S = 10.0


class _LogBudget:
    """log.warning within LOG_LINES_PER_WINDOW lines per LOG_WINDOW_S (see there)."""

    def __init__(self, what):
        self.what = what  # "failed authentication"
        self.lock = threading.Lock()
        self.start = float("-inf")
        self.logged = 0
        self.left_out = 0

    def warning(self, msg, *args):
        with self.lock:
            now = time.monotonic()
            was_left_out = 0
            if now - self.start >= LOG_WINDOW_S:
                was_left_out, self.start, self.logged, self.left_out = self.left_out, now, 0, 0
            within = self.logged < LOG_LINES_PER_WINDOW
            if within:
                self.logged += 1
            else:
                self.left_out += 1
            last = within and self.logged == LOG_LINES_PER_WINDOW
        if was_left_out:
            log.warning("control: %s: %d more were left out", self.what, was_left_out)
        if within:
            log.warning(msg, *args)
        if last:
            log.warning("control: %s: %d in %g s; leaving out the rest for now", self.what,
                        LOG_LINES_PER_WINDOW, LOG_WINDOW_S)


class Session:
    """What one authenticated control connection holds for its peer: releases to run when the
    connection ends unless the peer let go first. A peer killed with kill -9 says nothing, but
    the kernel closes its connections, so what it planned here (channels, instantiations of
    the functions it traced) does not outlive it."""

    _live = set()  # every open Session of this process (let_go); close() removes it
    _live_lock = threading.Lock()

    def __init__(self, where):
        self.where = where
        self.held = {}  # key -> release()
        self.lock = threading.Lock()
        with Session._live_lock:
            Session._live.add(self)

    def hold(self, key, release):
        """Runs `release()` when the connection ends, unless let_go(key) came first."""
        with self.lock:
            self.held[key] = release

    def let_go(self, key):
        """Drops `key` from every open session: a peer makes its calls on connections of
        their own (Runtime.call), so its release may come on another connection than the
        request that held the key."""
        with Session._live_lock:
            live = list(Session._live)
        for s in live:
            with s.lock:
                s.held.pop(key, None)

    def close(self):
        with Session._live_lock:
            Session._live.discard(self)
        with self.lock:
            held, self.held = list(self.held.items()), {}
        for key, release in held:
            try:
                release()
            except Exception as e:  # best effort: the others still go
                log.info("control: releasing %s held by %s failed: %s", key, self.where, e)
        if held:
            log.info("control: connection from %s ended holding %d planned thing(s); released",
                     self.where, len(held))


_serving = threading.local()


def session():
    """The Session of the control connection whose request this thread serves, or None (a
    request this process made to itself)."""
    return getattr(_serving, "session", None)


def _served_by(handler, session, request):
    """`handler(request)` with `session` as this thread's session()."""
    _serving.session = session
    try:
        return handler(request)
    finally:
        _serving.session = None


#: TCP keepalive of a link (seconds idle before the first probe, between probes, and probes
#: unanswered before the kernel ends it): heartbeats go by datagram, so a link can idle for a
#: whole training run, and NAT and conntrack tables drop connections idle for 350 s and more
#: (AWS's NAT gateway); a probe a minute keeps them. A peer whose host is gone ends its link
#: (and what it planned here) 60 + 9 x 30 s later, far past the network cuts a step survives.
KEEPALIVE = (60, 30, 9)
#: Requests of one link served at once, at most: a task has as many in flight to one peer as
#: its threads make calls at once (a few), so more is a peer misbehaving; those past it are
#: refused, never queued (a queue would hold a hostile peer's megabytes).
MAX_IN_FLIGHT = 128


class Link:
    """One authenticated control connection, used both ways: it serves the requests its peer
    sends (``handler(request)``; those in `inline` on the loop itself, the others on
    `workers`, several at once) and carries this task's own calls to the peer (``call``,
    from any thread but the loop's; ``ask`` on the loop). Requests carry an ``id`` and
    replies the ``re`` of the request they answer, so calls share the link without waiting
    for each other, and a reply that comes after its call gave up is dropped, not read as
    another's. A task keeps one link to each peer task, whichever dialed it (links.py), so a
    pair of tasks holds one connection, not one per direction and purpose (issue 60).

    What requests on the link held (Session) is released when it ends. Nothing the peer
    sends makes ``serve`` raise (tests/fuzz/fuzz_control.py fuzzes it).

    Args:
        sock: the connected, authenticated socket (made non-blocking here).
        where: the peer, for messages ("host:port" or its task).
        handler: ``(request: dict) -> result``, raising to refuse.
        malformed: the _LogBudget that logs malformed requests.
        inline: ops answered on the loop (they must not block: ping).
        workers: the Executor the other requests run on (None: the loop's default).
        heard: ``()`` called on every message the peer sends (it runs), or None.
    """

    def __init__(self, sock, where, handler, malformed, inline=(), workers=None, heard=None):
        self.sock = sock
        sock.setblocking(False)
        _keep_alive(sock)
        self.where = where
        self.handler = handler
        self.malformed = malformed
        self.inline = inline
        self.workers = workers
        self.heard = heard
        self.loop = None  # the asyncio loop serving it, once serve() runs
        self.lock = threading.Lock()
        self.pending = {}  # request id -> concurrent.futures.Future of its reply
        self.ids = itertools.count(1)
        self.broken = ""  # why it ended; calls fail at once then
        self.sending = asyncio.Lock()  # one message at a time on the socket
        self.ended = concurrent.futures.Future()  # done once serve() has returned
        self.dialed = False  # this task dialed it (links.py)
        self.incarnation = None  # the peer's, as its offer or answer said (links.py)

    async def serve(self):
        """Reads the peer's messages until the connection ends or breaks the protocol; then
        fails the calls waiting on it and releases what its requests held."""
        self.loop = asyncio.get_running_loop()
        held = Session(self.where)
        running = set()  # requests being served on workers
        why = "closed by the peer"
        try:
            while True:
                try:
                    message = await _recv_async(self.loop, self.sock)
                except PeerLostError:
                    break
                if self.heard is not None:
                    self.heard()
                if isinstance(message, dict) and "re" in message and "op" not in message:
                    self._answered(message)
                elif not isinstance(message, dict) or not isinstance(message.get("op"), str):
                    self.malformed.warning("control: peer %s sent a request that is not an "
                                           "object with an 'op'; refused", self.where)
                    await self._send(_refusal("ProtocolError", "a control request is a JSON "
                                              "object with a string 'op'", message))
                elif message["op"] in self.inline:
                    await self._send(self._served(held, message))
                elif len(running) >= MAX_IN_FLIGHT:
                    self.malformed.warning("control: peer %s has %d requests in flight; "
                                           "refused one", self.where, len(running))
                    await self._send(_refusal("ProtocolError", f"{len(running)} requests in "
                                              f"flight on this connection (at most "
                                              f"{MAX_IN_FLIGHT})", message))
                else:
                    served = asyncio.ensure_future(self._serve_on_worker(held, message))
                    running.add(served)
                    served.add_done_callback(running.discard)
        except (OSError, ProtocolError, ValueError) as e:
            why = _failure(e)
            log.info("control: connection with %s ended: %s", self.where, e)
        finally:
            self._end(why)
            if running:  # their replies go nowhere; what they hold is released below
                await asyncio.gather(*running, return_exceptions=True)
            try:
                await self.loop.run_in_executor(self.workers, held.close)  # may call others
            except RuntimeError:  # the loop is closing: release here
                held.close()
            self.sock.close()
            self.ended.set_result(None)

    def _served(self, held, request):
        """The reply to `request`: `handler(request)`'s result or its error."""
        try:
            reply = {"ok": True, "result": _served_by(self.handler, held, request)}
        except Exception as e:  # reported to the caller, who raises it
            # Past the registered-memory budget, the planner makes room and asks again
            # (evictions.py): expected, not a fault here.
            if isinstance(e, RegionError):
                log.info("control: request %r refused: %s", request["op"], e)
            else:
                log.exception("control: request %r failed", request["op"])
            return _refusal(type(e).__name__, str(e), request)
        if "id" in request:
            reply["re"] = request["id"]
        return reply

    async def _serve_on_worker(self, held, request):
        reply = await self.loop.run_in_executor(self.workers, self._served, held, request)
        await self._send(reply)

    async def _send(self, message):
        """Sends `message`; a failure ends the link (the reader then returns)."""
        if self.broken:
            return
        try:
            async with self.sending:
                await self.loop.sock_sendall(self.sock, _frame(message))
        except OSError as e:
            self._end(_failure(e))

    def _answered(self, reply):
        with self.lock:
            future = self.pending.pop(reply["re"], None) if _is_id(reply["re"]) else None
        if future is not None and not future.done():
            future.set_result(reply)  # a reply nobody waits for (its call gave up) is dropped

    def _end(self, why):
        """Marks the link ended for `why`, shuts its socket (the reader returns) and fails
        every call waiting on it (idempotent)."""
        with self.lock:
            if not self.broken:
                self.broken = why or "closed"
            pending, self.pending = list(self.pending.values()), {}
        try:
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        for future in pending:
            if not future.done():
                future.set_exception(self._lost())

    def _lost(self):
        return PeerLostError(f"control connection with {self.where} ended: {self.broken}",
                             hint="the peer task died or restarted (see its log); "
                                  "Runtime.call connects again")

    def _post(self, request):
        """Sends `request` under a new id; returns the Future of its reply."""
        future = concurrent.futures.Future()
        with self.lock:
            if self.broken or self.loop is None:
                raise self._lost() if self.broken else RuntimeError("the link is not served yet")
            ident = next(self.ids)
            self.pending[ident] = future
        asyncio.run_coroutine_threadsafe(self._send({**request, "id": ident}), self.loop)
        return ident, future

    def _forget(self, ident):
        with self.lock:
            self.pending.pop(ident, None)

    def call(self, request, timeout):
        """Sends `request` and returns its result, raising the peer's error; from any thread
        but the loop's. Past `timeout` seconds it raises DeadlineExceeded and the link stays:
        the peer may still be serving the request, whose reply is then dropped."""
        ident, future = self._post(request)
        try:
            reply = future.result(timeout)
        except concurrent.futures.TimeoutError:
            raise _no_answer(self.where, request, timeout) from None
        finally:
            self._forget(ident)
        return _result(reply, f"task at {self.where}", request)

    async def ask(self, request, timeout):
        """call() on the loop serving the link."""
        ident, future = self._post(request)
        try:
            reply = await asyncio.wait_for(asyncio.wrap_future(future), timeout)
        except asyncio.TimeoutError:
            raise _no_answer(self.where, request, timeout) from None
        finally:
            self._forget(ident)
        return _result(reply, f"task at {self.where}", request)

    def close(self):
        """Ends the link: its calls fail, the peer sees it close, what it held is released."""
        self._end("closed by this task")


def _keep_alive(sock):
    """Turns TCP keepalive on for `sock` (KEEPALIVE); a socket that has none is left alone."""
    idle, interval, count = KEEPALIVE
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE, idle)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPINTVL, interval)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPCNT, count)
    except (AttributeError, OSError):  # a socketpair (tests) or a wrapper
        pass


def _no_delay(sock):
    """Turns Nagle's algorithm off on control socket `sock`, dialed or accepted. A link
    carries calls both ways, so a reply and a request often leave back to back; with Nagle
    the second waits for the peer's ACK of the first, which delayed ACKs hold up to 40 ms (a
    channel setup's call to a worker took 45 ms instead of under 1, issue 60)."""
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)


def _is_id(value):
    return type(value) is int  # ids are this task's ints; True == 1 must not answer call 1


def _no_answer(where, request, timeout):
    """The error of a call to the task at `where` that got no answer to `request` within
    `timeout` seconds: the task may still be serving it, so it is not sent again."""
    return DeadlineExceeded(f"task at {where} did not answer {request.get('op')} within "
                            f"{timeout:g} s", errno.ETIMEDOUT,
                            "the peer task is stopped or overloaded (see its log); raise "
                            "RDMADEV_DEADLINE_S on a loaded machine")


def _refusal(kind, error, request):
    """The reply refusing `request` with error `kind: error`."""
    reply = {"ok": False, "error": f"{kind}: {error}", "kind": kind}
    if isinstance(request, dict) and "id" in request:
        reply["re"] = request["id"]
    return reply


def _check_reply(reply, request):
    """Raises ProtocolError unless `reply` is a reply: a result, or an error."""
    if not isinstance(reply, dict) or "ok" not in reply or (reply["ok"] and "result" not in reply):
        raise ProtocolError(f"malformed control reply to {request.get('op')}: {reply!r:.200}")


def _result(reply, who, request):
    """`reply`'s result, or the peer's refusal raised as a ProtocolError whose ``kind`` is
    the class name of the peer's error."""
    _check_reply(reply, request)
    if not reply.get("ok"):
        refused = ProtocolError(f"{who} refused {request.get('op')}: {reply.get('error')}")
        kind = reply.get("kind")
        refused.kind = kind if isinstance(kind, str) else ""
        raise refused
    return reply["result"]


class ControlServer:
    """Serves `handler(request: dict) -> result` to authenticated peers, on `loop` (an
    EventLoop; one of its own when None): a connection costs a descriptor and a coroutine,
    not a thread (event_loop.py). A handshake runs on one of the loop's workers. Each
    connection is a Link: a peer task that sends ``{"op": "link"}`` on it offers it for calls
    back (``on_link(its authenticated name, link)``), so the pair needs no second one.

    At most MAX_HANDSHAKING connections are in their handshake (the oldest is dropped for a
    new one) and MAX_CONNECTIONS authenticated; accept() failing for lack of descriptors is
    retried every ACCEPT_BACKOFF_S, logged once per episode. Requests named in `inline`
    (ping) are answered on the loop; the others on its workers.
    """

    #: listen() backlog: a cluster's tasks may all connect at once.
    BACKLOG = 128

    def __init__(self, address, secret, handler, loop=None, inline=("ping",), on_link=None):
        self.secret = secret
        self.handler = handler
        self.on_link = on_link
        self.inline = frozenset(inline) | {"link"}
        self.rejected = 0
        self.budgets = {"auth": _LogBudget("failed authentication"),
                        "handshake": _LogBudget("broken or slow handshakes"),
                        "requests": _LogBudget("malformed requests"),
                        "refused": _LogBudget("refused connections")}
        self.dropped = {"handshaking": 0, "connections": 0}  # connections let go, by cap
        self.handshaking = collections.OrderedDict()  # socket -> None, oldest first
        self.connections = 0
        self.served = set()  # the sockets of authenticated connections
        self.starved = False  # accept() failed for lack of a resource, and connections still wait
        self.admission = threading.Lock()
        self.own_loop = loop is None
        self.loop = loop or EventLoop(f"control {address[0]}:{address[1]}")
        self.listener = socket.create_server(address, backlog=self.BACKLOG)
        self.listener.setblocking(False)
        self.server_address = self.listener.getsockname()
        self.loop.call(self.loop.loop.add_reader, self.listener.fileno(), self._accept)

    def _accept(self):
        """On the loop: accepts every queued connection and starts its handshake."""
        loop = self.loop.loop
        while True:
            try:
                sock, peer = self.listener.accept()
            except (BlockingIOError, InterruptedError):
                # Starved until every queued connection is taken: one accepted while others
                # still wait may run out of descriptors again (connections closed while queued
                # behind a flood can), and that is the same shortage, logged once.
                if self.starved:
                    log.warning("control: accepting connections on %s:%d again",
                                *self.server_address[:2])
                self.starved = False
                break
            except OSError as e:
                if e.errno not in (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM):
                    log.info("control: accept on %s:%d failed: %s", *self.server_address[:2], e)
                    break
                if not self.starved:
                    log.warning("control: cannot accept connections on %s:%d: %s; retrying "
                                "every %g s. Fix: %s", *self.server_address[:2], e.strerror,
                                ACCEPT_BACKOFF_S, errno_hint(e.errno, "free memory"))
                self.starved = True
                loop.remove_reader(self.listener.fileno())
                loop.call_later(ACCEPT_BACKOFF_S, self._accept_again)
                return
            self._start(sock, "%s:%d" % peer[:2])

    def _accept_again(self):
        if self.listener.fileno() >= 0:
            self.loop.loop.add_reader(self.listener.fileno(), self._accept)
            self._accept()

    def _start(self, sock, where):
        _no_delay(sock)
        with self.admission:
            self.handshaking[sock] = None
            if len(self.handshaking) > MAX_HANDSHAKING:
                oldest, _ = self.handshaking.popitem(last=False)
                self.dropped["handshaking"] += 1
                try:
                    oldest.shutdown(socket.SHUT_RDWR)  # its handshake fails; its worker is free
                except OSError:
                    pass
        self.loop.submit(self._connection(sock, where))

    def _handshake(self, sock, where):
        """On a worker: the server side of rdmadev's handshake; the name the peer proved the
        secret under, or None (a refusal is counted and logged)."""
        try:
            sock.setblocking(True)
            return _core.server_handshake(sock.fileno(), HANDSHAKE_TAG, self.secret, where,
                                          HANDSHAKE_TIMEOUT_S)
        except AuthError:
            self.rejected += 1
            self.budgets["auth"].warning("control: peer %s failed authentication (wrong "
                                         "cluster secret)", where)
        except (ProtocolError, DeadlineExceeded) as e:  # not rdmadev's handshake, or too slow
            self.rejected += 1
            self.budgets["handshake"].warning("control: refused %s before authentication: %s",
                                              where, e)
        except RdmadevError as e:  # it closed the connection before or during its handshake
            log.info("control: handshake with %s failed: %s", where, e)
        except OSError as e:  # shut down while it waited (dropped, or the server closed)
            log.info("control: handshake with %s failed: %s", where, e)
        return None

    async def _connection(self, sock, where):
        loop = asyncio.get_running_loop()
        try:
            name = await loop.run_in_executor(self.loop.workers, self._handshake, sock, where)
            if not self._admit(sock, name is not None):
                return
            try:
                link = Link(sock, where, None, self.budgets["requests"], self.inline,
                            self.loop.workers)
                link.handler = lambda request: self._handle(name, link, request)
                await link.serve()
            finally:
                self._leave(sock)
        finally:
            sock.close()

    def _handle(self, name, link, request):
        """A request on `link` from the peer authenticated as `name`: ``link`` offers the
        connection for calls back (on_link), the rest go to the handler."""
        if request["op"] == "link":  # without on_link: served, and nobody is called back
            return {"kept": True} if self.on_link is None else self.on_link(name, link, request)
        return self.handler(request)

    def _admit(self, sock, authenticated):
        """Ends `sock`'s handshake and says whether to serve it: it passed, was not dropped
        for a newer connection meanwhile, and fewer than MAX_CONNECTIONS are served (a True
        is followed by _leave() once the connection ends)."""
        with self.admission:
            if sock not in self.handshaking:
                return False  # dropped for a newer connection: its socket is shut down
            del self.handshaking[sock]
            if not authenticated:
                return False
            if self.connections >= MAX_CONNECTIONS:
                self.dropped["connections"] += 1
                self.budgets["refused"].warning("control: refused a connection from an "
                                                "authenticated peer: %d connections are open",
                                                self.connections)
                return False
            self.connections += 1
            self.served.add(sock)
            return True

    def _leave(self, sock):
        with self.admission:
            self.connections -= 1
            self.served.discard(sock)

    def close(self):
        """Stops accepting and ends every connection (what each held is released)."""
        def stop_listening():
            self.loop.loop.remove_reader(self.listener.fileno())
            self.listener.close()
        if self.listener.fileno() >= 0:
            self.loop.call(stop_listening)
        with self.admission:
            socks = list(self.handshaking) + list(self.served)
        for sock in socks:
            try:
                sock.shutdown(socket.SHUT_RDWR)  # its coroutine (or handshake) ends
            except OSError:
                pass
        if self.own_loop:
            self.loop.close()


def _failure(e):
    """What exception `e` says, for a message."""
    return (e.strerror if isinstance(e, OSError) and e.strerror else str(e)) or type(e).__name__


def _connected(address, secret, name, timeout):
    """A socket connected to the control service at `address` and through its handshake as
    `name` (connect and handshake each bounded by `timeout` seconds)."""
    try:
        sock = socket.create_connection(address, timeout=timeout)
    except OSError as e:
        raise PeerLostError(f"cannot reach the rdmadev control service at {address[0]}:{address[1]}: "
                            f"{e.strerror or e}", e.errno or 0, errno_hint(
                                e.errno, "start every task with `rdmadev serve` (python -m "
                                "rdmadev.server), which opens it at the task's TF port + "
                                "RDMADEV_CONTROL_PORT_OFFSET")) from None
    _no_delay(sock)
    where = f"the rdmadev control service at {address[0]}:{address[1]}"
    try:
        _core.client_handshake(sock.fileno(), HANDSHAKE_TAG, secret, name,
                               min(timeout, HANDSHAKE_TIMEOUT_S), where)
    except AuthError as e:
        sock.close()
        raise AuthError(f"{where} rejected this task's credentials (or failed to prove its own)",
                        e.errno, "set the same RDMADEV_SECRET (or RDMADEV_SECRET_FILE) in every "
                                 "task and the coordinator") from None
    except BaseException:
        sock.close()
        raise
    return sock


def dial(address, secret, name, handler, loop, timeout, offer=None, where=None):
    """A Link to the control service at `address`, authenticated as task `name` and offered
    to it for calls back (``{"op": "link", **offer}``), and the peer's answer to the offer;
    the peer's requests are served with `handler` on `loop` (an EventLoop), ping inline."""
    sock = _connected(address, secret, name, timeout)
    link = Link(sock, where or "%s:%d" % tuple(address[:2]), handler,
                _LogBudget("malformed requests"), frozenset({"ping"}), loop.workers)
    link.loop = loop.loop
    loop.submit(link.serve())
    try:
        return link, link.call({"op": "link", **(offer or {})}, timeout)
    except BaseException:
        link.close()
        raise


class ControlClient:
    """A connection to one task's control service for one call at a time (the coordinator's
    tools, doctor); call() is thread-safe. Tasks call each other on Links (dial)."""

    def __init__(self, address, secret, timeout=60.0, name="coordinator"):
        self.address = address
        self.lock = threading.Lock()
        self.timeout = timeout
        self.broken = ""  # why a call failed midway: the connection is closed then
        self.sock = _connected(address, secret, name, timeout)

    def call(self, request):
        """Sends one request and returns its result, raising the peer's error. A call that
        fails midway (timed out, reset, a malformed answer) closes the connection: its answer
        may still come, and the next call must not read it as its own."""
        with self.lock:
            if self.broken:
                raise PeerLostError(f"control connection to {self.address[0]}:{self.address[1]} "
                                    f"was closed after an earlier call failed: {self.broken}",
                                    hint="connect again (Runtime.call does)")
            try:
                _send(self.sock, request)
                reply = _recv(self.sock)
                _check_reply(reply, request)
            except BaseException as e:
                self.broken = _failure(e)
                self.close()
                where = f"{self.address[0]}:{self.address[1]}"
                if isinstance(e, TimeoutError):
                    raise _no_answer(where, request, self.timeout) from None
                if isinstance(e, OSError):  # reset or broken pipe
                    raise PeerLostError(f"control connection to {where} failed: {self.broken}",
                                        e.errno or 0, "the peer task died or restarted (see "
                                                      "its log)") from None
                raise
        return _result(reply, f"task at {self.address[0]}:{self.address[1]}", request)

    def close(self):
        """Closes the connection; a call waiting for its answer in another thread ends."""
        try:
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:  # never connected, or closed already
            pass
        self.sock.close()
