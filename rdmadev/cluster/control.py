"""rdmadev's control connections between tasks: small authenticated JSON requests that
set up channels (the receiver allocates its region exactly as planned and hands its
descriptor to the sender). Bytes of tensors never travel here.

Every task serves on the host of its cluster-spec address at port
``tf_port + RDMADEV_CONTROL_PORT_OFFSET`` (or ``tf_port - offset`` when that exceeds 65535).
Both ends prove knowledge of the cluster secret before any request is read, with rdmadev's one
handshake (``_native/core/handshake.h``, the same code the tcp and verbs fabrics run) under its
own tag, so a proof made for a fabric never passes here.

Example:
    >>> client = ControlClient(("127.0.0.1", 12222), secret)
    >>> client.call({"op": "ping"})
"""
import asyncio
import collections
import errno
import json
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

__all__ = ["ControlServer", "ControlClient", "Session", "session", "control_address"]

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
# Authenticated connections, at most: a peer task holds 1 + liveness.LANES (its calls, its
# heartbeats), a coordinator process one, so this serves a job of ~1300 tasks. Every task trusts
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


async def _serve_connection(sock, where, handler, malformed, inline=(), workers=None):
    """Serves the requests of one authenticated control connection (a non-blocking socket)
    until the peer leaves or breaks the protocol: each request (a length-prefixed JSON object
    with a string 'op') is answered with `handler(request)`'s result (``{"ok": true,
    "result"}``) or its error (``{"ok": false, "error": text, "kind": its class name}``);
    anything else is answered with a ProtocolError. Requests whose op is in `inline` are answered on
    the loop itself (they must not block: ping), the others on `workers` (an Executor;
    None: the loop's default), one at a time (a peer waits for each answer). What the
    connection held (Session) is released when it ends. `malformed` (a _LogBudget) logs
    refused requests. Returns when the connection ends: nothing the peer sends makes it raise
    (tests/fuzz/fuzz_control.py fuzzes it)."""
    loop = asyncio.get_running_loop()
    held = Session(where)
    try:
        while True:
            try:
                request = await _recv_async(loop, sock)
            except PeerLostError:
                return
            if not isinstance(request, dict) or not isinstance(request.get("op"), str):
                reply = {"ok": False, "error": "ProtocolError: a control request is a JSON "
                                               "object with a string 'op'",
                         "kind": "ProtocolError"}
                malformed.warning("control: peer %s sent a request that is not an object with "
                                  "an 'op'; refused", where)
            else:
                try:
                    if request["op"] in inline:
                        result = _served_by(handler, held, request)
                    else:
                        result = await loop.run_in_executor(workers, _served_by, handler, held,
                                                            request)
                    reply = {"ok": True, "result": result}
                except Exception as e:  # reported to the caller, who raises it
                    # Past the registered-memory budget, the planner makes room and asks
                    # again (evictions.py): expected, not a fault here.
                    if isinstance(e, RegionError):
                        log.info("control: request %r refused: %s", request["op"], e)
                    else:
                        log.exception("control: request %r failed", request["op"])
                    reply = {"ok": False, "error": f"{type(e).__name__}: {e}",
                             "kind": type(e).__name__}
            await loop.sock_sendall(sock, _frame(reply))
    except (OSError, ProtocolError, ValueError) as e:
        log.info("control: connection from %s ended: %s", where, e)
    finally:
        try:
            await loop.run_in_executor(workers, held.close)  # a release may call other tasks
        except RuntimeError:  # the loop is closing: release here
            held.close()


class ControlServer:
    """Serves `handler(request: dict) -> result` to authenticated peers, on `loop` (an
    EventLoop; one of its own when None): a connection costs a descriptor and a coroutine,
    not a thread (event_loop.py). A handshake runs on one of the loop's workers.

    At most MAX_HANDSHAKING connections are in their handshake (the oldest is dropped for a
    new one) and MAX_CONNECTIONS authenticated; accept() failing for lack of descriptors is
    retried every ACCEPT_BACKOFF_S, logged once per episode. Requests named in `inline`
    (ping) are answered on the loop; the others on its workers.
    """

    #: listen() backlog: a cluster's tasks may all connect at once.
    BACKLOG = 128

    def __init__(self, address, secret, handler, loop=None, inline=("ping",)):
        self.secret = secret
        self.handler = handler
        self.inline = frozenset(inline)
        self.rejected = 0
        self.budgets = {"auth": _LogBudget("failed authentication"),
                        "handshake": _LogBudget("broken or slow handshakes"),
                        "requests": _LogBudget("malformed requests"),
                        "refused": _LogBudget("refused connections")}
        self.dropped = {"handshaking": 0, "connections": 0}  # connections let go, by cap
        self.handshaking = collections.OrderedDict()  # socket -> None, oldest first
        self.connections = 0
        self.served = set()  # the sockets of authenticated connections
        self.starved = False  # the last accept() failed for lack of a resource
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
            if self.starved:
                log.warning("control: accepting connections on %s:%d again",
                            *self.server_address[:2])
            self.starved = False
            self._start(sock, "%s:%d" % peer[:2])

    def _accept_again(self):
        if self.listener.fileno() >= 0:
            self.loop.loop.add_reader(self.listener.fileno(), self._accept)
            self._accept()

    def _start(self, sock, where):
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
        """On a worker: the server side of rdmadev's handshake; whether the peer proved the
        secret (a refusal is counted and logged)."""
        try:
            sock.setblocking(True)
            _core.server_handshake(sock.fileno(), HANDSHAKE_TAG, self.secret, where,
                                   HANDSHAKE_TIMEOUT_S)
            return True
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
        return False

    async def _connection(self, sock, where):
        loop = asyncio.get_running_loop()
        try:
            authenticated = await loop.run_in_executor(self.loop.workers, self._handshake, sock,
                                                       where)
            if not self._admit(sock, authenticated):
                return
            try:
                sock.setblocking(False)
                await _serve_connection(sock, where, self.handler, self.budgets["requests"],
                                        self.inline, self.loop.workers)
            finally:
                self._leave(sock)
        finally:
            sock.close()

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


