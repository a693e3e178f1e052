# cython: language_level=3, boundscheck=False, wraparound=False
"""The process-wide table of channel halves (registry.h), where RingSender/RingReceiver.bind()
put them and the TF kernels find them: unbinding (parked and retired halves), failing and
holding halves, counts, growth, and send/recv by key without TF (for tests and checks)."""
from libc.stdint cimport uint32_t, uint64_t
from libcpp.string cimport string
from libcpp.vector cimport vector

from rdmadev._native.c_channel cimport (ChannelRegistry, Counts, CountedTransfers, Growth, Half,
                                        Receiver, Sender, Slot as CSlot, TransferCounts, kBoth,
                                        kLateWriteGraceS, kParkedGraceS, kRecv, kReleasedGraceS,
                                        kSend, kVerdictWaitS)
from rdmadev._native.c_common cimport Deadline, as_bytes, deadline_of
from rdmadev._native.domain cimport Domain
from rdmadev._native.endpoint cimport Endpoint

from rdmadev import errors as _errors

__all__ = ["PARKED_GRACE_S", "RELEASED_GRACE_S", "LATE_WRITE_GRACE_S", "VERDICT_WAIT_S",
           "unbind_channel", "fail_half", "unfail_half", "keep_half_on_tf", "half_kept_on_tf",
           "half_held", "half_lost", "unbind_domain",
           "unbind_peer", "peer_verdict", "release_drained", "channel_counts", "transfer_counts", "growing_channels",
           "channel_send", "channel_recv", "channel_want", "bound_channels"]

#: Seconds a sending half unbound before its receiver credited all it sent stays parked at
#: most (unbind_channel), and at most once its receiver said its half is unbound (registry.h
#: explains both figures).
PARKED_GRACE_S = kParkedGraceS
RELEASED_GRACE_S = kReleasedGraceS
#: Seconds a receiving half unbound on a fabric where a late write breaks the connection
#: (verbs) keeps its ring registered at most (unbind_channel; registry.h explains the figure).
LATE_WRITE_GRACE_S = kLateWriteGraceS
#: Seconds a kernel finding its half lost to a broken connection waits for the control
#: plane's verdict on the peer at most (peer_verdict; registry.h explains the figure).
VERDICT_WAIT_S = kVerdictWaitS

_HALVES = {"send": kSend, "recv": kRecv, "both": kBoth}


cdef Half _half(name) except *:
    try:
        return _HALVES[name]
    except KeyError:
        raise _errors.ConfigError(f"channel half {name!r} is not one of {sorted(_HALVES)}") from None


cdef Half _one_half(name) except *:
    """_half for "send" or "recv" only (a kernel holds, is failed or is lost on one half)."""
    if name not in ("send", "recv"):
        raise ValueError(f"half must be 'send' or 'recv', not {name!r}")
    return _half(name)


def unbind_channel(key, half="both", park_s=PARKED_GRACE_S):
    """Removes `half` ("send", "recv" or "both") of channel `key` from the process-wide table;
    returns how many halves went. A sending half whose receiver has not credited all it sent
    (it may still read the half's stage or write a credit) is parked, its memory kept, until
    it has (release_drained) or for `park_s` seconds at most. A receiving half whose sender
    may still write, on a fabric where a write to a released ring breaks the connection
    (verbs), is retired: its ring stays registered for min(`park_s`, LATE_WRITE_GRACE_S).
    A half of `key` parked or retired earlier gets at most `park_s` more."""
    return ChannelRegistry.Global().Unbind(as_bytes(key), _half(half), park_s)


def fail_half(key, half, why, hint=""):
    """Gives up on `half` ("send" or "recv") of channel `key` until it is bound or
    unfail_half(): a TF kernel waiting for it fails at once (InvalidArgument: "No <half>
    bound for channel '<key>': <why>", then `hint`) instead of at its deadline."""
    ChannelRegistry.Global().Fail(as_bytes(key), _one_half(half), as_bytes(why), as_bytes(hint))


