"""Chunks (_native/core/arena.h): a Domain maps, and registers, memory once per chunk and
places the regions it grants one peer inside it. Real Domains on shm and tcp in this process,
counted from /proc/self/maps and the Domain's own counts."""
import gc
import struct
import time

import numpy as np
import pytest

import rdmadev

#: Descriptor v3 (region.h): ..., verbs addr, verbs rkey, reserved, offset in its chunk.
DESC = struct.Struct("<IIQQQIiQQQI4xQ")
PAGE = 4096


def offset_of(region):
    return DESC.unpack(region.descriptor)[-1]


def chunk_maps(name):
    """Mappings in this process of the chunks a Domain called `name` made (every peer's)."""
    with open("/proc/self/maps") as f:
        return sum(1 for line in f if f"/memfd:rdmadev:{name}/" in line)


def gone(regions):
    """Releases the regions of the list `regions` and empties it: with the test's last
    references gone, each region goes (its span back to its chunk)."""
    for region in regions:
        region.close()
    regions.clear()
    gc.collect()


@pytest.fixture
def shm():
    with rdmadev.Domain("owner", ["shm"]) as a, rdmadev.Domain("peer", ["shm"]) as b:
        yield a, b


def test_the_regions_of_one_peer_share_one_chunk_and_its_mapping(shm):
    a, b = shm
    before = chunk_maps("owner")
    mine = [a.allocate(5000, grant=["peer"]) for _ in range(8)]
    theirs = a.allocate(100, grant=["other"])
    assert a.chunk_stats["chunks"] == 2  # one per peer granted
    assert chunk_maps("owner") == before + 2
    offsets = sorted(offset_of(r) for r in mine)
    assert len(set(offsets)) == 8 and all(o % PAGE == 0 for o in offsets)
    assert all(y - x >= 2 * PAGE for x, y in zip(offsets, offsets[1:]))  # 5000 B: 2 pages each
    # the peer maps the chunk once, however many of its regions it attaches
    ep = b.connect(a.address)
    attached = [ep.attach(r.descriptor) for r in mine]
    assert chunk_maps("owner") == before + 3
    src = b.allocate(5000)
    np.frombuffer(src, np.uint8)[:] = 7
    for i, remote in enumerate(attached):
        ep.write(src, 0, remote, 0, 5000 - i)
    for i, r in enumerate(mine):  # each write landed in its own region, nowhere else
        view = np.frombuffer(r, np.uint8)
        assert (view[:5000 - i] == 7).all() and (view[5000 - i:] == 0).all()
    del attached, view
    gone(mine + [theirs])


def test_a_released_span_is_quarantined_unless_it_went_quietly_and_comes_back_zeroed(shm):
    a, _ = shm
    keep = [a.allocate(PAGE, grant=["peer"])]  # the chunk stays while the others come and go
    held = [a.allocate(3 * PAGE, grant=["peer"])]
    first = offset_of(held[0])
    np.frombuffer(held[0], np.uint8)[:] = 9
    gone(held)
    assert a.chunk_stats["quarantined"] == 3 * PAGE  # a peer's late write may still land
    held.append(a.allocate(3 * PAGE, grant=["peer"]))
    second = offset_of(held[0])
    assert second != first  # not while quarantined
    held[0].quiet()
    np.frombuffer(held[0], np.uint8)[:] = 9
    gone(held)
    held.append(a.allocate(3 * PAGE, grant=["peer"]))
    assert offset_of(held[0]) == second  # a quiet release's span is taken again at once
    assert not np.frombuffer(held[0], np.uint8).any()  # zeroed: sequence words read 0
    deadline = time.monotonic() + 10  # shm's late-write window is 2 s
    while a.chunk_stats["quarantined"] and time.monotonic() < deadline:
        time.sleep(0.1)
    assert a.chunk_stats["quarantined"] == 0
    gone(held + keep)


def test_an_idle_chunk_goes_with_its_mapping(shm):
    a, _ = shm
    before = chunk_maps("owner")
    regions = [a.allocate(10000, grant=["peer"]) for _ in range(4)]
    assert chunk_maps("owner") == before + 1
    for region in regions:
        region.quiet()
    del region
    gone(regions)
    assert a.chunk_stats == {"chunks": 0, "bytes": 0, "quarantined": 0}
    assert chunk_maps("owner") == before


def test_a_peers_chunks_double_so_they_stay_few(shm):
    a, _ = shm
    regions = [a.allocate(60 << 10, grant=["peer"]) for _ in range(64)]  # 3.75 MiB
    stats = a.chunk_stats
    # 64 KiB, 64 KiB, 128 KiB, ... : each chunk as large as the peer's chunks before it
    assert stats["chunks"] <= 8, stats
    assert stats["bytes"] <= 2 * 64 * (60 << 10) + (64 << 10) * 2, stats
    assert a.region_stats == (64, 64 * (60 << 10))
    gone(regions)


def test_a_new_chunk_takes_at_most_what_is_left_of_the_budget():
    budget, region = 256 << 10, 60 << 10
    with rdmadev.Domain("owner", ["shm"], max_registered_bytes=budget) as a:
        regions = [a.allocate(region, grant=["peer"]) for _ in range(4)]
        # chunks of 64, 68 and 116 KiB (what was left) hold three; the fourth gets a chunk of
        # its own pages, nothing was left (each chunk has one directory page more)
        stats = a.chunk_stats
        assert stats["chunks"] == 4 and stats["bytes"] <= budget + region + 4 * PAGE, stats
        regions.append(a.allocate(budget, grant=["peer"]))  # one region past all of it
        assert a.chunk_stats["bytes"] == stats["bytes"] + budget + PAGE
        gone(regions)


def test_a_closed_regions_descriptor_is_refused_on_attach(shm):
    a, b = shm
    r = a.allocate(PAGE, grant=["peer"])
    keep = a.allocate(PAGE, grant=["peer"])  # its chunk stays mapped
    ep = b.connect(a.address)
    desc = r.descriptor
    r.close()
    with pytest.raises(rdmadev.PeerLostError, match="closed it"):
        ep.attach(desc)
    ep.attach(keep.descriptor)  # its neighbour in the chunk is still live
    gone([keep])


def test_tcp_keeps_its_check_per_region():
    """On tcp the owner checks every frame against the region it names (id, key, grant),
    chunk or no chunk: a write to a released region of a live chunk is refused."""
    secret = b"s" * 32
    with rdmadev.Domain("owner", ["tcp"], secret=secret) as a, \
            rdmadev.Domain("peer", ["tcp"], secret=secret) as b:
        keep = a.allocate(PAGE, grant=["peer"])
        r = a.allocate(PAGE, grant=["peer"])
        assert a.chunk_stats["chunks"] == 1
        ep = b.connect(a.address)
        remote = ep.attach(r.descriptor)
        src = b.allocate(64)
        ep.write(src, 0, remote, 0, 8)
        r.close()
        with pytest.raises((rdmadev.PeerLostError, rdmadev.RegionError, rdmadev.ProtocolError)):
            ep.write(src, 0, remote, 0, 8)
            ep.read(remote, 0, src, 0, 8)  # the owner refuses and disconnects
        gone([keep])
