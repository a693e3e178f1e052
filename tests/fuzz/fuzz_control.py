"""Fuzz target "control": the control link's reader (rdmadev/cluster/control.py, the coroutine
Link.serve with _recv_async, _recv_exact_async, _length, _decode and _frame), which every byte
an authenticated peer sends on a control connection reaches. (What comes before authentication is the native
handshake under the tag "rdmadev-control-v1": the "handshake" target fuzzes it.)

Each input is the byte stream of one connection: a thread writes it to one end of a
socketpair, shuts that end for writing and reads the replies, while the loop (an asyncio
event loop, as in a task; requests answered on it, as ping is) serves the other end with a handler that answers {"op": <op>} and raises ValueError for an op that
starts with "fail". Python coverage of the control module and of json's Python part
(json.loads' encoding detection, the decoder) guides atheris.

Oracles:
  - the loop returns (nothing escapes it, whatever the bytes) and releases its session;
  - no read asks for more than MAX_MESSAGE_BYTES at once, nor buffers more for one message;
  - the handler only ever sees a dict whose 'op' is a str;
  - the replies are exactly those a model of the protocol expects from the same bytes, each a
    well-formed length-prefixed JSON object: the handler's result or error for each request
    (with the request's "id" as its "re" when it has one), a ProtocolError for a JSON value
    that is not an object with a string 'op', none for an object with a "re" and no 'op' (a
    reply to a call this task no longer waits for), and none once the stream is cut (a prefix over MAX_MESSAGE_BYTES, a body that is not JSON or nests too
    deep, a truncated prefix or body).

The loop runs with the recursion limit RECURSION_HEADROOM frames above the caller's depth
(the service's threads have ~1000), so that nesting deep enough to exhaust it is in reach of
short inputs: a message nested at most SERVED_DEPTH deep must be served, one nested deeper may
instead end the connection (but only as malformed: nothing may escape).

Run under atheris:
    python3 tests/fuzz/fuzz_control.py -max_total_time=30 WORK_DIR tests/fuzz/corpus/control
Without atheris, run_one(data) replays one input (tests/test_fuzz.py does).
"""
import asyncio
import json
import os
import socket
import struct
import sys
import threading

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)  # the rdmadev of this checkout

from rdmadev.cluster import control  # noqa: E402

# Inputs are cut here: a connection's replies must fit what the reading thread takes.
MAX_INPUT = 1 << 16
# Frames of recursion the loop may use beyond run_one's: about 4 on the way to json's C
# decoder, which takes one per level of nesting, and under 20 on the handler's and logging's
# path. So about 50 levels of nesting end the connection: the seed "nested" has 81.
RECURSION_HEADROOM = 55
# Nesting the loop must serve under that limit.
SERVED_DEPTH = 25


class Broken(AssertionError):
    """An oracle failed."""


class _Budget:
    """control._LogBudget's interface, counting instead of logging."""

    def __init__(self):
        self.lines = 0

    def warning(self, msg, *args):
        self.lines += 1


class _Watched:
    """The served socket (non-blocking, as the event loop wants it), checking every read
    against MAX_MESSAGE_BYTES."""

    def __init__(self, sock):
        self.sock = sock
        sock.setblocking(False)

    def recv(self, n):
        if n > control.MAX_MESSAGE_BYTES:
            raise Broken(f"a read of {n} bytes (MAX_MESSAGE_BYTES is {control.MAX_MESSAGE_BYTES})")
        return self.sock.recv(n)

    def send(self, data):
        return self.sock.send(data)

    def fileno(self):
        return self.sock.fileno()

    def setblocking(self, flag):
        self.sock.setblocking(flag)

    def shutdown(self, how):
        self.sock.shutdown(how)

    def close(self):
        self.sock.close()


class _EveryOp:
    """`inline` for the loop: every request is answered on the loop itself."""

    def __contains__(self, op):
        return True


def _handler(request):
    if not isinstance(request, dict) or not isinstance(request.get("op"), str):
        raise Broken(f"the handler got {type(request).__name__} {request!r:.200}")
    if request["op"].startswith("fail"):
        raise ValueError("asked to fail")
    return {"op": request["op"]}


