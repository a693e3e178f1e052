"""The channel protocol: a K-slot ring with credits, between two processes."""
import numpy as np
import pytest

import rdmadev
from rdmadev import _core
from rdmadev.testing.pair import ring_layout
from remote_ops import pattern

SEED = 1000


def _channel(domain, peer, slots, capacity):
    """This process sends, the peer receives."""
    address, ring_desc = peer.call("ring_rx_setup", "ring", slots, capacity)
    ep = domain.connect(address)
    credit = domain.allocate(rdmadev.CREDIT_BYTES, label="credit")
    tx = rdmadev.RingSender(ep, ep.attach(ring_desc), ring_layout(slots, capacity), credit)
    peer.call("ring_rx_connect", "ring", slots, capacity, domain.address, credit.descriptor)
    return tx


def _send(tx, src, length):
    seq = tx.sent + 1
    np.frombuffer(src, np.uint8, length)[:] = pattern(length, SEED + seq)
    assert tx.send(src, 0, length) == seq


def _ring(a, b, ab, ba, capacity):
    """(sender, receiver, sender's credit region) of a 2-slot ring from domain a to b."""
    layout = ring_layout(2, capacity)
    region, credit = b.allocate(layout.bytes), a.allocate(rdmadev.CREDIT_BYTES)
    return (rdmadev.RingSender(ab, ab.attach(region.descriptor), layout, credit),
            rdmadev.RingReceiver(region, layout, ba, ba.attach(credit.descriptor)), credit)


@pytest.mark.parametrize("slots", [1, 2, 3, 8])
def test_thousands_of_transfers_arrive_intact(domain, peer, slots):
    count, capacity = 3000, 4096 + 64
    tx = _channel(domain, peer, slots, capacity)
    src = domain.allocate(capacity)
    peer.send("ring_rx_consume", "ring", count, SEED)
    rng = np.random.default_rng(1)
    for _ in range(count):
        _send(tx, src, int(rng.integers(0, capacity + 1)))  # lengths vary, 0 included
    assert peer.result() == []


def test_slow_receiver_never_sees_a_slot_overwritten(domain, peer):
    """The receiver holds every 7th slot for 20 ms and re-checks it before releasing: a
    sender that ignored credits would have overwritten it by then."""
    count, capacity = 300, 1 << 16
    tx = _channel(domain, peer, 2, capacity)
    src = domain.allocate(capacity)
    peer.send("ring_rx_consume", "ring", count, SEED, 7, 0.02)
    for _ in range(count):
        _send(tx, src, capacity)
    assert peer.result() == []


def test_sender_blocks_without_credit(domain, peer):
    """With nobody consuming, the third send into two slots waits for a credit and fails
    at its deadline instead of overwriting."""
    tx = _channel(domain, peer, 2, 64)
    src = domain.allocate(64)
    tx.send(src, 0, 64)
    tx.send(src, 0, 64)
    with pytest.raises(rdmadev.DeadlineExceeded, match="credit"):
        tx.send(src, 0, 64, timeout=0.3)


def test_tensor_larger_than_planned_is_refused(domain, peer):
    tx = _channel(domain, peer, 2, 1024)
    src = domain.allocate(4096)
    with pytest.raises(rdmadev.BoundsError, match="larger than planned"):
        tx.send(src, 0, 1025)


def test_ring_needs_a_slot():
    with pytest.raises(rdmadev.ConfigError, match="slots = 0 .*RDMADEV_SLOTS >= 1"):
        ring_layout(0, 64)


def test_out_of_order_release_advances_credit_in_order(fabric, secret):
    """Within one process (two domains): releasing seq 2 before 1 must not return the
    credit for 1's slot early."""
    cfg = rdmadev.Config(fabric=fabric, secret=secret)
    with rdmadev.open_domain("tx", cfg) as a, rdmadev.open_domain("rx", cfg) as b:
        layout = ring_layout(3, 64)
        ring = b.allocate(layout.bytes)
        ab, ba = a.connect(b.address), b.connect(a.address)
        credit = a.allocate(rdmadev.CREDIT_BYTES)
        tx = rdmadev.RingSender(ab, ab.attach(ring.descriptor), layout, credit)
        rx = rdmadev.RingReceiver(ring, layout, ba, ba.attach(credit.descriptor))
        src = a.allocate(64)
        for _ in range(3):
            tx.send(src, 0, 64)
        s1, s2, s3 = (rx.acquire(timeout=10)[0] for _ in range(3))
        rx.release(s2)
        assert rx.credit_seq == 0
        rx.release(s1)
        assert rx.credit_seq == 2
        assert credit.wait(0, 2, timeout=10) == 2
        with pytest.raises(rdmadev.ProtocolError, match="not held"):
            rx.release(s1)
        rx.release(s3)
        assert credit.wait(0, 3, timeout=10) == 3


