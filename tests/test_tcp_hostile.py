"""A hostile tcp peer: each attack is rejected and logged, no byte outside a granted region
changes, the serving process survives and keeps serving a well-behaved peer."""
import hashlib
import os
import socket
import struct
import time

import numpy as np
import pytest

import rdmadev
import tcp_client as tc

SECRET = b"hostile-test-secret"
SIZE = 4096


@pytest.fixture
def victim():
    """A tcp Domain with a region granted to 'intruder' and one granted to someone else."""
    dom = rdmadev.open_domain("victim", rdmadev.Config(fabric="tcp", secret=SECRET))
    granted = dom.allocate(SIZE, label="granted", grant=["intruder"])
    other = dom.allocate(SIZE, label="other", grant=["friend"])
    for r, seed in ((granted, 1), (other, 2)):
        np.frombuffer(r, np.uint8)[:] = np.random.default_rng(seed).integers(0, 256, SIZE, np.uint8)
    yield dom, granted, other
    dom.close()


def _digest(region):
    return hashlib.sha256(memoryview(region)).hexdigest()


def _still_serves(victim):
    """A well-behaved, correctly authenticated peer ('friend') can still write."""
    dom, _, region = victim
    region.store(0, 0)
    with rdmadev.open_domain("friend", rdmadev.Config(fabric="tcp", secret=SECRET)) as friend:
        ep = friend.connect(dom.address)
        src = friend.allocate(64)
        np.frombuffer(src, np.uint8)[:] = 0xAB
        remote = ep.attach(region.descriptor)
        ep.write(src, 0, remote, 1024, 64, signal=(0, 77, 0))
        assert region.wait(0, 77, timeout=30) == 77
        assert bytes(memoryview(region)[1024:1088]) == b"\xab" * 64


def _events_since(before):
    """Events logged since recent_events() returned `before`. The ring keeps the last 256
    lines, so once full its oldest lines fall off the front as new ones arrive: the new lines
    are what follows the longest tail of `before` that `after` starts with."""
    after = rdmadev.recent_events()
    for dropped in range(len(before) + 1):
        kept = before[dropped:]
        if after[:len(kept)] == kept:
            return after[len(kept):]
    return after


def _attack(victim, payload, expect_log, name=b"intruder"):
    dom, granted, other = victim
    rid, size, rkey = tc.parse_desc(granted.descriptor)
    before = rdmadev.recent_events()
    g0, o0 = _digest(granted), _digest(other)
    s, ok = tc.connect(dom.address, SECRET, name=name)
    assert ok
    s.sendall(payload(rid, size, rkey, *tc.parse_desc(other.descriptor)))
    s.shutdown(1) if expect_log.startswith("truncated") else None
    assert tc.closed_by_peer(s), "the server kept a hostile connection open"
    s.close()
    logged = _events_since(before)
    assert any(expect_log in line and "disconnected" in line for line in logged), logged
    assert _digest(other) == o0
    return g0


def test_wrong_secret_is_refused(victim):
    dom, granted, other = victim
    before = rdmadev.recent_events()
    s, ok = tc.connect(dom.address, b"not the secret")
    assert not ok and tc.closed_by_peer(s)
    assert any("failed authentication" in e for e in _events_since(before))
    _still_serves(victim)


def test_rdmadev_client_with_wrong_secret_gets_clear_error(victim):
    dom, granted, _ = victim
    with rdmadev.open_domain("x", rdmadev.Config(fabric="tcp", secret=b"other")) as bad:
        with pytest.raises(rdmadev.AuthError, match="RDMADEV_SECRET"):
            bad.connect(dom.address)


def test_garbage_handshake(victim):
    dom, granted, _ = victim
    import socket
    host, port = tc.tcp_reach(dom.address).rsplit(":", 1)
    s = socket.create_connection((host, int(port)))
    tc.recv_exact(s, tc.HELLO.size)
    s.sendall(b"\xff\xff" + os.urandom(600))  # name length 65535
    assert tc.closed_by_peer(s)
    _still_serves(victim)


