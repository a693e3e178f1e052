"""Waits end: on the write, at the deadline, or as soon as the peer dies. Never a hang."""
import concurrent.futures
import os
import sys
import threading

import pytest

import rdmadev
from rdmadev.errors import class_for_kind
from remote import RemotePeer

# Long enough that reaching it would mean liveness detection failed; the tests that use it
# assert PeerLostError, which only liveness raises.
NEVER = 120.0


def test_wait_fails_at_deadline_naming_the_sequence(domain):
    region = domain.allocate(64)
    region.store(0, 4)
    with pytest.raises(rdmadev.DeadlineExceeded, match=r"sequence 5, last seen 4") as e:
        region.wait(0, 5, timeout=0.2)
    assert e.value.errno == 110 and "RDMADEV_DEADLINE_S" in e.value.hint
    assert region.wait(0, 4, timeout=0.2) == 4


def test_wait_on_killed_peer_fails_promptly(domain, peer):
    region = domain.allocate(64)
    ep = domain.connect(peer.address)
    peer.call("connect", "parent", domain.address)
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        waiting = pool.submit(region.wait, 0, 1, NEVER, ep)
        peer.kill()
        with pytest.raises(rdmadev.PeerLostError, match="Peer lost"):
            waiting.result(timeout=NEVER)
    assert ep.alive()[0] is False


def test_nothing_left_in_dev_shm_after_kill(fabric, secret):
    before = set(os.listdir("/dev/shm"))
    p = RemotePeer(fabric, secret)
    for i in range(4):
        p.call("alloc", f"r{i}", 1 << 20)
    p.kill()
    with rdmadev.open_domain("x", rdmadev.Config(fabric=fabric, secret=secret)) as dom:
        dom.allocate(1 << 20)
    assert set(os.listdir("/dev/shm")) == before


class Completions:
    """Collects progress callbacks: ticket order does not matter, exactly-once does."""

    def __init__(self, n):
        self.results, self.lock, self.done = {}, threading.Lock(), threading.Event()
        self.n = n

    def callback(self, key):
        def on_done(ok, value, kind, message):
            with self.lock:
                assert key not in self.results, "a wait completed twice"
                self.results[key] = (ok, value, kind, message)
                if len(self.results) == self.n:
                    self.done.set()
        return on_done


def test_progress_completes_many_waits(domain):
    n = 1000
    region = domain.allocate(8 * n)
    got = Completions(n)
    for i in range(n):
        domain.submit_wait(region, 8 * i, i + 1, got.callback(i), timeout=NEVER)
    for i in reversed(range(n)):
        region.store(8 * i, i + 1)
    assert got.done.wait(NEVER)
    assert all(ok and value == i + 1 for i, (ok, value, _, _) in got.results.items())
    assert domain.pending_waits == 0


def test_progress_deadline_cancel_and_close(domain):
    region = domain.allocate(64)
    got = Completions(3)
    domain.submit_wait(region, 0, 1, got.callback("deadline"), timeout=0.1)
    ticket = domain.submit_wait(region, 8, 1, got.callback("cancel"), timeout=NEVER)
    domain.submit_wait(region, 16, 1, got.callback("close"), timeout=NEVER)
    assert domain.cancel_wait(ticket) is True
    assert domain.cancel_wait(ticket) is False
    while "deadline" not in got.results:
        got.done.wait(0.05)
    domain.close()
    assert got.done.wait(NEVER)
    kinds = {k: class_for_kind(v[2]) for k, v in got.results.items()}
    assert kinds == {"deadline": rdmadev.DeadlineExceeded, "cancel": rdmadev.ClosedError,
                     "close": rdmadev.ClosedError}
    assert not any(v[0] for v in got.results.values())


def test_progress_reports_dead_peer(domain, peer):
    region = domain.allocate(64)
    ep = domain.connect(peer.address)
    peer.call("connect", "parent", domain.address)
    got = Completions(1)
    domain.submit_wait(region, 0, 1, got.callback("w"), timeout=NEVER, peer=ep)
    peer.kill()
    assert got.done.wait(NEVER)
    ok, _, kind, message = got.results["w"]
    assert not ok and class_for_kind(kind) is rdmadev.PeerLostError and "Peer lost" in message


def test_progress_callback_exception_is_reported_not_lost(domain, monkeypatch):
    region = domain.allocate(64)
    fired = threading.Event()
    reported = []
    monkeypatch.setattr(sys, "unraisablehook", reported.append)

    def bad(*args):
        fired.set()
        raise RuntimeError("boom in callback")

    domain.submit_wait(region, 0, 1, bad, timeout=NEVER)
    region.store(0, 1)
    assert fired.wait(NEVER)
    domain.close()  # the progress thread has finished the callback once close returns
    assert [str(r.exc_value) for r in reported] == ["boom in callback"]
