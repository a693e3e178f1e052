"""One-sided write and read between two processes, every fabric, data checked."""
import numpy as np
import pytest

import rdmadev
from remote_ops import pattern

# 0 B and 1 B edges, an unaligned size past a page, a typical tensor, a large one.
SIZES = [0, 1, 4096 + 3, 1 << 20, 64 << 20]
# Offsets that are not multiples of anything convenient.
LOCAL_OFF, REMOTE_OFF = 5, 4096 + 11


def _connect_both(domain, peer):
    ep = domain.connect(peer.address)
    assert ep.fabric == domain.fabrics[0]
    peer.call("connect", "parent", domain.address)
    return ep


@pytest.mark.parametrize("size", SIZES, ids=lambda s: f"{s}B")
def test_write_lands_in_peer_region(domain, peer, size):
    ep = _connect_both(domain, peer)
    total = size + REMOTE_OFF + 64
    desc = peer.call("alloc", "dst", total)
    peer.call("fill", "dst", 99, 16)  # bytes 0..15 (the signal) stay zero
    remote = ep.attach(desc)
    src = domain.allocate(size + LOCAL_OFF)
    np.frombuffer(src, np.uint8, size, LOCAL_OFF)[:] = pattern(size, 7)

    ep.write(src, LOCAL_OFF, remote, REMOTE_OFF, size, signal=(0, 1, size))

    assert peer.call("wait", "dst", 0, 1, 30) == 1
    assert peer.call("matches", "dst", 7, REMOTE_OFF, size)
    # Bytes around the written range are untouched (the signal owns bytes 0..15).
    before = np.concatenate([np.zeros(16, np.uint8), pattern(total - 16, 99)])
    assert peer.call("matches_bytes", "dst", 16, before[16:REMOTE_OFF].tobytes())
    assert peer.call("matches_bytes", "dst", REMOTE_OFF + size,
                     before[REMOTE_OFF + size:].tobytes())


@pytest.mark.parametrize("size", SIZES, ids=lambda s: f"{s}B")
def test_read_fetches_peer_region(domain, peer, size):
    ep = _connect_both(domain, peer)
    desc = peer.call("alloc", "src", size + REMOTE_OFF)
    peer.call("fill", "src", 3)
    remote = ep.attach(desc)
    dst = domain.allocate(size + LOCAL_OFF)
    ep.read(remote, REMOTE_OFF, dst, LOCAL_OFF, size)
    want = pattern(size + REMOTE_OFF, 3)[REMOTE_OFF:]
    assert np.array_equal(np.frombuffer(dst, np.uint8, size, LOCAL_OFF), want)


def test_peer_writes_into_our_region(domain, peer):
    """The reverse direction: the peer process is the writer."""
    size = 1 << 20
    region = domain.allocate(size + 64)
    peer.call("connect", "parent", domain.address)
    peer.call("attach", "parent", "ours", region.descriptor)
    peer.call("alloc", "src", size)
    peer.call("fill", "src", 11)
    peer.call("write", "parent", "src", 0, "ours", 64, size, (0, 5, 0))
    assert region.wait(0, 5, timeout=30) == 5
    assert np.array_equal(np.frombuffer(region, np.uint8, size, 64), pattern(size, 11))


def test_out_of_range_is_refused_before_sending(domain, peer):
    ep = _connect_both(domain, peer)
    remote = ep.attach(peer.call("alloc", "dst", 4096))
    src = domain.allocate(8192)
    with pytest.raises(rdmadev.BoundsError, match="outside"):
        ep.write(src, 0, remote, 4000, 100)
    with pytest.raises(rdmadev.BoundsError, match="outside"):
        ep.write(src, 0, remote, 2**64 - 8, 16)  # offset + length overflows
    with pytest.raises(rdmadev.BoundsError, match="outside"):
        ep.read(remote, 0, src, 8190, 16)
    with pytest.raises(rdmadev.BoundsError, match="signal"):
        ep.write(src, 0, remote, 0, 8, signal=(4092, 1, 0))


def test_attach_rejects_garbage_descriptor(domain, peer):
    ep = _connect_both(domain, peer)
    with pytest.raises(rdmadev.ProtocolError, match="descriptor"):
        ep.attach(b"\x00" * 64)
    with pytest.raises(rdmadev.ProtocolError, match="descriptor"):
        ep.attach(b"short")


def test_closed_region_refuses_new_access(domain, peer):
    ep = _connect_both(domain, peer)
    desc = peer.call("alloc", "dst", 4096)
    peer.call("close_region", "dst")
    src = domain.allocate(64)
    with pytest.raises((rdmadev.PeerLostError, rdmadev.RegionError)):
        remote = ep.attach(desc)
        ep.write(src, 0, remote, 0, 8)
        ep.read(remote, 0, src, 0, 8)  # tcp: the peer refuses and disconnects


def test_region_views_outlive_close(domain):
    region = domain.allocate(4096)
    view = np.frombuffer(region, np.uint8)
    view[:] = 1
    region.close()
    region.close()  # idempotent
    assert region.closed
    assert view.sum() == 4096  # still mapped: no dangling memory
    with pytest.raises(rdmadev.ClosedError):
        region.descriptor
