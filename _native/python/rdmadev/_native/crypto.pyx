# cython: language_level=3
"""HMAC-SHA256 (OpenSSL's libcrypto, through the core) and rdmadev's one handshake protocol
(_native/core/handshake.h), for the Python control service and known-answer tests."""
from libcpp.string cimport string

from rdmadev._native.c_common cimport Deadline, as_bytes, deadline_of
from rdmadev._native.c_crypto cimport (AcceptHandshake, ClientHandshake, Digest,
                                       HandshakeProof, HmacSha256)

__all__ = ["hmac_sha256", "handshake_proof", "client_handshake", "server_handshake"]


cdef bytes _digest(Digest d):
    return (<char*>d.data())[:d.size()]


def hmac_sha256(key, msg):
    """HMAC-SHA256 of `msg` under `key` (bytes or str), 32 bytes, computed by libcrypto.

    Raises:
        ConfigError: OpenSSL's libcrypto cannot be loaded (the message says how to install it).
    """
    cdef string k = as_bytes(key), m = as_bytes(msg)
    cdef Digest d
    with nogil:
        d = HmacSha256(k, m)
    return _digest(d)


def handshake_proof(tag, role, secret, first, second, name):
    """The proof `role` ("client"/"server") sends in the handshake (see handshake.h)."""
    cdef string t = as_bytes(tag), r = as_bytes(role), s = as_bytes(secret)
    cdef string a = as_bytes(first), b = as_bytes(second), n = as_bytes(name)
    cdef Digest d
    with nogil:
        d = HandshakeProof(t, r, s, a, b, n)
    return _digest(d)


def client_handshake(int fd, tag, secret, name, double timeout_s, peer="peer"):
    """Authenticates this task (`name`) to the server on connected socket `fd`, and the
    server to it. `timeout_s` bounds the whole exchange. Releases the GIL.

    Raises:
        AuthError: the secrets differ. DeadlineExceeded: the exchange took too long.
        PeerLostError: the peer hung up. ProtocolError: the peer is not an rdmadev peer.
    """
    cdef string t = as_bytes(tag), s = as_bytes(secret), n = as_bytes(name), p = as_bytes(peer)
    cdef Deadline dl = deadline_of(timeout_s)
    with nogil:
        ClientHandshake(fd, t, s, n, p, dl)


def server_handshake(int fd, tag, secret, where, double timeout_s):
    """The accepting side of client_handshake() on socket `fd` (`where` names the peer in
    errors). Returns the peer's authenticated name. Raises like client_handshake()."""
    cdef string t = as_bytes(tag), s = as_bytes(secret), w = as_bytes(where), name
    cdef Deadline dl = deadline_of(timeout_s)
    with nogil:
        name = AcceptHandshake(fd, t, s, w, dl)
    return name.decode(errors="replace")
