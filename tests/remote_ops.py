"""Functions a RemotePeer runs in its own process: f(state, *args). state holds the
peer's Domain and the regions, endpoints and remote regions it made, by key."""
import numpy as np

from rdmadev.testing.pair import ring_layout


def pattern(n, seed):
    """n deterministic bytes for `seed` (both processes compute the same)."""
    return np.random.default_rng(seed).integers(0, 256, n, dtype=np.uint8)


def alloc(state, key, size, grant=("*",)):
    r = state["domain"].allocate(size, label=key, grant=grant)
    state["regions"][key] = r
    return r.descriptor


def fill(state, key, seed, offset=0, length=None):
    r = state["regions"][key]
    n = r.size - offset if length is None else length
    np.frombuffer(r, np.uint8, n, offset)[:] = pattern(n, seed)


def matches(state, key, seed, offset, length):
    r = state["regions"][key]
    return bool(np.array_equal(np.frombuffer(r, np.uint8, length, offset), pattern(length, seed)))


def digest(state, key):
    import hashlib
    return hashlib.sha256(memoryview(state["regions"][key])).hexdigest()


def connect(state, peer_key, address, fabric="auto"):
    ep = state["domain"].connect(address, fabric, timeout=30)
    state["endpoints"][peer_key] = ep
    return ep.fabric


def attach(state, peer_key, rkey, descriptor):
    state["remotes"][rkey] = state["endpoints"][peer_key].attach(descriptor)


def write(state, peer_key, key, loff, rkey, roff, n, signal=None):
    state["endpoints"][peer_key].write(state["regions"][key], loff, state["remotes"][rkey], roff,
                                       n, signal=signal)


def read(state, peer_key, rkey, roff, key, loff, n):
    state["endpoints"][peer_key].read(state["remotes"][rkey], roff, state["regions"][key], loff, n)


def wait(state, key, offset, target, timeout, peer_key=None):
    peer = state["endpoints"].get(peer_key) if peer_key else None
    return state["regions"][key].wait(offset, target, timeout=timeout, peer=peer)


def ring_rx_setup(state, key, slots, capacity):
    """Receiving half of a channel, step 1: allocate the ring; returns what the sender needs."""
    ring = state["domain"].allocate(ring_layout(slots, capacity).bytes, label=key)
    state["regions"][key] = ring
    return state["domain"].address, ring.descriptor


def ring_rx_connect(state, key, slots, capacity, sender_address, credit_desc, fabric="auto"):
    """Step 2: connect back to the sender for credits."""
    from rdmadev import RingReceiver
    ep = state["domain"].connect(sender_address, fabric, timeout=30)
    state["endpoints"][key] = ep
    state.setdefault("rings", {})[key] = RingReceiver(
        state["regions"][key], ring_layout(slots, capacity), ep, ep.attach(credit_desc))


def ring_rx_consume(state, key, count, seed, hold_every=0, hold_s=0.0, timeout=60.0):
    """Acquires `count` transfers; each must hold pattern(length, seed + seq) when acquired
    and still hold it after being held for hold_s (every hold_every-th one). Returns the
    list of sequence numbers whose bytes were wrong."""
    import time
    rx = state["rings"][key]
    ring = state["regions"][key]
    bad = []
    for i in range(count):
        seq, off, length = rx.acquire(timeout=timeout)
        want = pattern(length, seed + seq)
        view = np.frombuffer(ring, np.uint8, length, off)
        ok = np.array_equal(view, want)
        if hold_every and i % hold_every == 0:
            time.sleep(hold_s)
            ok = ok and np.array_equal(view, want)
        if not ok:
            bad.append(seq)
        del view
        rx.release(seq, timeout=timeout)
    return bad


def matches_bytes(state, key, offset, expected):
    r = state["regions"][key]
    return bytes(memoryview(r)[offset:offset + len(expected)]) == expected


def close_region(state, key):
    state["regions"][key].close()


def reset(state):
    """Drops every ring, remote region, endpoint and region this peer made, so the next test
    given the same peer process (conftest.peer) starts from a Domain alone."""
    for ring in state.pop("rings", {}).values():
        close = getattr(ring, "close", None)
        if close:
            close()
    state["remotes"].clear()
    for ep in state["endpoints"].values():
        ep.close()
    state["endpoints"].clear()
    for r in state["regions"].values():
        r.close()
    state["regions"].clear()