ATTACKS = {
    "out_of_bounds": (lambda rid, size, rkey, *o: tc.frame(tc.OP_WRITE, rid, rkey, size - 8, 16, b"x" * 16),
                      "outside region"),
    "overflow": (lambda rid, size, rkey, *o: tc.frame(tc.OP_WRITE, rid, rkey, 2**64 - 8, 16, b"x" * 16),
                 "outside region"),
    "signal_oob": (lambda rid, size, rkey, *o: tc.frame(tc.OP_WRITE, rid, rkey, 0, 8, b"x" * 8,
                                                        signal=(size - 8, 1, 1)),
                   "signal at"),
    "wrong_key": (lambda rid, size, rkey, *o: tc.frame(tc.OP_WRITE, rid, rkey ^ 1, 0, 8, b"x" * 8),
                  "wrong key"),
    "ungranted": (lambda rid, size, rkey, orid, osize, orkey: tc.frame(tc.OP_WRITE, orid, orkey, 0, 8, b"x" * 8),
                  "not granted"),
    "no_region": (lambda rid, size, rkey, *o: tc.frame(tc.OP_WRITE, 999, rkey, 0, 8, b"x" * 8),
                  "no region"),
    "read_oob": (lambda rid, size, rkey, *o: tc.frame(tc.OP_READ, rid, rkey, 0, size + 1),
                 "outside region"),
    "garbage": (lambda *a: os.urandom(4096), "bad magic"),
}


@pytest.mark.parametrize("name", sorted(ATTACKS))
def test_bad_frame_is_rejected(victim, name):
    payload, log = ATTACKS[name]
    g0 = _attack(victim, payload, log)
    assert _digest(victim[1]) == g0  # rejected before a single byte was applied
    _still_serves(victim)


def test_truncated_frame_touches_only_its_granted_range(victim):
    """A WRITE that promises 1024 bytes but delivers 100: the connection is dropped; only
    bytes inside the promised (granted, in-bounds) range may have changed."""
    dom, granted, other = victim
    before = bytes(memoryview(granted))
    _attack(victim, lambda rid, size, rkey, *o: tc.frame(tc.OP_WRITE, rid, rkey, 2048, 1024, b"z" * 100),
            "truncated")
    after = bytes(memoryview(granted))
    assert after[:2048] == before[:2048] and after[3072:] == before[3072:]
    assert after[2048:2148] == b"z" * 100
    _still_serves(victim)


def test_frame_header_cut_short_is_a_logged_truncated_frame(victim):
    """20 of a header's 64 bytes, then the end of the stream: not a clean goodbye."""
    g0 = _attack(victim, lambda rid, size, rkey, *o: tc.frame(tc.OP_WRITE, rid, rkey, 0, 8, b"x" * 8)[:20],
                 "truncated frame: connection ended after 20 of the 64 header bytes")
    assert _digest(victim[1]) == g0
    _still_serves(victim)


def test_peer_chosen_name_cannot_forge_log_lines_or_reach_stderr_raw(victim, capfd):
    """The name a peer claims reaches the log escaped: no second line, no raw bytes."""
    name = b"evil\nrdmadev[1]: forged line\x1b[2J\\"
    ungranted = ATTACKS["ungranted"][0]
    before = rdmadev.recent_events()
    _attack(victim, ungranted, "not granted", name=name)
    logged = _events_since(before)
    assert len(logged) == 1, logged
    assert "peer 'evil\\x0ardmadev[1]: forged line\\x1b[2J\\x5c'" in logged[0], logged
    err = capfd.readouterr().err
    assert "\x1b" not in err and "\nrdmadev[1]: forged" not in err, err


def test_a_flood_of_silent_connections_cannot_lock_a_peer_out(victim):
    """600 sockets that never speak (more than the 512 authenticated connections allowed):
    at most 64 are kept in their handshake, the oldest dropped for each new one, logged once,
    and a real peer still connects and writes."""
    import socket
    import threading
    dom, _, _ = victim
    host, port = tc.tcp_reach(dom.address).rsplit(":", 1)
    before = rdmadev.recent_events()
    threads = threading.active_count()
    flood = []
    try:
        for _ in range(600):
            flood.append(socket.create_connection((host, int(port)), timeout=30))
        _still_serves(victim)
        assert threading.active_count() <= threads + 64 + 8  # + the friend's connection's
        logged = _events_since(before)
        crowded = [line for line in logged if "in their handshake; dropping the oldest" in line]
        assert len(crowded) == 1 and len(logged) < 10, logged
    finally:
        for s in flood:
            s.close()


def test_valid_frames_from_hand_written_client_apply(victim):
    """The protocol is what the docs say: an independent client writes and reads."""
    dom, granted, _ = victim
    rid, size, rkey = tc.parse_desc(granted.descriptor)
    granted.store(64, 0)
    s, ok = tc.connect(dom.address, SECRET)
    assert ok
    s.sendall(tc.frame(tc.OP_WRITE, rid, rkey, 100, 5, b"hello", signal=(64, 9, 5)))
    assert granted.wait(64, 9, timeout=30) == 9 and granted.load(72) == 5
    s.sendall(tc.frame(tc.OP_READ, rid, rkey, 100, 5))
    head = tc.recv_exact(s, tc.FRAME.size)
    assert struct.unpack_from("<IH", head) == (tc.FRAME_MAGIC, 3)
    assert tc.recv_exact(s, 5) == b"hello"
    s.close()