def unfail_half(key, half):
    """Undoes fail_half(key, half): kernels wait for the half again (it is being set up)."""
    ChannelRegistry.Global().Unfail(as_bytes(key), _half(half))


def keep_half_on_tf(key, half):
    """Keeps `half` ("send" or "recv") of the half pair `key` on TF's own path for as long as
    this process lives: a TF kernel waiting for it, or running it from now on, carries its
    tensor through the step's rendezvous, as TF's own _Send/_Recv would (registry.h KeepOnTf).
    channel_send/channel_recv refuse it."""
    ChannelRegistry.Global().KeepOnTf(as_bytes(key), _one_half(half))


def half_kept_on_tf(key, half):
    """Whether keep_half_on_tf(key, half) was called in this process."""
    return ChannelRegistry.Global().KeptOnTf(as_bytes(key), _one_half(half))


cdef _refuse_kept(key, half):
    raise _errors.ProtocolError(f"the {half} half of channel {key!r} is kept on TF's path "
                                "(keep_half_on_tf): no rdmadev half carries it")


def half_held(key, half):
    """Whether a TF kernel holds `half` ("send" or "recv") of channel `key` in this process:
    a half pair whose graph TF still runs (the ops' `owned` attr)."""
    return ChannelRegistry.Global().Held(as_bytes(key), _one_half(half))


def half_lost(key, half):
    """Whether `half` ("send" or "recv") of channel `key` is unbound here because its
    connection broke, and neither bound again nor let go by its kernels since."""
    return ChannelRegistry.Global().Lost(as_bytes(key), _one_half(half))


def unbind_domain(Domain domain):
    """Unbinds every channel half bound through `domain`; returns how many went."""
    return ChannelRegistry.Global().UnbindDomain(domain.p.get())


def unbind_peer(Domain domain, peer, why="its peer task is gone", Endpoint via=None):
    """Unbinds every half bound through `domain` whose peer is task `peer` (with `via`: only
    those on that endpoint, the one that broke); returns how many. Until one is bound again,
    a kernel or channel_send/recv looking for it fails at once (PeerLostError, TF's
    Unavailable: "No sender/receiver bound for channel ...: <why>")."""
    return ChannelRegistry.Global().UnbindPeer(domain.p.get(), as_bytes(peer), as_bytes(why),
                                               via.p.get() if via is not None else NULL)


def peer_verdict(Domain domain, peer, gone=None):
    """The control plane's verdict on task `peer`, whose halves on `domain` unbind_peer
    marked lost: `gone` None, it still runs (a kernel finding one of them lost fails as a
    transient error); else why it does not (died, restarted, does not answer), which such a
    kernel fails with, naming the task as TF's gRPC does for TF's ClusterCoordinator
    (registry.h PeerVerdict). Returns how many lost halves it judged."""
    return ChannelRegistry.Global().PeerVerdict(domain.p.get(), as_bytes(peer),
                                                as_bytes(gone or ""))


def release_drained():
    """Releases the sending halves parked by unbind_channel whose receiver has credited all
    they sent since, and the parked or retired halves whose time is up or whose Domain
    closed; returns how many went. The control plane's watcher calls it."""
    return ChannelRegistry.Global().ReleaseDrained()


def channel_counts(Domain domain=None):
    """{"senders", "receivers", "parked", "retired"} bound through `domain` (None: every
    domain); parked: sending halves unbound before their receiver credited all they sent,
    kept until it has (release_drained); retired: receiving halves unbound, their ring kept
    registered for their sender's late writes (verbs)."""
    cdef Counts c = ChannelRegistry.Global().CountsFor(domain.p.get() if domain is not None else NULL)
    return {"senders": c.senders, "receivers": c.receivers, "parked": c.parked,
            "retired": c.retired}