def test_a_channel_moves_to_its_successor_ring_between_transfers(fabric, secret):
    """Growth (channel.h): once successors are bound on both sides, the next send writes the
    marker on the old ring and its data on the larger one; the receiver follows, writes no
    credit for the old ring after the marker, and the old halves are gone from the table."""
    cfg = rdmadev.Config(fabric=fabric, secret=secret)
    key = f"grow-{fabric}"
    with rdmadev.open_domain("tx", cfg) as a, rdmadev.open_domain("rx", cfg) as b:
        ab, ba = a.connect(b.address), b.connect(a.address)
        tx, rx, credit = _ring(a, b, ab, ba, 64)
        tx.bind(key)
        rx.bind(key)
        try:
            for i in range(3):
                _core.channel_send(key, bytes([i]) * 64)
                assert _core.channel_recv(key) == (i + 1, bytes([i]) * 64)
            big_tx, big_rx, big_credit = _ring(a, b, ab, ba, 4096)
            big_rx.bind(key, successor=True)  # the receiver's first (growth.py)
            big_tx.bind(key, successor=True)
            assert sorted(_core.bound_channels()) == [f"recv:{key}", f"send:{key}"]
            data = bytes(pattern(4096, SEED))
            assert _core.channel_send(key, data) == 1  # transfer 1 of the new ring
            assert _core.channel_recv(key) == (1, data)
            assert rx.credit_seq == 3 and credit.wait(0, 3, timeout=10) == 3  # marker kept
            for i in range(5):  # K=2: the new ring's credits come back
                _core.channel_send(key, data[i:])
                assert _core.channel_recv(key) == (i + 2, data[i:])
            assert big_credit.wait(0, 6, timeout=10) == 6
            with pytest.raises(rdmadev.BoundsError, match="larger than planned"):
                _core.channel_send(key, bytes(4097))
            assert _core.channel_counts(a) == {"senders": 1, "receivers": 0, "parked": 0, "retired": 0}
            assert _core.channel_counts(b) == {"senders": 0, "receivers": 1, "parked": 0, "retired": 0}
        finally:
            _core.unbind_channel(key)


def test_a_marker_without_a_receiving_successor_is_a_clear_error(fabric, secret):
    """A sender that moved while the receiver had no successor bound (the control plane binds
    the receiver's first): the receive names the problem instead of reading the new ring."""
    cfg = rdmadev.Config(fabric=fabric, secret=secret)
    key = f"grow-unbound-{fabric}"
    with rdmadev.open_domain("tx", cfg) as a, rdmadev.open_domain("rx", cfg) as b:
        ab, ba = a.connect(b.address), b.connect(a.address)
        pairs = [_ring(a, b, ab, ba, capacity)[:2] for capacity in (64, 128)]
        pairs[0][0].bind(key)
        pairs[0][1].bind(key)
        pairs[1][0].bind(key, successor=True)
        try:
            _core.channel_send(key, bytes(100))
            with pytest.raises(rdmadev.ProtocolError, match="larger ring that is not bound"):
                _core.channel_recv(key, timeout=10)
        finally:
            _core.unbind_channel(key)


def test_a_marker_that_could_not_be_written_is_written_by_the_next_send(fabric, secret):
    """The move's marker waits for a credit on the old ring like any transfer; a send whose
    marker times out (the receiver holds every old slot) leaves the move pending, and the
    next send writes the marker before its data: nothing reaches the larger ring first."""
    cfg = rdmadev.Config(fabric=fabric, secret=secret)
    key = f"grow-retry-{fabric}"
    with rdmadev.open_domain("tx", cfg) as a, rdmadev.open_domain("rx", cfg) as b:
        ab, ba = a.connect(b.address), b.connect(a.address)
        pairs = [_ring(a, b, ab, ba, capacity)[:2] for capacity in (64, 4096)]
        (tx, rx), (big_tx, big_rx) = pairs
        tx.bind(key)
        rx.bind(key)
        try:
            for i in range(2):
                _core.channel_send(key, bytes([i]) * 64)
            held = [rx.acquire(timeout=10)[0] for _ in range(2)]  # both old slots held
            big_rx.bind(key, successor=True)
            big_tx.bind(key, successor=True)
            with pytest.raises(rdmadev.DeadlineExceeded, match="credit"):
                _core.channel_send(key, bytes(4096), timeout=0.3)
            for seq in held:
                rx.release(seq)
            data = bytes(pattern(4096, SEED))
            assert _core.channel_send(key, data) == 1
            assert _core.channel_recv(key) == (1, data)
            assert _core.channel_counts(a) == {"senders": 1, "receivers": 0, "parked": 0, "retired": 0}
        finally:
            _core.unbind_channel(key)


