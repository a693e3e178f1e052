"""HMAC-SHA256 from libcrypto (RFC 4231 known answers, and Python's hmac) and the one
handshake protocol (_native/core/handshake.h): its known answer, a Python peer that speaks
the documented wire format, and real exchanges over a socketpair in two threads."""
import hashlib
import hmac
import socket
import struct
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

import rdmadev
from rdmadev import _core
from tcp_client import recv_exact

TAG = "rdmadev-control-v1"
SECRET = b"rdmadev-test-secret"
WAIT_S = 10.0  # bound on every join: far above any exchange here (they take < 10 ms)

# RFC 4231 section 4: (key, data, HMAC-SHA256) for test cases 1, 2, 3, 4, 6 and 7 (case 5 is
# about truncated output).
RFC4231 = [
    (b"\x0b" * 20, b"Hi There",
     "b0344c61d8db38535ca8afceaf0bf12b881dc200c9833da726e9376c2e32cff7"),
    (b"Jefe", b"what do ya want for nothing?",
     "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843"),
    (b"\xaa" * 20, b"\xdd" * 50,
     "773ea91e36800e46854db8ebd09181a72959098b3ef8c122d9635514ced565fe"),
    (bytes(range(1, 26)), b"\xcd" * 50,
     "82558a389a443c0ea4cc819899f2083a85f0faa3e578f8077a2e3ff46729665b"),
    (b"\xaa" * 131, b"Test Using Larger Than Block-Size Key - Hash Key First",
     "60e431591ee0b67f0d8a26aacbf5b77f8e0bc6213728c5140546040f0ee37f54"),
    (b"\xaa" * 131, b"This is a test using a larger than block-size key and a larger than "
     b"block-size data. The key needs to be hashed before being used by the HMAC algorithm.",
     "9b09ffa71b942fcb27635fbcd5b0e944bfdc63644f0713938a7f51535c3a35e2"),
]

# The known answer documented in handshake.h (the protocol definition).
NS, NC, NAME = bytes(range(32)), bytes(range(32, 64)), "worker:0"
CLIENT_PROOF = "eea03600fd74c617be9ae68442d89ee6dcc5702fc61968d442671d6b37c641b8"
SERVER_PROOF = "e14ec8bd816da8cdaf0762c2e350c0427dd5f4824265b90905ba25c1c9bf62b2"


def _proof(role, first, second, name):
    """The proof handshake.h defines, computed with Python's hmac."""
    message = TAG.encode() + b" " + role + b"|" + first + b"|" + second + b"|" + name
    return hmac.new(SECRET, message, hashlib.sha256).digest()


@pytest.mark.parametrize("key, data, mac", RFC4231)
def test_hmac_sha256_known_answers(key, data, mac):
    assert _core.hmac_sha256(key, data).hex() == mac
    assert hmac.new(key, data, hashlib.sha256).hexdigest() == mac


def test_hmac_sha256_agrees_with_python_on_many_sizes():
    for n in (0, 1, 55, 56, 63, 64, 65, 127, 128, 1000, 1 << 16):
        key, msg = bytes((i * 7) & 255 for i in range(n % 200)), bytes(i & 255 for i in range(n))
        assert _core.hmac_sha256(key, msg) == hmac.new(key, msg, hashlib.sha256).digest()


def test_handshake_known_answer():
    client = _core.handshake_proof(TAG, "client", SECRET, NS, NC, NAME)
    server = _core.handshake_proof(TAG, "server", SECRET, NC, NS, NAME)
    assert (client.hex(), server.hex()) == (CLIENT_PROOF, SERVER_PROOF)
    assert client == _proof(b"client", NS, NC, NAME.encode())
    assert server == _proof(b"server", NC, NS, NAME.encode())


