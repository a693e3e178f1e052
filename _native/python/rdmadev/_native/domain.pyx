# cython: language_level=3, boundscheck=False, wraparound=False
"""Domain: this process's remote-device domain (regions, fabrics, identity, secret), and the
process-wide facts of the core (fabrics, error kinds, recent events)."""
import weakref

from libc.stdint cimport uint64_t
from libcpp.map cimport map
from libcpp.memory cimport shared_ptr
from libcpp.string cimport string
from libcpp.vector cimport vector

from rdmadev._native.handle cimport Handle
from rdmadev._native.c_common cimport (AtomicU64, Deadline, ErrnoHint, ErrorKindTable,
                                       RecentEvents, WaitPolicy)
from rdmadev._native.c_common cimport as_bytes, deadline_of
from rdmadev._native.c_fabric cimport (AliveOf, Domain as CDomain, DomainOptions,
                                       Endpoint as CEndpoint, FabricPriority,
                                       FabricUnviableReason, FeedFrames, PyProgressCallback,
                                       ServeResult, kStagingBytes)
from rdmadev._native.c_region cimport Region as CRegion
from rdmadev._native.endpoint cimport Endpoint
from rdmadev._native.region cimport Region

from rdmadev.errors import ClosedError

__all__ = ["Domain", "ANY_PEER", "VERBS_STAGING_BYTES", "error_kinds", "errno_hint",
           "fabric_priority", "unviable_reason", "recent_events"]

#: Grant to every authenticated peer (Domain.allocate(grant=...)).
ANY_PEER = "*"
#: Bytes of staging the verbs fabric registers for each peer endpoint, outside
#: RDMADEV_MAX_REGISTERED_BYTES (kStagingBytes; rdmadev.config keeps a copy).
VERBS_STAGING_BYTES = kStagingBytes


def error_kinds():
    """{name: value} of every native error kind (C++'s RDMADEV_ERROR_KINDS table)."""
    return {name.decode(): value for name, value in ErrorKindTable()}


def errno_hint(int err):
    """The core's fix-it hint for errno `err` when the errno alone says what to fix (out of
    file descriptors), else "": the hint every native error with that errno carries."""
    return ErrnoHint(err).decode()


def fabric_priority():
    """Fabric names, best first: the order in which two tasks pick a common fabric."""
    cdef vector[string] names = FabricPriority()
    return [f.decode() for f in names]


cdef map[string, string] _fabric_options(options) except *:
    cdef map[string, string] out
    for key, value in (options or {}).items():
        out[as_bytes(key)] = as_bytes(value)
    return out


def unviable_reason(name, options=None):
    """Why fabric `name` cannot run in this process with these fabric options ("<fabric>.<key>"
    -> text), or "" if it can. Raises ConfigError for an unknown fabric or a bad option."""
    return FabricUnviableReason(as_bytes(name), _fabric_options(options)).decode()


def recent_events():
    """The core's recent log lines (peer rejections, disconnects), oldest first."""
    return [l for l in RecentEvents().decode(errors="replace").split("\n") if l]


