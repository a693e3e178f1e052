# cython: language_level=3, boundscheck=False, wraparound=False
"""Python face of rdmadev's remote-device core (C++, _native/core).

One class per native object. Every object is a context manager with an idempotent
close(); a parent keeps its children's native objects alive until they are closed, and
nothing is raised from a destructor. Data never passes through Python: calls that move
bytes or wait release the GIL.
"""
from cpython.buffer cimport PyBUF_FORMAT
from libc.stdint cimport uint64_t
from libcpp cimport bool as cbool
from libcpp.memory cimport shared_ptr
from libcpp.string cimport string
from libcpp.vector cimport vector

from rdmadev_core cimport (
    AliveOf, AtomicU64, ErrorKindTable, BenchMemcpy, BenchPingPong, BenchStreamRecv, BenchStreamSend,
    BenchTcpPingPong, BenchTcpStream, Deadline, Domain as CDomain, DomainOptions,
    Endpoint as CEndpoint, FabricPriority, Liveness, PolicyFor, FabricUnviableReason, FeedFrames,
    PyProgressCallback, RecentEvents, Region as CRegion, RegionDesc, RemoteRegion as CRemote,
    ChannelRegistry, Receiver, RingLayout as CLayout, RingReceiver as CReceiver, RingSender as CSender, Sender, ServeResult, SetErrorFactory,
    Signal, Slot as CSlot, WaitPolicy, WaitWord, kCacheLine, kCreditBytes, kLengthOffset,
    kSeqOffset, kSignalBytes, kSlotHeaderBytes,
)

from operator import index as _index

from rdmadev import errors as _errors



def error_kinds():
    """{name: value} of every native error kind (C++'s RDMADEV_ERROR_KINDS table)."""
    return {name.decode(): value for name, value in ErrorKindTable()}


_errors._bind_native_kinds(error_kinds())
SetErrorFactory(_errors._from_native)

__all__ = ["Domain", "Region", "Endpoint", "RemoteRegion", "RingSender", "RingReceiver",
           "unbind_channel", "bound_channels",
           "fabric_priority", "unviable_reason", "recent_events", "error_kinds", "RingLayout", "wire_layout", "CREDIT_BYTES", "ANY_PEER"]

ANY_PEER = "*"
#: Bytes of a sender's credit region (one cache line, the u64 credit word at +0).
CREDIT_BYTES = kCreditBytes


cdef Deadline _deadline(timeout):
    if timeout is None:
        return Deadline.Never()
    return Deadline.After(float(timeout))


cdef bytes _b(s):
    return s.encode() if isinstance(s, str) else bytes(s)


def fabric_priority():
    """Fabric names, best first: the order in which two tasks pick a common fabric."""
    cdef vector[string] names = FabricPriority()
    return [f.decode() for f in names]


def unviable_reason(name):
    """Why fabric `name` cannot run in this process, or "" if it can."""
    return FabricUnviableReason(_b(name)).decode()


def recent_events():
    """The core's recent log lines (peer rejections, disconnects), oldest first."""
    return [l for l in RecentEvents().decode(errors="replace").split("\n") if l]


def wire_layout():
    """The byte positions the native protocol writes in a slot (from the C++ constants).

    Returns:
        {"seq_offset", "length_offset", "signal_bytes", "alignment", "slot_header_bytes"};
        a plan's ``layout`` must agree (the TF bridge refuses one that does not).
    """
    return {"seq_offset": kSeqOffset, "length_offset": kLengthOffset,
            "signal_bytes": kSignalBytes, "alignment": kCacheLine,
            "slot_header_bytes": kSlotHeaderBytes}


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


