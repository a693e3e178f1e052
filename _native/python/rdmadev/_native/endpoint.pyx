# cython: language_level=3, boundscheck=False, wraparound=False
"""Endpoint (a connection to one peer task over one fabric) and RemoteRegion (a peer's
region made addressable through it)."""
import weakref

from libc.stdint cimport uint64_t
from libcpp cimport bool as cbool
from libcpp.string cimport string

from rdmadev._native.c_common cimport (AtomicU64, Deadline, Liveness, WaitPolicy, WaitWord,
                                       as_bytes, deadline_of)
from rdmadev._native.c_fabric cimport AliveOf, PolicyFor, Signal
from rdmadev._native.c_region cimport Region as CRegion, RegionDesc
from rdmadev._native.region cimport Region, source_view

from rdmadev.errors import ClosedError

__all__ = ["Endpoint", "RemoteRegion"]


cdef class RemoteRegion(Handle):
    """A peer's region made addressable through an Endpoint (Endpoint.attach()).

    A context manager; close() (idempotent) drops it (shm: unmaps the peer's memory once no
    channel uses it). Closed by its Endpoint's close().
    """

    cdef CRemote* _get(self) except NULL:
        if not self.p:
            raise ClosedError("Failed to use RemoteRegion: it is closed")
        return self.p.get()

    @property
    def size(self):
        return self._get().desc.size

    @property
    def id(self):
        return self._get().desc.id

    @property
    def closed(self):
        return not self.p

    def close(self):
        self.p.reset()

    def __repr__(self):
        if not self.p:
            return "<rdmadev RemoteRegion (closed)>"
        return f"<rdmadev RemoteRegion id={self.id} size={self.size} via {self.endpoint!r}>"


cdef class Endpoint(Handle):
    """A connection to one peer task over one fabric; see Domain.connect().

    A context manager; close() (idempotent) closes the RemoteRegions attached through it,
    then the connection.
    """

    def __cinit__(self):
        self._remotes = weakref.WeakSet()

    cdef CEndpoint* _get(self) except NULL:
        if not self.p:
            raise ClosedError("Failed to use Endpoint: it is closed")
        return self.p.get()

    @property
    def fabric(self):
        return self._get().fabric().decode()

    @property
    def peer(self):
        return self._get().peer().decode()

    @property
    def closed(self):
        return not self.p

    def attach(self, descriptor):
        """Makes the peer's region (its Region.descriptor bytes) addressable here."""
        cdef RegionDesc d = RegionDesc.Decode(bytes(descriptor))
        rr = RemoteRegion.__new__(RemoteRegion)
        (<RemoteRegion>rr).p = self._get().Attach(d)
        (<RemoteRegion>rr).endpoint = self
        self._remotes.add(rr)
        return rr

    def write(self, local, uint64_t local_offset, RemoteRegion remote,
              uint64_t remote_offset, uint64_t length, signal=None, timeout=30.0):
        """One-sided write of `length` bytes of `local` at `local_offset` into `remote`.

        Args:
            local: a Region of this domain (verbs writes it without a copy, and returns when
                the write completed), or any bytes-like object (verbs copies it into the
                endpoint's staging and returns once posted; the fabric's writes land in order).
            signal: optional (offset, seq, aux): after the payload, the peer's region gets
                aux at offset+8 and then seq at offset with release ordering.
        """
        cdef const unsigned char[::1] view = source_view(local, local_offset, length,
                                                         "write from local region")
        cdef const unsigned char* src = &view[0] if length else NULL
        cdef Signal sig
        cdef Signal* psig = NULL
        if signal is not None:
            sig.off, sig.seq, sig.aux = signal
            psig = &sig
        cdef CRemote* dst = remote._get()
        cdef CEndpoint* e = self._get()
        cdef Deadline dl = deadline_of(timeout)
        with nogil:
            e.Write(src, dst[0], remote_offset, length, psig, dl)

    def read(self, RemoteRegion remote, uint64_t remote_offset, Region local,
             uint64_t local_offset, uint64_t length, timeout=30.0):
        """One-sided read of `length` bytes of `remote` into `local`."""
        cdef CRegion* dst = local._get()
        dst.CheckRange(local_offset, length, "read into local region")
        cdef CRemote* src = remote._get()
        cdef CEndpoint* e = self._get()
        cdef Deadline dl = deadline_of(timeout)
        with nogil:
            e.Read(src[0], remote_offset, dst.base() + local_offset, length, dl)

    def wait_word(self, Region region, uint64_t offset, uint64_t target, timeout=None,
                  what="a sequence word"):
        """Region.wait() for a word this peer writes: fails as soon as the peer is dead."""
        cdef AtomicU64* w = region._get().Word(offset)
        cdef CEndpoint* e = self._get()
        cdef Deadline dl = deadline_of(timeout)
        cdef string wh = as_bytes(what)
        cdef Liveness alive = AliveOf(self.p)
        cdef WaitPolicy policy = PolicyFor(region.policy, e)
        cdef uint64_t v
        with nogil:
            v = WaitWord(w, target, dl, policy, alive, wh)
        return v

    def alive(self):
        """(True, "") while the peer's process or connection lives, else (False, why): a
        peer that is gone never comes back on this endpoint. A silent one may (see silent)."""
        cdef string why
        cdef cbool ok = self._get().PeerAlive(&why)
        return bool(ok), why.decode()

    def set_silent(self, why):
        """Marks the peer silent (`why`: non-empty text naming it and the fix), or heard
        again (""). Waits on a silent peer go on, as TF's do; one that times out quotes `why`."""
        self._get().SetSilent(as_bytes(why))

    @property
    def silent(self):
        """Why the peer is marked silent, or "" (see set_silent)."""
        return self._get().Silent().decode()

    def close(self):
        """Closes the RemoteRegions attached through it, then the connection. Idempotent."""
        for rr in list(self._remotes):
            rr.close()
        if self.p:
            with nogil:
                self.p.get().Close()
            self.p.reset()

    def __repr__(self):
        return f"<rdmadev Endpoint {self.peer}>" if self.p else "<rdmadev Endpoint (closed)>"