def test_a_write_to_a_released_region_is_dropped_and_the_connection_carries_on(victim):
    """A write still on its way when its region was released (a receiving half unbound while
    its sender's last write was in flight, tests/test_tf_ops.py) is read past and dropped: the
    connection, which a task pair's channels share, applies the next frame. An id that never
    named a region is still refused ("no_region" above)."""
    dom, granted, _ = victim
    rid, size, rkey = tc.parse_desc(granted.descriptor)
    gone = dom.allocate(SIZE, label="gone", grant=["intruder"])
    gid, gsize, gkey = tc.parse_desc(gone.descriptor)
    gone.close()
    granted.store(64, 0)
    before = rdmadev.recent_events()
    s, ok = tc.connect(dom.address, SECRET)
    assert ok
    s.sendall(tc.frame(tc.OP_WRITE, gid, gkey, 0, gsize, b"\xee" * gsize, signal=(0, 5, 5)))
    s.sendall(tc.frame(tc.OP_WRITE, rid, rkey, 100, 5, b"after", signal=(64, 9, 5)))
    assert granted.wait(64, 9, timeout=30) == 9
    assert bytes(memoryview(granted)[100:105]) == b"after"
    s.sendall(tc.frame(tc.OP_WRITE, gid + 1000, gkey, 0, 8, b"x" * 8))  # never a region
    assert tc.closed_by_peer(s)
    s.close()
    logged = _events_since(before)
    assert [l for l in logged if "rejected" in l] == [l for l in logged if f"no region {gid + 1000}" in l], logged
    assert len(logged) == 1, logged


def test_a_flood_of_failed_handshakes_logs_a_bounded_number_of_lines(victim):
    """Each wrong-secret peer fails its handshake; 40 of them within seconds log at most the
    budget's lines plus one saying the rest are left out, and a real peer still gets through."""
    budget = 10  # LogBudget::kLinesPerWindow (common.h)
    dom = victim[0]
    before = rdmadev.recent_events()
    for _ in range(40):
        s, ok = tc.connect(dom.address, b"not the secret")
        assert not ok
        s.close()
    deadline = time.monotonic() + 30  # the acceptor logs after the client saw the refusal
    while len([l for l in _events_since(before) if "leaving out" in l]) < 1 and time.monotonic() < deadline:
        time.sleep(0.05)
    logged = _events_since(before)
    failures = [l for l in logged if "disconnected" in l]
    assert len(failures) == budget, logged
    assert [l for l in logged if "failed handshakes" in l and "leaving out the rest" in l], logged
    assert len(logged) == budget + 1, logged
    _still_serves(victim)


def test_frames_in_pieces_at_any_pace_all_apply():
    """The server's receiver polls between frames while frames keep coming and blocks once
    they stop (tcp.cc, PollGate). With a 5 ms poll budget, frames cut into pieces arrive back
    to back, then 1 ms apart (pieces land while it polls), then 12 ms apart (polls miss, the
    gate closes, reads block), then back to back again: each applies whole and in order."""
    cfg = rdmadev.Config(fabric="tcp", secret=SECRET, spin_us=5000)
    with rdmadev.open_domain("paced", cfg) as dom:
        region = dom.allocate(SIZE, label="paced", grant=["intruder"])
        rid, _, rkey = tc.parse_desc(region.descriptor)
        region.store(0, 0)
        s, ok = tc.connect(dom.address, SECRET)
        assert ok
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        slots, length, base = 10, 384, 128  # payloads after the signal words
        payload = lambda k: bytes((k * 7 + i) % 256 for i in range(length))  # noqa: E731
        seq = 0
        for phase, (frames, pause_s) in enumerate(((40, 0.0), (12, 0.001), (12, 0.012), (40, 0.0))):
            for _ in range(frames):
                seq += 1
                data = tc.frame(tc.OP_WRITE, rid, rkey, base + (seq % slots) * length, length,
                                payload(seq), signal=(0, seq, seq))
                cuts = (0, 30, tc.FRAME.size + 100, len(data))  # inside the header, the payload
                for a, b in zip(cuts, cuts[1:]):
                    time.sleep(pause_s)
                    s.sendall(data[a:b])
                if pause_s:
                    assert region.wait(0, seq, timeout=30) == seq, f"phase {phase}"
            assert region.wait(0, seq, timeout=30) == seq, f"phase {phase}"
            assert region.load(8) == seq
            view = memoryview(region)
            for k in range(seq - slots + 1, seq + 1):
                off = base + (k % slots) * length
                assert bytes(view[off:off + length]) == payload(k), f"phase {phase}, frame {k}"
            del view
        s.close()
