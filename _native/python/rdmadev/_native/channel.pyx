# cython: language_level=3, boundscheck=False, wraparound=False
"""Channels: RingLayout (where a ring's slots lie, as the plan laid them out) and the two
halves of a K-slot ring with credits, RingSender and RingReceiver; the process-wide table
the TF kernels find them in."""
from operator import index as _index

from libc.stdint cimport uint32_t, uint64_t
from libcpp.memory cimport shared_ptr
from libcpp.string cimport string
from libcpp.vector cimport vector

from rdmadev._native.handle cimport Handle
from rdmadev._native.c_channel cimport (BenchStreamRecv, BenchStreamSend, ChannelRegistry,
                                        Counts, CountedTransfers, Growth, Half, LeaseRegion, Receiver,
                                        RingLayout as CLayout,
                                        RingReceiver as CReceiver, RingSender as CSender, Sender,
                                        Slot as CSlot, TransferCounts, kBoth, kCreditBytes,
                                        kLateWriteGraceS, kLengthOffset, kParkedGraceS, kRecv,
                                        kReleasedGraceS, kSend, kSeqOffset, kShapeBlockOffset,
                                        kShapeDimBytes, kShapeDimsOffset, kShapeRankOffset,
                                        kSlotHeaderBytes)
from rdmadev._native.c_common cimport Deadline, as_bytes, deadline_of, kCacheLine
from rdmadev._native.c_fabric cimport Domain as CDomain, kSignalBytes
from rdmadev._native.domain cimport Domain
from rdmadev._native.endpoint cimport Endpoint, RemoteRegion
from rdmadev._native.region cimport Region, source_view

from rdmadev import errors as _errors

__all__ = ["RingLayout", "RingSender", "RingReceiver", "RegionLease", "CREDIT_BYTES",
           "PARKED_GRACE_S", "RELEASED_GRACE_S", "LATE_WRITE_GRACE_S",
           "wire_layout", "unbind_channel", "fail_half", "unfail_half", "unbind_domain",
           "unbind_peer", "release_drained", "bound_channels", "channel_send",
           "channel_recv", "channel_want", "channel_counts", "transfer_counts",
           "growing_channels", "half_held", "half_lost"]

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


cdef class RegionLease(Handle):
    """A hold on `region` that channel halves keep (RingSender/RingReceiver.bind(lease=...)):
    the region is released from its Domain (peers lose access; the memory goes with its last
    user) once the lease object and every half bound with it are gone.

    A context manager; close() (idempotent) drops this object's hold.
    """
    cdef shared_ptr[void] p

    def __cinit__(self, Region region):
        region._get()
        self.p = LeaseRegion(region.dom, region.p)

    @property
    def closed(self):
        return not self.p

    def close(self):
        self.p.reset()

#: Bytes of a sender's credit region (one cache line, the u64 credit word at +0).
CREDIT_BYTES = kCreditBytes
#: Seconds a sending half unbound before its receiver credited all it sent stays parked at
#: most (unbind_channel), and at most once its receiver said its half is unbound (registry.h
#: explains both figures).
PARKED_GRACE_S = kParkedGraceS
RELEASED_GRACE_S = kReleasedGraceS
#: Seconds a receiving half unbound on a fabric where a late write breaks the connection
#: (verbs) keeps its ring registered at most (unbind_channel; registry.h explains the figure).
LATE_WRITE_GRACE_S = kLateWriteGraceS


def wire_layout():
    """The byte positions the native protocol writes in a slot (from the C++ constants).

    Returns:
        {"seq_offset", "length_offset", "signal_bytes", "alignment", "slot_header_bytes",
        "shape_block_offset", "shape_rank_offset", "shape_dims_offset", "shape_dim_bytes"};
        a plan's ``layout`` must agree (the TF bridge refuses one that does not).
    """
    return {"seq_offset": kSeqOffset, "length_offset": kLengthOffset,
            "signal_bytes": kSignalBytes, "alignment": kCacheLine,
            "slot_header_bytes": kSlotHeaderBytes, "shape_block_offset": kShapeBlockOffset,
            "shape_rank_offset": kShapeRankOffset, "shape_dims_offset": kShapeDimsOffset,
            "shape_dim_bytes": kShapeDimBytes}


