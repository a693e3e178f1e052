"""An independent tcp-fabric client in pure Python (hashlib/hmac/struct), used to act as a
hostile or well-behaved peer at the byte level. It re-implements the documented wire
protocol (_native/core/tcp/tcp.cc, frame.h) rather than calling rdmadev's code."""
import hashlib
import hmac
import os
import socket
import struct

HELLO = struct.Struct("<II32s")           # magic "RDMH", version, server nonce
FRAME = struct.Struct("<IHHQQQQQQQ")      # magic, op, flags, region, rkey, offset, length, sig x3
FRAME_MAGIC, HELLO_MAGIC = 0x464D4452, 0x48444D52
OP_WRITE, OP_READ, FLAG_SIGNAL = 1, 2, 1
# Region descriptor v2 (80 bytes): magic, version, id, size, rkey, pid, fd, ino, dev,
# verbs address, verbs rkey, reserved.
DESC = struct.Struct("<IIQQQIiQQQI4xQ")  # descriptor v3 (region.h)


def parse_desc(desc):
    _, _, rid, size, rkey, *_ = DESC.unpack(desc)
    return rid, size, rkey


def tcp_reach(address):
    return dict(item.split("=", 1) for item in address.split(";"))["tcp"]


def _mac(secret, role, a, b, name):
    return hmac.new(secret, b"rdmadev-tcp-v1 " + role + b"|" + a + b"|" + b + b"|" + name,
                    hashlib.sha256).digest()


def connect(address, secret, name=b"intruder", timeout=10.0):
    """Returns (socket, authenticated: bool)."""
    host, port = tcp_reach(address).rsplit(":", 1)
    s = socket.create_connection((host, int(port)), timeout=timeout)
    hello = recv_exact(s, HELLO.size)
    magic, version, ns = HELLO.unpack(hello)
    assert magic == HELLO_MAGIC and version == 1
    nc = os.urandom(32)
    s.sendall(struct.pack("<H", len(name)) + name + nc + _mac(secret, b"client", ns, nc, name))
    reply = recv_exact(s, 33)
    if reply[0] != 0:
        return s, False
    assert hmac.compare_digest(reply[1:], _mac(secret, b"server", nc, ns, name))
    return s, True


def recv_exact(s, n):
    buf = b""
    while len(buf) < n:
        chunk = s.recv(n - len(buf))
        if not chunk:
            raise ConnectionError("closed")
        buf += chunk
    return buf


def frame(op, region, rkey, offset, length, payload=b"", signal=None):
    flags, sig = (FLAG_SIGNAL, signal) if signal else (0, (0, 0, 0))
    return FRAME.pack(FRAME_MAGIC, op, flags, region, rkey, offset, length, *sig) + payload


def closed_by_peer(s, timeout=10.0):
    """True once the server has closed the connection."""
    s.settimeout(timeout)
    try:
        while True:
            if not s.recv(65536):
                return True
    except ConnectionResetError:
        return True
    except socket.timeout:
        return False
