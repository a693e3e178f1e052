"""One lifetime scheme for every native object: a context manager with an idempotent
close(); use after close raises ClosedError naming the object; a Domain closes its children
(channel halves -> endpoints with their remote regions -> regions -> itself), holding only
weak references to them; nothing is raised from a destructor."""
import gc
import sys
import weakref

import pytest

import rdmadev
from rdmadev.testing.pair import ring_layout


@pytest.fixture
def world(fabric, secret):
    """Two domains with a channel from `a` to `b`; returns a dict of every object."""
    cfg = rdmadev.Config(fabric=fabric, secret=secret)
    a, b = rdmadev.open_domain("tx", cfg), rdmadev.open_domain("rx", cfg)
    layout = ring_layout(2, 64)
    ring = b.allocate(layout.bytes)
    credit = a.allocate(rdmadev.CREDIT_BYTES)
    ab, ba = a.connect(b.address), b.connect(a.address)
    remote_ring, remote_credit = ab.attach(ring.descriptor), ba.attach(credit.descriptor)
    objs = dict(a=a, b=b, ring=ring, credit=credit, ab=ab, ba=ba, remote_ring=remote_ring,
                remote_credit=remote_credit,
                tx=rdmadev.RingSender(ab, remote_ring, layout, credit),
                rx=rdmadev.RingReceiver(ring, layout, ba, remote_credit))
    yield objs
    a.close()
    b.close()


def _uses(o):
    """One call per object that needs it open."""
    return {
        "a": lambda: o["a"].allocate(64), "ring": lambda: o["ring"].load(0),
        "ab": lambda: o["ab"].attach(o["ring"].descriptor), "remote_ring": lambda: o["remote_ring"].size,
        "tx": lambda: o["tx"].send(o["credit"], 0, 8), "rx": lambda: o["rx"].acquire(timeout=1),
    }


NAMES = {"a": "Domain", "ring": "Region", "ab": "Endpoint", "remote_ring": "RemoteRegion",
         "tx": "RingSender", "rx": "RingReceiver"}


@pytest.mark.parametrize("key", list(NAMES))
def test_close_is_idempotent_and_use_after_close_names_the_object(world, key):
    obj = world[key]
    obj.close()
    obj.close()
    assert obj.closed
    with pytest.raises(rdmadev.ClosedError, match=f"Failed to use {NAMES[key]}: it is closed"):
        _uses(world)[key]()


def test_every_object_is_a_context_manager(world):
    for key in NAMES:
        with world[key] as obj:
            assert obj is world[key]
        assert obj.closed


def test_domain_close_closes_its_children(world):
    world["b"].close()
    for key in ("b", "ring", "ba", "remote_credit", "rx"):
        assert world[key].closed, key
    for key in ("a", "credit", "ab", "remote_ring", "tx"):
        assert not world[key].closed, key
    world["a"].close()
    for key in ("a", "credit", "ab", "remote_ring", "tx"):
        assert world[key].closed, key


def test_endpoint_close_closes_its_remote_regions(world):
    world["ab"].close()
    assert world["remote_ring"].closed and not world["remote_credit"].closed


def test_domain_holds_only_weak_references(fabric, secret):
    with rdmadev.open_domain("solo", rdmadev.Config(fabric=fabric, secret=secret)) as dom:
        region = dom.allocate(4096)
        ref = weakref.ref(region)
        del region
        gc.collect()
        assert ref() is None  # the domain did not keep it alive


def test_dropping_objects_without_close_raises_nothing(fabric, secret):
    seen = []
    old, sys.unraisablehook = sys.unraisablehook, seen.append
    try:
        dom = rdmadev.open_domain("dropped", rdmadev.Config(fabric=fabric, secret=secret))
        region = dom.allocate(4096)
        ep = dom.connect(dom.address)
        remote = ep.attach(region.descriptor)
        ref = weakref.ref(dom)
        del dom, region, ep, remote
        gc.collect()
        assert ref() is None  # nothing else held it; its destructor closed it
        gc.collect()
    finally:
        sys.unraisablehook = old
    assert seen == []