cdef class RingLayout:
    """Where a ring's slots lie in its region, exactly as the plan laid them out.

    The native ring never computes a stride: it takes this, validated (kConfig naming the
    bad field). graph_pass.layout.slot_bytes(capacity) gives slot_bytes and payload_offset.

    Example:
        >>> lay = RingLayout.of(transfer)  # any object with the five attributes
        >>> lay.header(1), lay.payload(1), lay.bytes
    """
    cdef CLayout c

    def __cinit__(self, slots, slot_bytes, payload_offset, capacity_bytes, offset=0):
        for field, v in (("slots", slots), ("slot_bytes", slot_bytes),
                         ("payload_offset", payload_offset), ("capacity_bytes", capacity_bytes),
                         ("offset", offset)):
            try:
                ok = 0 <= _index(v) <= (0xFFFFFFFF if field == "slots" else 0xFFFFFFFFFFFFFFFF)
            except TypeError:
                ok = False
            if not ok:
                raise _errors.ConfigError(
                    f"Failed to lay out ring: {field} = {v!r} is not a non-negative integer in range",
                    0, "build the layout from the plan (every swapped Transfer has all five fields)")
        self.c.slots = slots
        self.c.slot_bytes = slot_bytes
        self.c.payload_offset = payload_offset
        self.c.capacity = capacity_bytes
        self.c.base = offset
        self.c.Validate()

    @staticmethod
    def of(obj):
        """The layout of `obj` (a graph_pass Transfer, or anything with slots, slot_bytes,
        payload_offset, capacity_bytes and offset)."""
        return RingLayout(obj.slots, obj.slot_bytes, obj.payload_offset, obj.capacity_bytes,
                          obj.offset)

    @property
    def slots(self):
        return self.c.slots

    @property
    def slot_bytes(self):
        return self.c.slot_bytes

    @property
    def payload_offset(self):
        return self.c.payload_offset

    @property
    def capacity_bytes(self):
        return self.c.capacity

    @property
    def offset(self):
        return self.c.base

    @property
    def bytes(self):
        """Bytes the ring spans (slots * slot_bytes), from `offset`."""
        return self.c.bytes()

    def header(self, uint64_t i):
        """Region offset of slot i's header (its sequence word)."""
        return self.c.header(i)

    def payload(self, uint64_t i):
        """Region offset of slot i's payload."""
        return self.c.payload(i)

    def __eq__(self, other):
        if not isinstance(other, RingLayout):
            return NotImplemented
        return self._key() == (<RingLayout>other)._key()

    def __hash__(self):
        return hash(self._key())

    def _key(self):
        return (self.slots, self.slot_bytes, self.payload_offset, self.capacity_bytes, self.offset)

    def __repr__(self):
        return ("RingLayout(slots={}, slot_bytes={}, payload_offset={}, capacity_bytes={}, "
                "offset={})".format(*self._key()))


