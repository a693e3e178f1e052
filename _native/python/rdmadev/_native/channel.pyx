# cython: language_level=3, boundscheck=False, wraparound=False
"""Channels: RingLayout (where a ring's slots lie, as the plan laid them out) and the two
halves of a K-slot ring with credits, RingSender and RingReceiver, which bind() puts in the
process-wide table the TF kernels find them in (registry.pyx)."""
from operator import index as _index

from libc.stdint cimport uint64_t
from libcpp.memory cimport shared_ptr
from libcpp.string cimport string

from rdmadev._native.handle cimport Handle
from rdmadev._native.c_channel cimport (BenchStreamRecv, BenchStreamSend, ChannelRegistry,
                                        LeaseRegion, Receiver, RingLayout as CLayout,
                                        RingReceiver as CReceiver, RingSender as CSender, Sender,
                                        Slot as CSlot, kCreditBytes, kLengthBytes, kLengthOffset,
                                        kLittleEndian, kRegionAlignment, kSeqBytes, kSeqOffset,
                                        kShapeBlockOffset, kShapeDimBytes, kShapeDimsOffset,
                                        kShapeRankOffset, kSlotAlignment, kSlotHeaderBytes)
from rdmadev._native.c_common cimport Deadline, as_bytes, deadline_of
from rdmadev._native.c_fabric cimport Domain as CDomain
from rdmadev._native.domain cimport Domain
from rdmadev._native.endpoint cimport Endpoint, RemoteRegion
from rdmadev._native.region cimport Region, source_view

from rdmadev import errors as _errors

__all__ = ["RingLayout", "RingSender", "RingReceiver", "RegionLease", "CREDIT_BYTES",
           "wire_layout"]


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


def wire_layout():
    """The layout of receive regions the native protocol writes (channel.h's constants, their
    one definition), under the names of graph_pass.layout.Layout's fields: the planner lays
    regions out with it (rdmadev._core.LAYOUT).

    Returns:
        {"alignment", "slot_header_bytes", "seq_offset", "seq_bytes", "length_offset",
        "length_bytes", "shape_block_offset", "shape_rank_offset", "shape_dims_offset",
        "shape_dim_bytes", "region_alignment", "byte_order"}.
    """
    return {"alignment": kSlotAlignment, "slot_header_bytes": kSlotHeaderBytes,
            "seq_offset": kSeqOffset, "seq_bytes": kSeqBytes,
            "length_offset": kLengthOffset, "length_bytes": kLengthBytes,
            "shape_block_offset": kShapeBlockOffset, "shape_rank_offset": kShapeRankOffset,
            "shape_dims_offset": kShapeDimsOffset, "shape_dim_bytes": kShapeDimBytes,
            "region_alignment": kRegionAlignment, "byte_order": "little" if kLittleEndian else "big"}


cdef class RingLayout:
    """Where a ring's slots lie in its region, exactly as the plan laid them out.

    The native ring never computes a stride: it takes this, validated (kConfig naming the
    bad field). rdmadev._core.LAYOUT.slot_bytes(capacity) (graph_pass.layout.Layout) gives
    slot_bytes and payload_offset.

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