def test_native_client_speaks_the_documented_protocol():
    """A server written from handshake.h's wire description alone accepts the native
    client, and the native client accepts its proof."""
    a, b = socket.socketpair()
    a.settimeout(WAIT_S)
    with a, b, ThreadPoolExecutor(1) as pool:
        fut = pool.submit(_core.client_handshake, b.fileno(), TAG, SECRET, NAME, WAIT_S)
        a.sendall(struct.pack("<II", 0x48444D52, 1) + NS)
        (nl,) = struct.unpack("<H", recv_exact(a, 2))
        name = recv_exact(a, nl)
        nc = recv_exact(a, 32)
        proof = recv_exact(a, 32)
        assert name == NAME.encode()
        assert proof == _proof(b"client", NS, nc, name)
        a.sendall(b"\0" + _proof(b"server", nc, NS, name))
        assert fut.result(WAIT_S) is None


def _exchange(client_secret, server_secret, timeout_s=WAIT_S):
    """Runs both native sides over a socketpair; returns (client outcome, server outcome),
    each a value or the exception raised."""
    a, b = socket.socketpair()
    with a, b, ThreadPoolExecutor(2) as pool:
        server = pool.submit(_core.server_handshake, a.fileno(), TAG, server_secret, "test-peer",
                             timeout_s)
        client = pool.submit(_core.client_handshake, b.fileno(), TAG, client_secret, NAME,
                             timeout_s)
        return tuple(f.exception(WAIT_S) or f.result(WAIT_S) for f in (client, server))


def test_right_secret_passes_both_ways():
    assert _exchange(SECRET, SECRET) == (None, NAME)


def test_wrong_secret_is_refused_on_both_ends():
    client, server = _exchange(SECRET, b"another-cluster")
    assert isinstance(client, rdmadev.AuthError) and "credentials" in str(client)
    assert isinstance(server, rdmadev.AuthError) and "failed authentication" in str(server)


def test_different_tags_do_not_authenticate():
    a, b = socket.socketpair()
    with a, b, ThreadPoolExecutor(2) as pool:
        server = pool.submit(_core.server_handshake, a.fileno(), "rdmadev-tcp-v1", SECRET, "p", 5)
        client = pool.submit(_core.client_handshake, b.fileno(), TAG, SECRET, NAME, 5)
        assert isinstance(client.exception(WAIT_S), rdmadev.AuthError)
        assert isinstance(server.exception(WAIT_S), rdmadev.AuthError)


def _trickle(sock, data, stop, every_s=0.05):
    for byte in data:
        if stop.wait(every_s):
            return
        try:
            sock.send(bytes([byte]))
        except OSError:
            return


@pytest.mark.parametrize("side", ["client", "server"])
@pytest.mark.parametrize("peer", ["silent", "trickling"])
def test_slow_peer_hits_the_absolute_deadline(side, peer):
    """A peer that says nothing, or sends one byte every 50 ms (each step would meet a
    per-read timeout), fails the handshake at its overall deadline."""
    a, b = socket.socketpair()
    stop = threading.Event()
    # What a well-formed peer would send first: the server's hello, or a client's message.
    first = (struct.pack("<II", 0x48444D52, 1) + NS if side == "client"
             else struct.pack("<H", len(NAME)) + NAME.encode() + NC + b"\0" * 32)
    feeder = threading.Thread(target=_trickle, args=(a, first, stop), daemon=True)
    if peer == "trickling":
        feeder.start()
    deadline_s = 0.5
    t0 = time.monotonic()
    try:
        with pytest.raises(rdmadev.DeadlineExceeded):
            if side == "client":
                _core.client_handshake(b.fileno(), TAG, SECRET, NAME, deadline_s)
            else:
                _core.server_handshake(b.fileno(), TAG, SECRET, "slow-peer", deadline_s)
        assert time.monotonic() - t0 < deadline_s + 1.0
    finally:
        stop.set()
        if feeder.is_alive():
            feeder.join(WAIT_S)
        a.close()
        b.close()


def test_handshake_releases_the_gil():
    """While one thread waits in a handshake, another keeps running Python."""
    a, b = socket.socketpair()
    with a, b, ThreadPoolExecutor(1) as pool:
        fut = pool.submit(_core.server_handshake, b.fileno(), TAG, SECRET, "p", 0.5)
        ticks, t0 = 0, time.monotonic()
        while time.monotonic() - t0 < 0.3:
            ticks += 1
        assert isinstance(fut.exception(WAIT_S), rdmadev.DeadlineExceeded)
        assert ticks > 1000