class ControlClient:
    """A connection to one task's control service; call() is thread-safe."""

    def __init__(self, address, secret, timeout=60.0, name="coordinator"):
        self.address = address
        self.lock = threading.Lock()
        self.timeout = timeout
        self.broken = ""  # why a call failed midway: the connection is closed then
        try:
            self.sock = socket.create_connection(address, timeout=timeout)
        except OSError as e:
            raise PeerLostError(f"cannot reach the rdmadev control service at {address[0]}:{address[1]}: "
                                f"{e.strerror or e}", e.errno or 0, errno_hint(
                                    e.errno, "start every task with `rdmadev serve` (python -m "
                                    "rdmadev.server), which opens it at the task's TF port + "
                                    "RDMADEV_CONTROL_PORT_OFFSET")) from None
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        where = f"the rdmadev control service at {address[0]}:{address[1]}"
        try:
            _core.client_handshake(self.sock.fileno(), HANDSHAKE_TAG, secret, name,
                                   min(timeout, HANDSHAKE_TIMEOUT_S), where)
        except AuthError as e:
            self.sock.close()
            raise AuthError(f"{where} rejected this task's credentials (or failed to prove its own)",
                            e.errno, "set the same RDMADEV_SECRET (or RDMADEV_SECRET_FILE) in every "
                                     "task and the coordinator") from None
        except BaseException:
            self.sock.close()
            raise

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
                if not isinstance(reply, dict) or "ok" not in reply or \
                        (reply["ok"] and "result" not in reply):
                    raise ProtocolError(f"malformed control reply to {request.get('op')}: "
                                        f"{reply!r:.200}")
            except BaseException as e:
                self.broken = _failure(e)
                self.close()
                where = f"{self.address[0]}:{self.address[1]}"
                if isinstance(e, TimeoutError):  # the task may still be serving it: not resent
                    raise DeadlineExceeded(
                        f"task at {where} did not answer {request.get('op')} within "
                        f"{self.timeout:g} s", errno.ETIMEDOUT,
                        "the peer task is stopped or overloaded (see its log); raise "
                        "RDMADEV_DEADLINE_S on a loaded machine") from None
                if isinstance(e, OSError):  # reset or broken pipe
                    raise PeerLostError(f"control connection to {where} failed: {self.broken}",
                                        e.errno or 0, "the peer task died or restarted (see "
                                                      "its log)") from None
                raise
        if not reply.get("ok"):
            refused = ProtocolError(f"task at {self.address[0]}:{self.address[1]} refused "
                                    f"{request.get('op')}: {reply.get('error')}")
            kind = reply.get("kind")
            refused.kind = kind if isinstance(kind, str) else ""
            raise refused
        return reply["result"]

    async def ping(self, sender):
        """One ping from task `sender` on the running event loop (the heartbeats' lanes:
        liveness.py), its answer awaited up to the client's timeout; a failure breaks the
        connection as in call(). The connection is the loop's from then on (non-blocking)."""
        loop = asyncio.get_running_loop()
        try:
            self.sock.setblocking(False)
            await loop.sock_sendall(self.sock, _frame({"op": "ping", "from": sender}))
            reply = await asyncio.wait_for(_recv_async(loop, self.sock), self.timeout)
        except BaseException as e:
            self.broken = _failure(e) or "no answer"
            self.close()
            raise
        if not isinstance(reply, dict) or not reply.get("ok"):
            self.broken = f"malformed answer to ping: {reply!r:.200}"
            self.close()
            raise ProtocolError(f"task at {self.address[0]}:{self.address[1]} answered a ping "
                                f"with {reply!r:.200}")
        return reply["result"]

    def close(self):
        """Closes the connection; a call waiting for its answer in another thread ends."""
        try:
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:  # never connected, or closed already
            pass
        self.sock.close()