cdef class Domain:
    """This process's remote-device domain: its regions, fabrics, identity and secret.

    Args:
        name: identity presented to peers (e.g. "worker:0").
        fabrics: fabric names to open (see fabric_priority()).
        secret: cluster secret (bytes/str) for authenticated fabrics (tcp).
        tcp_listen: "host:port" the tcp fabric listens on (port 0 picks a free one); the
            verbs fabric's connection side channel listens on the same host, any port.
        spin_us, yield_us: the wait policy (see rdmadev.config).
        verbs_device, verbs_port, verbs_gid_index: the RDMA device, port and GID for the
            verbs fabric ("", 0, -1: chosen automatically, see rdmadev.config).
    """
    cdef shared_ptr[CDomain] p
    cdef WaitPolicy policy
    cdef object __weakref__

    def __cinit__(self, name, fabrics, secret=b"", tcp_listen="127.0.0.1:0",
                  double spin_us=20, double yield_us=200, verbs_device="", int verbs_port=0,
                  int verbs_gid_index=-1):
        cdef DomainOptions o
        o.verbs.device = _b(verbs_device)
        o.verbs.port = verbs_port
        o.verbs.gid_index = verbs_gid_index
        o.name = _b(name)
        o.secret = _b(secret)
        for f in fabrics:
            o.fabrics.push_back(_b(f))
        o.tcp_listen = _b(tcp_listen)
        o.wait.spin_ns = <uint64_t>(spin_us * 1000)
        o.wait.yield_ns = <uint64_t>(yield_us * 1000)
        self.policy = o.wait
        with nogil:
            self.p = CDomain.Open(o)

    cdef CDomain* _get(self) except NULL:
        if not self.p or self.p.get().closed():
            raise _errors.ClosedError("Failed to use domain: it is closed")
        return self.p.get()

    @property
    def name(self):
        return self._get().options().name.decode()

    @property
    def address(self):
        """Every opened fabric's reach, best first ("shm=...;tcp=host:port")."""
        return self._get().address().decode()

    @property
    def fabrics(self):
        return [f.decode() for f in self._get().fabric_names()]

    def allocate(self, uint64_t size, label="region", grant=(ANY_PEER,)):
        """Allocates a pre-faulted region of `size` bytes that `grant` peers may access."""
        cdef CDomain* d = self._get()
        cdef string lab = _b(label)
        cdef shared_ptr[CRegion] r
        with nogil:
            r = d.Allocate(size, lab)
        for g in grant:
            r.get().Grant(_b(g))
        reg = Region.__new__(Region)
        (<Region>reg).p = r
        (<Region>reg).domain = self
        return reg

    def choose(self, address, fabric="auto"):
        """The fabric connect() would use to reach the peer at `address`."""
        return self._get().Choose(_b(address), _b(fabric)).decode()

    def connect(self, address, fabric="auto", timeout=30.0):
        """An Endpoint to the peer whose Domain.address is `address`."""
        cdef CDomain* d = self._get()
        cdef string a = _b(address), f = _b(fabric)
        cdef Deadline dl = _deadline(timeout)
        cdef shared_ptr[CEndpoint] e
        with nogil:
            e = d.Connect(a, f, dl)
        ep = Endpoint.__new__(Endpoint)
        (<Endpoint>ep).p = e
        (<Endpoint>ep).domain = self
        return ep

    def submit_wait(self, Region region, uint64_t offset, uint64_t target, callback,
                    timeout=None, Endpoint peer=None, what="a sequence word"):
        """Completes `callback(ok, value, kind, message)` on the progress thread once the
        word at `offset` of `region` reaches `target` (or at the deadline, when `peer`
        dies, or on cancel). Returns a ticket for cancel_wait()."""
        cdef CDomain* d = self._get()
        cdef AtomicU64* w = region._get().Word(offset)
        cdef shared_ptr[CEndpoint] ep
        if peer is not None:
            ep = peer.p
        return d.progress().Submit(w, target, _deadline(timeout), AliveOf(ep),
                                   PyProgressCallback(callback), <shared_ptr[void]>region.p,
                                   _b(what))

    def cancel_wait(self, uint64_t ticket):
        """Ends a submitted wait as cancelled; False if it had already completed."""
        return self._get().progress().Cancel(ticket)

    @property
    def pending_waits(self):
        return self._get().progress().pending()

    def feed_frames(self, peer, data):
        """Runs the tcp receiving side's frame loop over `data` as if it came from the
        authenticated peer `peer` (for fuzzing). Returns (frames applied, rejection)."""
        cdef string p = _b(peer), b = bytes(data)
        cdef ServeResult r
        cdef CDomain* d = self._get()
        with nogil:
            r = FeedFrames(d, p, b)
        return r.frames, r.rejected.decode(errors="replace")

    def close(self):
        """Stops serving peers, fails pending waits, revokes every region. Idempotent."""
        if self.p:
            with nogil:
                self.p.get().Close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __dealloc__(self):
        if self.p:
            with nogil:
                self.p.get().Close()
                self.p.reset()

    def __repr__(self):
        if not self.p or self.p.get().closed():
            return "<rdmadev Domain (closed)>"
        return f"<rdmadev Domain {self.name!r} {self.address}>"