cdef class RingSender(Handle):
    """Sending half of a channel: writes into the receiver's `remote_ring` (a RemoteRegion)
    laid out by `layout` (a RingLayout); credits arrive in the local `credit_region`, in the
    CREDIT_BYTES line at `credit_offset` (the channels of a task pair share one region).

    A context manager; close() (idempotent) drops this handle (a binding made with bind()
    stays until unbind_channel(key)). Closed by its Domain's close().
    """
    cdef shared_ptr[CSender] sp
    cdef Endpoint endpoint
    cdef RemoteRegion ring
    cdef Region credit

    def __cinit__(self, Endpoint endpoint, RemoteRegion remote_ring, RingLayout layout,
                  Region credit_region, uint64_t epoch=0, uint64_t credit_offset=0):
        endpoint._get()
        remote_ring._get()
        credit_region._get()
        self.sp.reset(new CSender(endpoint.p, remote_ring.p, layout.c, credit_region.p,
                                  credit_offset, epoch, endpoint.policy))
        self.endpoint, self.ring, self.credit = endpoint, remote_ring, credit_region
        endpoint.domain._adopt_ring(self)

    cdef CSender* _get(self) except NULL:
        if not self.sp:
            raise _errors.ClosedError("Failed to use RingSender: it is closed")
        return self.sp.get()

    def bind(self, key, RegionLease lease=None, peer="", successor=False, reader=""):
        """Publishes this sender under channel `key` for the TF write kernel.

        Args:
            lease: held while bound (the pair's credit region goes with its last half).
            peer: the receiving task (a dead peer's halves are unbound, unbind_peer()).
            successor: bind it as the successor of `key`'s sender (growth: the write kernel
                moves to it before its next tensor).
            reader: the receiving task's domain identity ("job:index"), the only peer granted
                the stage of tensors larger than a slot ("": any authenticated peer).
        """
        cdef Sender entry
        self._get()
        entry.ring = self.sp
        entry.domain = self.endpoint.dom
        if lease is not None:
            entry.lease = lease.p
        entry.peer = as_bytes(peer)
        entry.reader = as_bytes(reader)
        if successor:
            ChannelRegistry.Global().BindSuccessor(as_bytes(key), entry)
        else:
            ChannelRegistry.Global().Bind(as_bytes(key), entry)

    @property
    def sent(self):
        return self._get().sent()

    @property
    def closed(self):
        return not self.sp

    def send(self, Region src, uint64_t offset, uint64_t length, timeout=30.0,
             bytes shape_block=b""):
        """Waits for a free slot, writes `shape_block` (a dynamic channel's: u64 rank, u64
        dims) and `length` bytes of `src`, and signals; returns seq."""
        src._get().CheckRange(offset, length, "send from region")
        cdef CSender* p = self._get()
        cdef const unsigned char* ptr = src.p.get().base() + offset
        cdef Deadline dl = deadline_of(timeout)
        cdef uint64_t n
        cdef const char* block = shape_block
        cdef uint64_t block_len = len(shape_block)
        with nogil:
            n = p.Send(ptr, length, dl, 0, block, block_len)
        return n

    def send_record(self, bytes record, timeout=30.0, bytes shape_block=b""):
        """Writes a staged transfer: `record` (a region descriptor, then u64 offset and u64
        length of the tensor in that region) and `shape_block`, as the TF write kernel does
        for a tensor larger than a slot; the receiver reads the tensor from that region
        before it releases the slot. Returns seq."""
        cdef CSender* p = self._get()
        cdef string rec = record
        cdef Deadline dl = deadline_of(timeout)
        cdef uint64_t n
        cdef const char* block = shape_block
        cdef uint64_t block_len = len(shape_block)
        with nogil:
            n = p.SendStaged(rec, dl, 0, block, block_len)
        return n

    def bench_stream(self, src, uint64_t size, uint64_t count, double timeout=120.0):
        """Benchmark loop in C++: `count` sends of the first `size` bytes of `src` (a Region,
        or any bytes-like object, as a TF tensor's memory), then waits for the last release.
        Seconds."""
        cdef const unsigned char[::1] view = source_view(src, 0, size, "stream")
        cdef const unsigned char* ptr = &view[0] if size else NULL
        cdef CSender* p = self._get()
        cdef double t
        with nogil:
            t = BenchStreamSend(p[0], ptr, size, count, self.credit.p.get()[0],
                                self.endpoint.policy, timeout)
        return t

    def close(self):
        self.sp.reset()


