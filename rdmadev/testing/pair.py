"""Two-process bootstrap over a multiprocessing pipe: how the demo, the benchmarks and
the tests set up a channel between processes before the control plane of the TF layer
exists. A real cluster exchanges the same addresses and descriptors over rdmadev's
authenticated control connections instead.

Example:
    >>> proc, conn = spawn(child_main, "tcp")     # child_main(conn, fabric) runs in the child
    >>> rx = ring_receiver(domain, conn, slots=2, capacity=1 << 20)
"""
import multiprocessing

from .._core import CREDIT_BYTES, LAYOUT, RegionLease, RingLayout, RingReceiver, RingSender
from ..errors import DeadlineExceeded, PeerLostError

__all__ = ["spawn", "ring_layout", "ring_receiver", "ring_sender", "bind_local", "recv", "stop"]


def spawn(target, *args):
    """Starts target(conn, *args) in a fresh interpreter; returns (process, parent conn)."""
    ctx = multiprocessing.get_context("spawn")
    parent, child = ctx.Pipe()
    proc = ctx.Process(target=target, args=(child,) + args, daemon=True)
    proc.start()
    child.close()
    return proc, parent


def recv(conn, timeout=60.0, proc=None):
    """conn.recv() with a deadline, failing fast if `proc` (the other side) died."""
    waited = 0.0
    step = 0.05
    while not conn.poll(step):
        waited += step
        if proc is not None and not proc.is_alive():
            raise PeerLostError(f"peer process {proc.pid} exited with code {proc.exitcode}",
                                hint="see the peer's stderr above")
        if waited >= timeout:
            raise DeadlineExceeded(f"no message from the peer process within {timeout:.0f} s")
    msg = conn.recv()
    if isinstance(msg, BaseException):
        raise msg
    return msg


def stop(proc, conn=None, timeout=10.0):
    """Asks the peer to finish (sends None), then makes sure it is gone."""
    if conn is not None:
        try:
            conn.send(None)
        except (OSError, ValueError):
            pass
    proc.join(timeout)
    if proc.is_alive():
        proc.kill()
        proc.join(timeout)


def ring_layout(slots, capacity, offset=0, rank=None):
    """The layout a plan would give a channel of `slots` slots of `capacity` payload bytes at
    `offset` of its region: a static one, or with `rank` a dynamic one whose shape block holds
    that many dims (graph_pass.layout)."""
    stride, payload_offset = LAYOUT.slot_bytes(capacity, rank)
    return RingLayout(slots, stride, payload_offset, capacity, offset)


def bind_local(tx, rx, key, layout, leased=False, endpoints=None):
    """Sets up a channel laid out by `layout` from Domain `tx` to Domain `rx`, both of this
    process, and binds both halves under `key` for the TF ops (no control plane: a channel
    bound by hand). Returns (RingSender, RingReceiver); unbind with _core.unbind_channel(key).
    `leased`: each half holds its region as the control plane's do, so the region leaves its
    Domain with the last user of the half (else with the Domain). `endpoints`: (tx to rx,
    rx to tx) to share with other channels, as a task pair's channels do (else new ones)."""
    ring, credit = rx.allocate(layout.bytes, label="ring"), tx.allocate(CREDIT_BYTES, label="credit")
    to_rx, to_tx = endpoints or (tx.connect(rx.address), rx.connect(tx.address))
    sender = RingSender(to_rx, to_rx.attach(ring.descriptor), layout, credit)
    receiver = RingReceiver(ring, layout, to_tx, to_tx.attach(credit.descriptor))
    sender.bind(key, lease=RegionLease(credit) if leased else None)
    receiver.bind(key, lease=RegionLease(ring) if leased else None)
    return sender, receiver


def ring_receiver(domain, conn, slots, capacity, fabric="auto", epoch=0, timeout=60.0, proc=None):
    """Receiving side: allocates the ring, sends (address, ring descriptor), receives the
    sender's (address, credit descriptor) and connects back for credits."""
    layout = ring_layout(slots, capacity)
    ring = domain.allocate(layout.bytes, label="ring")
    conn.send((domain.address, ring.descriptor))
    address, credit_desc = recv(conn, timeout, proc)
    ep = domain.connect(address, fabric, timeout=timeout)
    return RingReceiver(ring, layout, ep, ep.attach(credit_desc), epoch)


def ring_sender(domain, conn, slots, capacity, fabric="auto", epoch=0, timeout=60.0, proc=None):
    """Sending side, the counterpart of ring_receiver()."""
    address, ring_desc = recv(conn, timeout, proc)
    ep = domain.connect(address, fabric, timeout=timeout)
    credit = domain.allocate(CREDIT_BYTES, label="credit")
    conn.send((domain.address, credit.descriptor))
    return RingSender(ep, ep.attach(ring_desc), ring_layout(slots, capacity), credit, epoch)