def transfer_counts():
    """{"sent", "received", "discarded", "abandoned", "superseded", "grown", "staged",
    "stages", "warm"}: transfers completed by every channel of this process; of the received, those
    discarded unread (left by a failed step), receives that ended without a transfer
    (cancelled, timed out), and receives whose place a later step's receive took (their step
    had been given up by its caller, or calls overlapped);
    larger rings registered for this process's receivers (growth: each a re-registration);
    tensors sent staged (larger than a slot, read by the receiver) and the stage regions
    registered for them (each a registration); received tensors of at least 32 MiB copied
    into an output buffer kept from an earlier step instead of fresh memory (where TF's CPU
    allocator is malloc; the TF ops' warm.h)."""
    cdef TransferCounts c = CountedTransfers()
    return {"sent": c.sent, "received": c.received, "discarded": c.discarded,
            "abandoned": c.abandoned, "superseded": c.superseded, "grown": c.grown, "staged": c.staged, "stages": c.stages,
            "warm": c.warm}


def growing_channels(Domain domain):
    """The receiving halves bound through `domain` whose tensors outgrew their slots and
    have no successor yet: ``[{"key", "peer", "wanted", "slots", "capacity_bytes",
    "rank_capacity"}]`` (wanted: the largest tensor that arrived in chunks, in bytes)."""
    cdef vector[Growth] found = ChannelRegistry.Global().Growing(domain.p.get())
    return [{"key": g.key.decode(), "peer": g.peer.decode(), "wanted": g.wanted,
             "slots": g.layout.slots, "capacity_bytes": g.layout.capacity,
             "rank_capacity": g.layout.rank_capacity()} for g in found]


def channel_send(key, data, timeout=30.0, uint32_t tag=0):
    """Sends `data` (bytes-like) on the sending half bound under `key` in this process (what
    the TF write kernel does, without TF: for tests and checks), with step tag `tag` (0:
    untagged, as an eager op); moves to the half's successor first if one is bound (the
    marker on the old ring). Returns the sequence number.

    Raises:
        DeadlineExceeded: no half bound under `key`, or no free slot, within `timeout`.
    """
    cdef const unsigned char[::1] view = memoryview(data).cast("B")
    cdef string k = as_bytes(key)
    cdef Deadline dl = deadline_of(timeout)
    cdef Sender s, moving_from
    cdef uint64_t n
    cdef const unsigned char* ptr = &view[0] if view.shape[0] else NULL
    with nogil:
        s = ChannelRegistry.Global().FindSender(k, dl, &moving_from)
        if s.ring:
            if moving_from.ring:
                moving_from.ring.get().SendMoved(dl)
                ChannelRegistry.Global().Moved(k)
            n = s.ring.get().Send(ptr, view.shape[0], dl, tag, NULL, 0)
    if not s.ring:
        _refuse_kept(key, "send")
    return n


def channel_recv(key, timeout=30.0):
    """Receives the next transfer on the receiving half bound under `key` in this process
    (what the TF wait kernel does, without TF), following the sender to the successor ring
    when it moved. Returns (seq, bytes)."""
    cdef string k = as_bytes(key)
    cdef Deadline dl = deadline_of(timeout)
    cdef Receiver r
    cdef CSlot s
    with nogil:
        r = ChannelRegistry.Global().FindReceiver(k, dl)
        if r.ring:
            s = r.ring.get().Acquire(dl)
            while s.moved:
                r.ring.get().Retire()
                r = ChannelRegistry.Global().AdvanceReceiver(k)
                s = r.ring.get().Acquire(dl)
    if not r.ring:
        _refuse_kept(key, "recv")
    try:
        return s.seq, bytes((<const char*>s.data)[:s.length])
    finally:
        with nogil:
            r.ring.get().Release(s.seq, dl)


def channel_want(key, uint64_t nbytes):
    """Records on the receiving half bound under `key` in this process that a tensor of
    `nbytes` arrived in chunks (what the TF wait kernel does after gathering one, without
    TF): its task's control plane then grows the channel (growing_channels())."""
    cdef string k = as_bytes(key)
    cdef Deadline dl = deadline_of(0)
    cdef Receiver r = ChannelRegistry.Global().FindReceiver(k, dl)
    if not r.ring:
        _refuse_kept(key, "recv")
    r.ring.get().Want(nbytes)


def bound_channels():
    """['send:<key>' | 'recv:<key>', ...] bound in this process."""
    return [k.decode() for k in ChannelRegistry.Global().Keys()]
