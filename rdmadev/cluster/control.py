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
import collections
import errno
import json
import logging
import socket
import socketserver
import struct
import threading
import time

from .. import _core
from ..config import Config
from ..errors import (AuthError, DeadlineExceeded, PeerLostError, ProtocolError, RdmadevError,
                      errno_hint)
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


def _send(sock, obj):
    data = json.dumps(obj).encode()
    sock.sendall(struct.pack("<I", len(data)) + data)


def _recv_exact(sock, n):
    buf = bytearray()
    while len(buf) < n:
        chunk = sock.recv(n - len(buf))
        if not chunk:
            raise PeerLostError("control connection closed by the peer",
                                hint="the peer task died or rejected this request (see its log)")
        buf += chunk
    return bytes(buf)


def _recv(sock):
    (n,) = struct.unpack("<I", _recv_exact(sock, 4))
    if n > MAX_MESSAGE_BYTES:
        raise ProtocolError(f"control message of {n} bytes exceeds {MAX_MESSAGE_BYTES}")
    data = _recv_exact(sock, n)
    try:
        return json.loads(data)
    except (ValueError, RecursionError) as e:  # not JSON, not UTF-8, or nested too deep
        raise ProtocolError(f"control message of {n} bytes is not valid JSON: "
                            f"{type(e).__name__}: {str(e)[:200]}") from None


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


class _Handler(socketserver.BaseRequestHandler):
    def handle(self):
        server = self.server
        sock = self.request
        where = "%s:%d" % self.client_address[:2]
        authenticated = False
        try:
            _core.server_handshake(sock.fileno(), HANDSHAKE_TAG, server.secret, where,
                                   HANDSHAKE_TIMEOUT_S)
            authenticated = True
        except AuthError:
            server.rejected += 1
            server.budgets["auth"].warning("control: peer %s failed authentication (wrong "
                                           "cluster secret)", where)
        except (ProtocolError, DeadlineExceeded) as e:  # not rdmadev's handshake, or too slow
            server.rejected += 1
            server.budgets["handshake"].warning("control: refused %s before authentication: %s",
                                                where, e)
        except RdmadevError as e:  # it closed the connection before or during its handshake
            log.info("control: handshake with %s failed: %s", where, e)
        if not server.admit(sock, authenticated):
            return
        try:
            _serve_connection(sock, where, server.handler, server.budgets["requests"])
        finally:
            server.leave()


def _serve_connection(sock, where, handler, malformed):
    """Serves the requests of one authenticated control connection until the peer leaves or
    breaks the protocol: each request (a length-prefixed JSON object with a string 'op') is
    answered with `handler(request)`'s result or its error; anything else is answered with a
    ProtocolError. What the connection held (Session) is released when it ends. `malformed`
    (a _LogBudget) logs refused requests. Returns when the connection ends: nothing the peer
    sends makes it raise (tests/fuzz/fuzz_control.py fuzzes it)."""
    _serving.session = Session(where)  # one thread per connection
    try:
        while True:
            try:
                request = _recv(sock)
            except PeerLostError:
                return
            if not isinstance(request, dict) or not isinstance(request.get("op"), str):
                reply = {"ok": False, "error": "ProtocolError: a control request is a JSON "
                                               "object with a string 'op'"}
                malformed.warning("control: peer %s sent a request that is not an object with "
                                  "an 'op'; refused", where)
            else:
                try:
                    reply = {"ok": True, "result": handler(request)}
                except Exception as e:  # reported to the caller, who raises it
                    log.exception("control: request %r failed", request["op"])
                    reply = {"ok": False, "error": f"{type(e).__name__}: {e}"}
            _send(sock, reply)
    except (OSError, ProtocolError, ValueError) as e:
        log.info("control: connection from %s ended: %s", where, e)
    finally:
        held, _serving.session = _serving.session, None
        held.close()


class ControlServer(socketserver.ThreadingTCPServer):
    """Serves `handler(request: dict) -> result` to authenticated peers, one thread each.

    At most MAX_HANDSHAKING connections are in their handshake (the oldest is dropped for a
    new one) and MAX_CONNECTIONS authenticated; accept() failing for lack of descriptors is
    retried every ACCEPT_BACKOFF_S, logged once per episode.
    """

    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 128  # listen() backlog: a cluster's tasks may all connect at once

    def __init__(self, address, secret, handler):
        self.secret = secret
        self.handler = handler
        self.rejected = 0
        self.budgets = {"auth": _LogBudget("failed authentication"),
                        "handshake": _LogBudget("broken or slow handshakes"),
                        "requests": _LogBudget("malformed requests"),
                        "refused": _LogBudget("refused connections")}
        self.dropped = {"handshaking": 0, "connections": 0}  # connections let go, by cap
        self.handshaking = collections.OrderedDict()  # socket -> None, oldest first
        self.connections = 0
        self.starved = False  # the last accept() failed for lack of a resource
        self.admission = threading.Lock()
        super().__init__(address, _Handler)
        self.thread = threading.Thread(target=self.serve_forever, name="rdmadev-control",
                                       kwargs={"poll_interval": 0.2}, daemon=True)
        self.thread.start()

    def get_request(self):
        try:
            request = super().get_request()
        except OSError as e:
            if e.errno in (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM):
                if not self.starved:
                    log.warning("control: cannot accept connections on %s:%d: %s; retrying "
                                "every %g s. Fix: %s", *self.server_address[:2], e.strerror,
                                ACCEPT_BACKOFF_S, errno_hint(e.errno, "free memory"))
                self.starved = True
                time.sleep(ACCEPT_BACKOFF_S)
            raise
        if self.starved:
            log.warning("control: accepting connections on %s:%d again", *self.server_address[:2])
        self.starved = False
        return request

    def process_request(self, request, client_address):
        with self.admission:
            self.handshaking[request] = None
            if len(self.handshaking) > MAX_HANDSHAKING:
                oldest, _ = self.handshaking.popitem(last=False)
                self.dropped["handshaking"] += 1
                try:
                    oldest.shutdown(socket.SHUT_RDWR)  # its handshake fails; its thread ends
                except OSError:
                    pass
        super().process_request(request, client_address)

    def admit(self, sock, authenticated):
        """Ends `sock`'s handshake and says whether to serve it: it passed, was not dropped
        for a newer connection meanwhile, and fewer than MAX_CONNECTIONS are served (a True
        is followed by leave() once the connection ends)."""
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
            return True

    def leave(self):
        with self.admission:
            self.connections -= 1

    def close(self):
        self.shutdown()
        self.server_close()


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
            raise ProtocolError(f"task at {self.address[0]}:{self.address[1]} refused "
                                f"{request.get('op')}: {reply.get('error')}")
        return reply["result"]

    def close(self):
        """Closes the connection; a call waiting for its answer in another thread ends."""
        try:
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:  # never connected, or closed already
            pass
        self.sock.close()
