# cython: language_level=3, boundscheck=False, wraparound=False
"""Region: memory a peer can write into and read from (Domain.allocate())."""
from cpython.buffer cimport PyBUF_FORMAT
from libc.stdint cimport uint64_t
from libcpp.string cimport string

from rdmadev._native.c_common cimport (AtomicU64, Deadline, Liveness, WaitPolicy, WaitWord,
                                       as_bytes, deadline_of)

from rdmadev.errors import BoundsError, ClosedError

__all__ = ["Region"]


cdef class Region(Handle):
    """Memory a peer can write into and read from; see Domain.allocate().

    Supports the buffer protocol (numpy.frombuffer(region, ...)); the memory stays mapped
    while any view exists, even after close(). A context manager; close() is idempotent.
    """

    cdef CRegion* _get(self) except NULL:
        if not self.p or self.p.get().closed():
            raise ClosedError("Failed to use Region: it is closed")
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

    def quiet(self):
        """Nothing can be in flight to this region any more (no step ran on it): once it
        goes, its span of its chunk is taken again at once, not after a quarantine for late
        writes (_native/core/arena.h)."""
        self.p.get().Quiet()

    def grant(self, peer):
        """Lets the authenticated peer `peer` access the region (tcp checks grants)."""
        self._get().Grant(as_bytes(peer))

    def granted(self, peer):
        return self.p.get().Granted(as_bytes(peer))

    def load(self, uint64_t offset):
        """The 64-bit word at `offset` (8-aligned)."""
        return self._get().Word(offset).load()

    def store(self, uint64_t offset, uint64_t value):
        self._get().Word(offset).store(value)

    def wait(self, uint64_t offset, uint64_t target, timeout=None, peer=None,
             what="a sequence word"):
        """Blocks (GIL released) until the word at `offset` reaches `target`; returns it.

        Args:
            peer: the writer's Endpoint: the wait then also fails as soon as it dies (and
                uses its fabric's wait policy); Endpoint.wait_word() does that wait.

        Raises:
            DeadlineExceeded: at `timeout` seconds.
            PeerLostError: as soon as `peer` (the writer) is known to be dead.
        """
        if peer is not None:
            return peer.wait_word(self, offset, target, timeout, what)
        cdef AtomicU64* w = self._get().Word(offset)
        cdef Deadline dl = deadline_of(timeout)
        cdef string wh = as_bytes(what)
        cdef Liveness alive  # none: nobody to watch
        cdef uint64_t v
        with nogil:
            v = WaitWord(w, target, dl, self.policy, alive, wh)
        return v

    def close(self):
        """Revokes peer access (idempotent); memory is freed once no view remains."""
        if self.p and not self.p.get().closed() and self.dom:
            self.dom.get().Release(self.p.get().id())

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


cdef const unsigned char[::1] source_view(object src, uint64_t offset, uint64_t length, what):
    """The `length` bytes at `offset` of `src` (a Region of a domain, or any bytes-like object,
    as a TF tensor's memory) as one contiguous view, for a write's source.

    Raises:
        BoundsError: the bytes are outside `src`.
        ClosedError: `src` is a closed Region.
    """
    cdef string doing = as_bytes(what)
    if isinstance(src, Region):
        (<Region>src)._get().CheckRange(offset, length, doing.c_str())
    cdef const unsigned char[::1] view = memoryview(src).cast("B")
    if offset > <uint64_t>view.shape[0] or length > view.shape[0] - offset:
        raise BoundsError(f"Failed to {what}: bytes [{offset}, {offset + length}) are outside "
                          f"the {view.shape[0]}-byte buffer")
    return view[offset:offset + length]
