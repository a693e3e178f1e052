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
import json
import logging
import socket
import socketserver
import struct
import threading

from .. import _core
from ..config import Config
from ..errors import AuthError, PeerLostError, ProtocolError, RdmadevError
from .spec import split_address

__all__ = ["ControlServer", "ControlClient", "control_address"]

log = logging.getLogger(__name__)
log.addHandler(logging.NullHandler())

#: Handshake tag of the control service (see handshake.h: the tag binds a proof to its service).
HANDSHAKE_TAG = "rdmadev-control-v1"
# Largest request or reply: a few descriptors and addresses; anything bigger is hostile.
MAX_MESSAGE_BYTES = 1 << 20
# Seconds a peer may take for the whole handshake (an absolute deadline, not per read) before
# its connection is dropped: the fabrics' kHandshakeSeconds.
HANDSHAKE_TIMEOUT_S = 10.0


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
    return json.loads(_recv_exact(sock, n))


class _Handler(socketserver.BaseRequestHandler):
    def handle(self):
        server = self.server
        sock = self.request
        where = "%s:%d" % self.client_address[:2]
        try:
            _core.server_handshake(sock.fileno(), HANDSHAKE_TAG, server.secret, where,
                                   HANDSHAKE_TIMEOUT_S)
        except AuthError:
            server.rejected += 1
            log.warning("control: peer %s failed authentication (wrong cluster secret)", where)
            return
        except RdmadevError as e:
            log.info("control: handshake with %s failed: %s", where, e)
            return
        try:
            while True:
                try:
                    request = _recv(sock)
                except PeerLostError:
                    return
                try:
                    reply = {"ok": True, "result": server.handler(request)}
                except Exception as e:  # reported to the caller, who raises it
                    log.exception("control: request %s failed", request.get("op"))
                    reply = {"ok": False, "error": f"{type(e).__name__}: {e}"}
                _send(sock, reply)
        except (OSError, ProtocolError, ValueError) as e:
            log.info("control: connection from %s ended: %s", self.client_address, e)


class ControlServer(socketserver.ThreadingTCPServer):
    """Serves `handler(request: dict) -> result` to authenticated peers, one thread each."""

    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, address, secret, handler):
        self.secret = secret
        self.handler = handler
        self.rejected = 0
        super().__init__(address, _Handler)
        self.thread = threading.Thread(target=self.serve_forever, name="rdmadev-control",
                                       kwargs={"poll_interval": 0.2}, daemon=True)
        self.thread.start()

    def close(self):
        self.shutdown()
        self.server_close()


class ControlClient:
    """A connection to one task's control service; call() is thread-safe."""

    def __init__(self, address, secret, timeout=60.0, name="coordinator"):
        self.address = address
        self.lock = threading.Lock()
        try:
            self.sock = socket.create_connection(address, timeout=timeout)
        except OSError as e:
            raise PeerLostError(f"cannot reach the rdmadev control service at {address[0]}:{address[1]}: "
                                f"{e.strerror or e}", e.errno or 0,
                                "start every task with `rdmadev serve` (python -m rdmadev.server), "
                                "which opens it at the task's TF port + RDMADEV_CONTROL_PORT_OFFSET") from None
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
        """Sends one request and returns its result, raising the peer's error."""
        with self.lock:
            try:
                _send(self.sock, request)
                reply = _recv(self.sock)
            except OSError as e:  # reset or broken pipe: the task behind it died or restarted
                raise PeerLostError(f"control connection to {self.address[0]}:{self.address[1]} "
                                    f"failed: {e.strerror or e}", e.errno or 0,
                                    "the peer task died or restarted (see its log)") from None
        if not reply.get("ok"):
            raise ProtocolError(f"task at {self.address[0]}:{self.address[1]} refused "
                                f"{request.get('op')}: {reply.get('error')}")
        return reply["result"]

    def close(self):
        self.sock.close()