def test_a_half_given_up_on_fails_its_waits_at_once_until_bound_or_retried(fabric, secret):
    """fail_half (half_pairs.py: a half pair whose peer task runs without rdmadev): a wait for
    that half fails at once with the reason and the fix; unfail_half makes it wait again, and
    a bind clears it."""
    cfg = rdmadev.Config(fabric=fabric, secret=secret)
    key = f"given-up-{fabric}"
    _core.fail_half(key, "recv", "the peer task does not answer", "start it with rdmadev")
    try:
        with pytest.raises(rdmadev.ConfigError, match=f"No receiver bound for channel '{key}': "
                           "the peer task does not answer") as e:
            _core.channel_recv(key, timeout=600)  # at once: the test would time out otherwise
        assert e.value.hint == "start it with rdmadev"
        with pytest.raises(rdmadev.DeadlineExceeded, match="No sender bound"):  # other half
            _core.channel_send(key, b"x", timeout=0.2)
        _core.unfail_half(key, "recv")
        with pytest.raises(rdmadev.DeadlineExceeded, match="No receiver bound"):
            _core.channel_recv(key, timeout=0.2)
        _core.fail_half(key, "recv", "given up again", "")
        with rdmadev.open_domain("tx", cfg) as a, rdmadev.open_domain("rx", cfg) as b:
            tx, rx, _ = _ring(a, b, a.connect(b.address), b.connect(a.address), 64)
            tx.bind(key)
            rx.bind(key)  # clears the failure
            try:
                _core.channel_send(key, bytes(64))
                assert _core.channel_recv(key, timeout=60) == (1, bytes(64))
            finally:
                _core.unbind_channel(key)
        with pytest.raises(rdmadev.DeadlineExceeded):  # unbound, and not failed any more
            _core.channel_recv(key, timeout=0.2)
        with pytest.raises(ValueError, match="'send' or 'recv'"):
            _core.fail_half(key, "both", "", "")
    finally:
        _core.unfail_half(key, "recv")


def test_a_broken_endpoint_takes_only_its_own_halves_with_a_peer(fabric, secret):
    """unbind_peer(via=endpoint) (recovery.py, when an endpoint dies): the halves with the
    peer task on that endpoint go and fail as lost; those with the same task on another
    endpoint (a peer restarted at once, its new instantiation set up already) carry on.
    Without `via`, every half with the task goes."""
    cfg = rdmadev.Config(fabric=fabric, secret=secret)
    keys = [f"broken-{fabric}-{i}" for i in range(2)]
    with rdmadev.open_domain("tx", cfg) as a, rdmadev.open_domain("rx", cfg) as b:
        endpoints = [(a.connect(b.address), b.connect(a.address)) for _ in keys]
        try:
            for key, (ab, ba) in zip(keys, endpoints):
                tx, rx, _ = _ring(a, b, ab, ba, 64)
                tx.bind(key, peer="rx")
                rx.bind(key, peer="tx")
            old, new = keys
            assert _core.unbind_peer(b, "tx", "the old one broke", via=endpoints[0][1]) == 1
            assert _core.unbind_peer(a, "rx", "the old one broke", via=endpoints[0][0]) == 1
            for send in (True, False):
                with pytest.raises(rdmadev.PeerLostError, match="the old one broke"):
                    if send:
                        _core.channel_send(old, bytes(8), timeout=600)  # at once
                    else:
                        _core.channel_recv(old, timeout=600)
            _core.channel_send(new, bytes(range(64)))
            assert _core.channel_recv(new, timeout=60) == (1, bytes(range(64)))
            assert _core.unbind_peer(b, "tx", "gone") == 1  # any endpoint
            with pytest.raises(rdmadev.PeerLostError, match="gone"):
                _core.channel_recv(new, timeout=600)
        finally:
            for key in keys:
                _core.unbind_channel(key)
                for half in ("send", "recv"):
                    _core.unfail_half(key, half)