def _nesting(obj):
    """How deep lists and dicts nest in `obj` (0 for a scalar), without recursion."""
    deepest, todo = 0, [(obj, 1)]
    while todo:
        o, d = todo.pop()
        if isinstance(o, (list, dict)):
            deepest = max(deepest, d)
            todo.extend((v, d + 1) for v in (o.values() if isinstance(o, dict) else o))
    return deepest


def expected_replies(data):
    """The replies the protocol says `data` gets (see the module docstring), and whether the
    loop may end the connection after them instead of going on (a message nested deeper than
    SERVED_DEPTH comes next)."""
    replies, pos = [], 0
    while len(data) - pos >= 4:
        (n,) = struct.unpack_from("<I", data, pos)
        pos += 4
        if n > control.MAX_MESSAGE_BYTES or len(data) - pos < n:
            break
        try:
            request = json.loads(data[pos:pos + n])
        except (ValueError, RecursionError):
            break
        if _nesting(request) > SERVED_DEPTH:
            return replies, True
        pos += n
        if isinstance(request, dict) and "re" in request and "op" not in request:
            continue  # a reply nobody waits for: dropped
        if not isinstance(request, dict) or not isinstance(request.get("op"), str):
            reply = {"ok": False, "error": "ProtocolError: a control request is a JSON "
                                           "object with a string 'op'",
                     "kind": "ProtocolError"}
        elif request["op"].startswith("fail"):
            reply = {"ok": False, "error": "ValueError: asked to fail", "kind": "ValueError"}
        else:
            reply = {"ok": True, "result": {"op": request["op"]}}
        if isinstance(request, dict) and "id" in request:
            reply["re"] = request["id"]
        replies.append(reply)
    return replies, False


def _parse_replies(raw):
    replies, pos = [], 0
    while pos < len(raw):
        if len(raw) - pos < 4:
            raise Broken(f"a reply's length prefix is cut: {raw[pos:]!r}")
        (n,) = struct.unpack_from("<I", raw, pos)
        body = raw[pos + 4:pos + 4 + n]
        if len(body) != n:
            raise Broken(f"a reply of {n} bytes is cut after {len(body)}")
        reply = json.loads(body)  # strict enough: a failure here fails the oracle
        if not isinstance(reply, dict):
            raise Broken(f"a reply that is not an object: {reply!r:.200}")
        replies.append(reply)
        pos += 4 + n
    return replies


def run_one(data):
    """Serves `data` as one connection's bytes and checks the oracles; raises Broken."""
    data = bytes(data[:MAX_INPUT])
    served, peer = socket.socketpair()
    received = []

    def peer_side():
        try:
            peer.sendall(data)
            peer.shutdown(socket.SHUT_WR)
        except OSError:  # the loop stopped reading and closed its end: the rest is not sent
            pass
        chunks = []
        while True:
            try:
                chunk = peer.recv(1 << 16)
            except ConnectionResetError:  # closed with bytes of ours unread: replies came first
                break
            if not chunk:
                break
            chunks.append(chunk)
        received.append(b"".join(chunks))

    thread = threading.Thread(target=peer_side, daemon=True)
    thread.start()
    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(_depth() + RECURSION_HEADROOM)
    try:
        asyncio.run(control.Link(_Watched(served), "fuzz-peer:1", _handler, _Budget(),
                                 _EveryOp()).serve())
    finally:
        sys.setrecursionlimit(limit)
        served.close()  # the peer side's read ends
        thread.join()
        peer.close()
    if control.session() is not None:
        raise Broken("the connection's session outlived it")
    got = _parse_replies(received[0])
    want, deep_next = expected_replies(data)
    if got[:len(want)] != want or (len(got) > len(want) and not deep_next):
        raise Broken(f"replies {got!r:.300} where the protocol says {want!r:.300}")


def _depth():
    """Frames on this thread's stack."""
    frame, n = sys._getframe(), 0
    while frame:
        frame, n = frame.f_back, n + 1
    return n


def main(argv):
    import atheris

    atheris.instrument_func(run_one)
    for module in (control, json, json.decoder):
        for obj in list(vars(module).values()):
            funcs = [obj] + [m for m in vars(obj).values() if callable(m)] \
                if isinstance(obj, type) else [obj]
            for f in funcs:
                if getattr(f, "__module__", None) == module.__name__ and \
                        hasattr(f, "__code__"):
                    atheris.instrument_func(f)
    atheris.Setup(argv, run_one)
    atheris.Fuzz()


if __name__ == "__main__":
    main(sys.argv)