cdef class Region:
    """Memory a peer can write into and read from; see Domain.allocate().

    Supports the buffer protocol (numpy.frombuffer(region, ...)); the memory stays mapped
    while any view exists, even after close().
    """
    cdef shared_ptr[CRegion] p
    cdef Domain domain

    cdef CRegion* _get(self) except NULL:
        if not self.p or self.p.get().closed():
            raise _errors.ClosedError("Failed to use region: it is closed")
        return self.p.get()

    @property
    def size(self):
        return self.p.get().size()

    @property
    def id(self):
        return self.p.get().id()

    @property
    def descriptor(self):
        """Bytes a peer passes to Endpoint.attach() to address this region."""
        return self._get().desc().Encode()

    @property
    def closed(self):
        return self.p.get().closed()

    def grant(self, peer):
        """Lets the authenticated peer `peer` access the region (tcp checks grants)."""
        self._get().Grant(_b(peer))

    def granted(self, peer):
        return self.p.get().Granted(_b(peer))

    def load(self, uint64_t offset):
        """The 64-bit word at `offset` (8-aligned)."""
        return self._get().Word(offset).load()

    def store(self, uint64_t offset, uint64_t value):
        self._get().Word(offset).store(value)

    def wait(self, uint64_t offset, uint64_t target, timeout=None, Endpoint peer=None,
             what="a sequence word"):
        """Blocks (GIL released) until the word at `offset` reaches `target`; returns it.

        Raises:
            DeadlineExceeded: at `timeout` seconds.
            PeerLostError: as soon as `peer` (the writer) is known to be dead.
        """
        cdef AtomicU64* w = self._get().Word(offset)
        cdef Deadline dl = _deadline(timeout)
        cdef shared_ptr[CEndpoint] ep
        cdef string wh = _b(what)
        cdef uint64_t v
        if peer is not None:
            ep = peer.p
        cdef Liveness alive = AliveOf(ep)
        cdef WaitPolicy policy = PolicyFor(self.domain.policy, ep.get())
        with nogil:
            v = WaitWord(w, target, dl, policy, alive, wh)
        return v

    def close(self):
        """Revokes peer access (idempotent); memory is freed once no view remains."""
        if self.p and not self.p.get().closed() and self.domain.p:
            self.domain.p.get().Release(self.p.get().id())

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __getbuffer__(self, Py_buffer* buf, int flags):
        cdef CRegion* r = self.p.get()
        buf.buf = r.base()
        buf.len = r.size()
        buf.readonly = 0
        buf.itemsize = 1
        if flags & PyBUF_FORMAT:
            buf.format = "B"
        else:
            buf.format = NULL
        buf.ndim = 1
        buf.shape = NULL
        buf.strides = NULL
        buf.suboffsets = NULL
        buf.internal = NULL
        buf.obj = self

    def __releasebuffer__(self, Py_buffer* buf):
        pass

    def __repr__(self):
        return f"<rdmadev Region id={self.id} size={self.size}{' closed' if self.closed else ''}>"


cdef class RemoteRegion:
    """A peer's region made addressable through an Endpoint (Endpoint.attach())."""
    cdef shared_ptr[CRemote] p
    cdef Endpoint endpoint

    @property
    def size(self):
        return self.p.get().desc.size

    @property
    def id(self):
        return self.p.get().desc.id

    def __repr__(self):
        return f"<rdmadev RemoteRegion id={self.id} size={self.size} via {self.endpoint.fabric}>"


