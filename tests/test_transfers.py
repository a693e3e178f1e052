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
    with pytest.raises(rdmadev.BoundsError, match="outside"):
        ep.write(bytes(8), 4, remote, 0, 8)  # a bytes-like source is checked the same way


# Sizes around verbs' staging (1 MiB pieces, 4 MiB in flight): twice through them all is
# past the staging's end, so its space is taken back and wraps around.
STAGED_SIZES = [0, 1, (1 << 20) + 3, 64 << 10, (3 << 20) + 1, 4096 + 5] * 2


def test_writes_from_any_memory_land_as_they_were_when_written(domain, peer):
    """A write from memory outside every region (what a TF send passes; verbs copies it into
    the endpoint's staging and returns before it lands) may be followed at once by other
    bytes in the same buffer: every write lands as it was, in order, including those mixed
    in from a region (verbs: written without a copy)."""
    ep = _connect_both(domain, peer)
    total = 64 + sum(STAGED_SIZES)
    remote = ep.attach(peer.call("alloc", "dst", total))
    buf = np.empty(max(STAGED_SIZES), np.uint8)
    region = domain.allocate(max(STAGED_SIZES))
    expected = np.zeros(total, np.uint8)
    off = 64
    for i, n in enumerate(STAGED_SIZES):
        src = np.frombuffer(region, np.uint8) if i % 4 == 3 else buf
        src[:n] = expected[off:off + n] = pattern(n, 100 + i)
        ep.write(region if i % 4 == 3 else buf, 0, remote, off, n, signal=(0, i + 1, n))
        src[:] = 0xEE  # the source is the caller's again as soon as write returns
        off += n
    assert peer.call("wait", "dst", 0, len(STAGED_SIZES), 60) == len(STAGED_SIZES)
    assert peer.call("matches_bytes", "dst", 64, expected[64:].tobytes())


def test_an_endpoint_closed_right_after_a_write_delivers_it(domain, peer):
    """Close lets writes still on their way land (verbs: it waits for their completions)."""
    ep = _connect_both(domain, peer)
    size = 8 << 20
    remote = ep.attach(peer.call("alloc", "dst", 64 + size))
    ep.write(pattern(size, 5), 0, remote, 64, size, signal=(0, 1, size))
    ep.close()
    assert peer.call("wait", "dst", 0, 1, 60) == 1
    assert peer.call("matches", "dst", 5, 64, size)


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