cdef class Domain(Handle):
    """This process's remote-device domain: its regions, fabrics, identity and secret.

    A context manager. close() (idempotent) closes what the domain made, children first, in
    this fixed order: channel halves (RingSender, RingReceiver) -> Endpoints (each closes its
    RemoteRegions first) -> Regions -> the native domain (stops serving peers, fails pending
    waits). The domain holds only weak references to its children; each child keeps its
    domain alive.

    Args:
        name: identity presented to peers (e.g. "worker:0").
        fabrics: fabric names to open (see fabric_priority()).
        secret: cluster secret (bytes/str) for authenticated fabrics (tcp).
        tcp_listen: "host:port" the tcp fabric listens on (port 0 picks a free one); the
            verbs fabric's connection side channel listens on the same host, any port.
        spin_us, yield_us: the wait policy (see rdmadev.config).
        fabric_options: {"<fabric>.<key>": text}, e.g. {"verbs.device": "rxe0"}; each fabric
            validates its own keys (see rdmadev.Config.fabric_options()).
        max_registered_bytes: region bytes past which a channel's sender stages no tensor
            (it sends in chunks instead); 0: no limit (RDMADEV_MAX_REGISTERED_BYTES).
        stage_below_slot_bytes: a channel's sender stages a tensor larger than its slots when
            they hold fewer bytes than this; 0: never (RDMADEV_STAGE_BELOW_SLOT_BYTES).
    """

    def __cinit__(self, name, fabrics, secret=b"", tcp_listen="127.0.0.1:0",
                  double spin_us=20, double yield_us=200, fabric_options=None,
                  uint64_t max_registered_bytes=0, uint64_t stage_below_slot_bytes=0):
        self._rings, self._endpoints, self._regions = (
            weakref.WeakSet(), weakref.WeakSet(), weakref.WeakSet())
        cdef DomainOptions o
        o.fabric_options = _fabric_options(fabric_options)
        o.name = as_bytes(name)
        o.secret = as_bytes(secret)
        for f in fabrics:
            o.fabrics.push_back(as_bytes(f))
        o.tcp_listen = as_bytes(tcp_listen)
        o.max_registered_bytes = max_registered_bytes
        o.stage_below_slot_bytes = stage_below_slot_bytes
        o.wait.spin_ns = <uint64_t>(spin_us * 1000)
        o.wait.yield_ns = <uint64_t>(yield_us * 1000)
        self.policy = o.wait
        with nogil:
            self.p = CDomain.Open(o)

    cdef CDomain* _get(self) except NULL:
        if not self.p or self.p.get().closed():
            raise ClosedError("Failed to use Domain: it is closed")
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

    @property
    def closed(self):
        return not self.p or self.p.get().closed()

    @property
    def region_stats(self):
        """(regions, bytes) this domain has allocated and not yet released."""
        return self._get().RegionStats()

    @property
    def chunk_stats(self):
        """{"chunks", "bytes", "quarantined"}: the chunks this domain has mapped, and
        registered with its fabrics, to hold its regions (idle ones go first), their bytes,
        and the bytes of spans quarantined for peers' late writes (_native/core/arena.h)."""
        c = self._get().ChunkStats()
        return {"chunks": c.chunks, "bytes": c.bytes, "quarantined": c.quarantined}

    def trim(self):
        """Lets the chunks go whose regions all went (their quarantine over)."""
        self._get().Trim()

    def allocate(self, uint64_t size, label="region", grant=(ANY_PEER,)):
        """Allocates a pre-faulted region of `size` bytes that `grant` peers may access. It
        is placed in a chunk of the regions granted to grant[0] (one mapping and one verbs
        registration for all of them: _native/core/arena.h)."""
        cdef CDomain* d = self._get()
        cdef string lab = as_bytes(label)
        grant = list(grant) or [ANY_PEER]
        cdef string peer = as_bytes(grant[0])
        cdef shared_ptr[CRegion] r
        with nogil:
            r = d.Allocate(size, lab, peer)
        for g in grant[1:]:
            r.get().Grant(as_bytes(g))
        reg = Region.__new__(Region)
        (<Region>reg).p = r
        (<Region>reg).dom = self.p
        (<Region>reg).policy = self.policy
        (<Region>reg).domain = self
        self._regions.add(reg)
        return reg

    def choose(self, address, fabric="auto"):
        """The fabric connect() would use to reach the peer at `address`."""
        return self._get().Choose(as_bytes(address), as_bytes(fabric)).decode()

    def connect(self, address, fabric="auto", timeout=30.0):
        """An Endpoint to the peer whose Domain.address is `address`."""
        cdef CDomain* d = self._get()
        cdef string a = as_bytes(address), f = as_bytes(fabric)
        cdef Deadline dl = deadline_of(timeout)
        cdef shared_ptr[CEndpoint] e
        with nogil:
            e = d.Connect(a, f, dl)
        ep = Endpoint.__new__(Endpoint)
        (<Endpoint>ep).p = e
        (<Endpoint>ep).dom = self.p
        (<Endpoint>ep).policy = self.policy
        (<Endpoint>ep).domain = self
        self._endpoints.add(ep)
        return ep

    def _adopt_ring(self, ring):
        """Called by RingSender/RingReceiver: close() closes it before the endpoints."""
        self._rings.add(ring)

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
        return d.progress().Submit(w, target, deadline_of(timeout), AliveOf(ep),
                                   PyProgressCallback(callback), <shared_ptr[void]>region.p,
                                   as_bytes(what))

    def cancel_wait(self, uint64_t ticket):
        """Ends a submitted wait as cancelled; False if it had already completed."""
        return self._get().progress().Cancel(ticket)

    @property
    def pending_waits(self):
        return self._get().progress().pending()

    def feed_frames(self, peer, data):
        """Runs the tcp receiving side's frame loop over `data` as if it came from the
        authenticated peer `peer` (for fuzzing). Returns (frames applied, rejection)."""
        cdef string p = as_bytes(peer), b = bytes(data)
        cdef ServeResult r
        cdef CDomain* d = self._get()
        with nogil:
            r = FeedFrames(d, p, b)
        return r.frames, r.rejected.decode(errors="replace")

    def close(self):
        """Closes the children (see the class docstring for the order), then the native
        domain. Idempotent."""
        for children in (self._rings, self._endpoints, self._regions):
            for child in list(children):
                child.close()
        if self.p:
            with nogil:
                self.p.get().Close()

    def __dealloc__(self):
        # Children keep their Domain alive, so none is left to close here; never raises.
        if self.p:
            with nogil:
                self.p.get().Close()
                self.p.reset()

    def __repr__(self):
        if self.closed:
            return "<rdmadev Domain (closed)>"
        return f"<rdmadev Domain {self.name!r} {self.address}>"