cdef class Endpoint:
    """A connection to one peer task over one fabric; see Domain.connect()."""
    cdef shared_ptr[CEndpoint] p
    cdef Domain domain

    cdef CEndpoint* _get(self) except NULL:
        if not self.p:
            raise _errors.ClosedError("Failed to use endpoint: it is closed")
        return self.p.get()

    @property
    def fabric(self):
        return self._get().fabric().decode()

    @property
    def peer(self):
        return self._get().peer().decode()

    def attach(self, descriptor):
        """Makes the peer's region (its Region.descriptor bytes) addressable here."""
        cdef RegionDesc d = RegionDesc.Decode(bytes(descriptor))
        rr = RemoteRegion.__new__(RemoteRegion)
        (<RemoteRegion>rr).p = self._get().Attach(d)
        (<RemoteRegion>rr).endpoint = self
        return rr

    def write(self, Region local, uint64_t local_offset, RemoteRegion remote,
              uint64_t remote_offset, uint64_t length, signal=None, timeout=30.0):
        """One-sided write of `length` bytes of `local` into `remote`.

        Args:
            signal: optional (offset, seq, aux): after the payload, the peer's region gets
                aux at offset+8 and then seq at offset with release ordering.
        """
        cdef CRegion* src = local._get()
        src.CheckRange(local_offset, length, "write from local region")
        cdef Signal sig
        cdef Signal* psig = NULL
        if signal is not None:
            sig.off, sig.seq, sig.aux = signal
            psig = &sig
        cdef CEndpoint* e = self._get()
        cdef Deadline dl = _deadline(timeout)
        with nogil:
            e.Write(src.base() + local_offset, remote.p.get()[0], remote_offset, length, psig, dl)

    def read(self, RemoteRegion remote, uint64_t remote_offset, Region local,
             uint64_t local_offset, uint64_t length, timeout=30.0):
        """One-sided read of `length` bytes of `remote` into `local`."""
        cdef CRegion* dst = local._get()
        dst.CheckRange(local_offset, length, "read into local region")
        cdef CEndpoint* e = self._get()
        cdef Deadline dl = _deadline(timeout)
        with nogil:
            e.Read(remote.p.get()[0], remote_offset, dst.base() + local_offset, length, dl)

    def alive(self):
        """(True, "") while the peer is alive, else (False, why)."""
        cdef string why
        cdef cbool ok = self._get().Alive(&why)
        return bool(ok), why.decode()

    def close(self):
        if self.p:
            with nogil:
                self.p.get().Close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __repr__(self):
        return f"<rdmadev Endpoint {self.peer}>" if self.p else "<rdmadev Endpoint (closed)>"


cdef class RingSender:
    """Sending half of a channel: writes into the receiver's `remote_ring` (a RemoteRegion)
    laid out by `layout` (a RingLayout); credits arrive in the local `credit_region`
    (CREDIT_BYTES bytes)."""
    cdef shared_ptr[CSender] sp
    cdef CSender* p
    cdef Endpoint endpoint
    cdef RemoteRegion ring
    cdef Region credit

    def __cinit__(self, Endpoint endpoint, RemoteRegion remote_ring, RingLayout layout,
                  Region credit_region, uint64_t epoch=0):
        self.sp.reset(new CSender(endpoint.p, remote_ring.p, layout.c, credit_region.p, epoch,
                                  endpoint.domain.policy))
        self.p = self.sp.get()
        self.endpoint, self.ring, self.credit = endpoint, remote_ring, credit_region

    def bind(self, key):
        """Publishes this sender under channel `key` for the TF write kernel."""
        cdef Sender entry
        entry.ring = self.sp
        entry.domain = self.endpoint.domain.p
        ChannelRegistry.Global().Bind(_b(key), entry)

    @property
    def sent(self):
        return self.p.sent()

    def send(self, Region src, uint64_t offset, uint64_t length, timeout=30.0):
        """Waits for a free slot, writes `length` bytes of `src` and signals; returns seq."""
        src._get().CheckRange(offset, length, "send from region")
        cdef const unsigned char* ptr = src.p.get().base() + offset
        cdef Deadline dl = _deadline(timeout)
        cdef uint64_t n
        with nogil:
            n = self.p.Send(ptr, length, dl)
        return n

    def bench_stream(self, Region src, uint64_t size, uint64_t count, double timeout=120.0):
        """Benchmark loop in C++: `count` sends, then waits for the last release. Seconds."""
        cdef double t
        with nogil:
            t = BenchStreamSend(self.p[0], src.p.get()[0], size, count, self.credit.p.get()[0],
                                self.endpoint.domain.policy, timeout)
        return t


