# Raw declarations of _native/core/fabric.h and domain.h (endpoints, remote regions, the
# domain) and of the glue that turns endpoints and callables into core callbacks.
from libc.stdint cimport uint64_t
from libcpp cimport bool
from libcpp.map cimport map
from libcpp.memory cimport shared_ptr
from libcpp.string cimport string
from libcpp.utility cimport pair
from libcpp.vector cimport vector

from rdmadev._native.c_common cimport (Deadline, Liveness, Progress, ProgressCallback,
                                       WaitPolicy, raise_py_error)
from rdmadev._native.c_region cimport Region, RegionDesc


cdef extern from "verbs/verbs_send_queue.h" namespace "rdmadev":
    uint64_t kStagingBytes


cdef extern from "fabric.h" namespace "rdmadev":
    uint64_t kSignalBytes

    cdef cppclass Signal:
        uint64_t off
        uint64_t seq
        uint64_t aux

    cdef cppclass RemoteRegion:
        RegionDesc desc

    cdef cppclass Endpoint:
        string fabric()
        string peer()
        shared_ptr[RemoteRegion] Attach(const RegionDesc& desc) except +raise_py_error
        void Write(const void* src, const RemoteRegion& dst, uint64_t roff, uint64_t n,
                   const Signal* sig, const Deadline& deadline) except +raise_py_error nogil
        void Read(const RemoteRegion& src, uint64_t roff, void* dst, uint64_t n,
                  const Deadline& deadline) except +raise_py_error nogil
        bool Alive(string* why) nogil
        bool PeerAlive(string* why) nogil
        void SetSilent(const string& why)
        string Silent()
        void Close() nogil

    WaitPolicy PolicyFor(const WaitPolicy& base, const Endpoint* ep)
    string FabricUnviableReason(const string& name,
                                const map[string, string]& options) except +raise_py_error
    const vector[string]& FabricPriority()


cdef extern from "domain.h" namespace "rdmadev":
    cdef cppclass DomainOptions:
        string name
        string secret
        vector[string] fabrics
        string tcp_listen
        map[string, string] fabric_options
        WaitPolicy wait
        uint64_t max_registered_bytes
        uint64_t stage_below_slot_bytes

    cdef struct ChunkCounts:
        uint64_t chunks
        uint64_t bytes
        uint64_t quarantined

    cdef cppclass Domain:
        @staticmethod
        shared_ptr[Domain] Open(const DomainOptions& options) except +raise_py_error nogil
        const DomainOptions& options()
        string address()
        vector[string] fabric_names()
        shared_ptr[Region] Allocate(uint64_t size, const string& label,
                                    const string& peer) except +raise_py_error nogil
        void Release(uint64_t id)
        pair[uint64_t, uint64_t] RegionStats()
        ChunkCounts ChunkStats()
        void Trim()
        shared_ptr[Endpoint] Connect(const string& address, const string& fabric,
                                     const Deadline& deadline) except +raise_py_error nogil
        string Choose(const string& address, const string& fabric) except +raise_py_error
        Progress& progress()
        void Close() nogil
        bool closed()


cdef extern from "tcp/frame.h" namespace "rdmadev":
    cdef cppclass ServeResult:
        uint64_t frames
        string rejected


cdef extern from "tcp/tcp.h" namespace "rdmadev":
    ServeResult FeedFrames(Domain* domain, const string& peer, const string& data) except +raise_py_error nogil


cdef extern from "py_glue.h" namespace "rdmadev_py":
    ProgressCallback PyProgressCallback(object fn)
    Liveness AliveOf(const shared_ptr[Endpoint]& ep)