cdef class RingReceiver(Handle):
    """Receiving half of a channel over the local `ring_region` laid out by `layout`;
    credits go back through `endpoint` into the sender's `remote_credit` RemoteRegion, in its
    line at `credit_offset`.

    A context manager; close() (idempotent) drops this handle (a binding made with bind()
    stays until unbind_channel(key)). Closed by its Domain's close().
    """
    cdef shared_ptr[CReceiver] sp
    cdef Region _ring
    cdef Endpoint endpoint
    cdef RemoteRegion credit

    def __cinit__(self, Region ring_region, RingLayout layout, Endpoint endpoint,
                  RemoteRegion remote_credit, uint64_t epoch=0, uint64_t credit_offset=0):
        ring_region._get()
        endpoint._get()
        remote_credit._get()
        self.sp.reset(new CReceiver(ring_region.p, layout.c, endpoint.p, remote_credit.p,
                                    credit_offset, epoch, endpoint.policy))
        self._ring, self.endpoint, self.credit = ring_region, endpoint, remote_credit
        endpoint.domain._adopt_ring(self)

    cdef CReceiver* _get(self) except NULL:
        if not self.sp:
            raise _errors.ClosedError("Failed to use RingReceiver: it is closed")
        return self.sp.get()

    def bind(self, key, RegionLease lease=None, peer="", successor=False):
        """Publishes this receiver under channel `key` for the TF wait kernel.

        Args:
            lease: held while bound (the pair's ring region goes with its last half).
            peer: the sending task (a dead peer's halves are unbound, unbind_peer()).
            successor: bind it as the successor of `key`'s receiver (growth: the wait kernel
                moves to it when it takes the sender's marker).
        """
        cdef Receiver entry
        self._get()
        entry.ring = self.sp
        entry.domain = self.endpoint.dom
        if lease is not None:
            entry.lease = lease.p
        entry.peer = as_bytes(peer)
        if successor:
            ChannelRegistry.Global().BindSuccessor(as_bytes(key), entry)
        else:
            ChannelRegistry.Global().Bind(as_bytes(key), entry)

    @property
    def held(self):
        """Slots acquired and not yet released (e.g. aliased by live TF tensors)."""
        return self._get().held()

    @property
    def closed(self):
        return not self.sp

    def acquire(self, timeout=30.0):
        """Waits for the next transfer; returns (seq, offset in ring, length). The bytes
        stay valid (the sender cannot overwrite them) until release(seq)."""
        cdef CReceiver* p = self._get()
        cdef Deadline dl = deadline_of(timeout)
        cdef CSlot s
        with nogil:
            s = p.Acquire(dl)
        return s.seq, <uint64_t>(s.data - self._ring.p.get().base()), s.length

    def release(self, uint64_t seq, timeout=30.0):
        cdef CReceiver* p = self._get()
        cdef Deadline dl = deadline_of(timeout)
        with nogil:
            p.Release(seq, dl)

    @property
    def ring(self):
        """The local ring Region (slot payloads are read from it)."""
        return self._ring

    @property
    def credit_seq(self):
        return self._get().credit()

    def bench_stream(self, uint64_t count, double timeout=120.0):
        """Benchmark loop in C++: acquire + release `count` transfers. Seconds."""
        cdef CReceiver* p = self._get()
        cdef double t
        with nogil:
            t = BenchStreamRecv(p[0], count, timeout)
        return t

    def close(self):
        self.sp.reset()


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
        if moving_from.ring:
            moving_from.ring.get().SendMoved(dl)
            ChannelRegistry.Global().Moved(k)
        n = s.ring.get().Send(ptr, view.shape[0], dl, tag, NULL, 0)
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
        s = r.ring.get().Acquire(dl)
        while s.moved:
            r.ring.get().Retire()
            r = ChannelRegistry.Global().AdvanceReceiver(k)
            s = r.ring.get().Acquire(dl)
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
    r.ring.get().Want(nbytes)


def bound_channels():
    """['send:<key>' | 'recv:<key>', ...] bound in this process."""
    return [k.decode() for k in ChannelRegistry.Global().Keys()]