cdef class RingReceiver:
    """Receiving half of a channel over the local `ring_region` laid out by `layout`;
    credits go back through `endpoint` into the sender's `remote_credit` RemoteRegion."""
    cdef shared_ptr[CReceiver] sp
    cdef CReceiver* p
    cdef Region _ring
    cdef Endpoint endpoint
    cdef RemoteRegion credit

    def __cinit__(self, Region ring_region, RingLayout layout, Endpoint endpoint,
                  RemoteRegion remote_credit, uint64_t epoch=0):
        self.sp.reset(new CReceiver(ring_region.p, layout.c, endpoint.p, remote_credit.p, epoch,
                                    endpoint.domain.policy))
        self.p = self.sp.get()
        self._ring, self.endpoint, self.credit = ring_region, endpoint, remote_credit

    def bind(self, key):
        """Publishes this receiver under channel `key` for the TF wait kernel."""
        cdef Receiver entry
        entry.ring = self.sp
        entry.domain = self.endpoint.domain.p
        ChannelRegistry.Global().Bind(_b(key), entry)

    @property
    def held(self):
        """Slots acquired and not yet released (e.g. aliased by live TF tensors)."""
        return self.p.held()

    def acquire(self, timeout=30.0):
        """Waits for the next transfer; returns (seq, offset in ring, length). The bytes
        stay valid (the sender cannot overwrite them) until release(seq)."""
        cdef Deadline dl = _deadline(timeout)
        cdef CSlot s
        with nogil:
            s = self.p.Acquire(dl)
        return s.seq, <uint64_t>(s.data - self._ring.p.get().base()), s.length

    def release(self, uint64_t seq, timeout=30.0):
        cdef Deadline dl = _deadline(timeout)
        with nogil:
            self.p.Release(seq, dl)

    @property
    def ring(self):
        """The local ring Region (slot payloads are read from it)."""
        return self._ring

    @property
    def credit_seq(self):
        return self.p.credit()

    def bench_stream(self, uint64_t count, double timeout=120.0):
        """Benchmark loop in C++: acquire + release `count` transfers. Seconds."""
        cdef double t
        with nogil:
            t = BenchStreamRecv(self.p[0], count, timeout)
        return t


def unbind_channel(key):
    """Removes channel `key` from the process-wide table."""
    ChannelRegistry.Global().Unbind(_b(key))


def bound_channels():
    """['send:<key>' | 'recv:<key>', ...] bound in this process."""
    return [k.decode() for k in ChannelRegistry.Global().Keys()]


def bench_memcpy(uint64_t size, uint64_t iters):
    """Seconds for `iters` memcpy calls of `size` bytes (the physical reference)."""
    cdef double t
    with nogil:
        t = BenchMemcpy(size, iters)
    return t


def bench_pingpong(Endpoint ep, RemoteRegion peer, Region mine, uint64_t size, uint64_t iters,
                   bint initiator, double timeout=60.0):
    """Seconds for `iters` round trips of `size` bytes (payload at 64, signal at 0)."""
    cdef double t
    with nogil:
        t = BenchPingPong(ep.p.get()[0], peer.p.get()[0], mine.p.get()[0], size, iters,
                          initiator, ep.domain.policy, timeout)
    return t


def bench_tcp_pingpong(int fd, uint64_t size, uint64_t iters, bint initiator):
    """Seconds for `iters` raw TCP round trips on a connected blocking socket."""
    cdef double t
    with nogil:
        t = BenchTcpPingPong(fd, size, iters, initiator)
    return t


def bench_tcp_stream(int fd, uint64_t size, uint64_t count, bint sender):
    """Seconds to stream `count` messages of `size` bytes over raw TCP (then a 1-byte ack)."""
    cdef double t
    with nogil:
        t = BenchTcpStream(fd, size, count, sender)
    return t
