# Raw declarations of the C++ core (_native/core), one block per header.
from libc.stdint cimport uint32_t, uint64_t
from libcpp cimport bool
from libcpp.memory cimport shared_ptr
from libcpp.string cimport string
from libcpp.utility cimport pair
from libcpp.vector cimport vector
from cpython.object cimport PyObject


cdef extern from "py_glue.h" namespace "rdmadev_py":
    void raise_py_error() except *
    void SetErrorFactory(object f)


cdef extern from "<atomic>":
    cdef cppclass AtomicU64 "std::atomic<uint64_t>":
        uint64_t load() nogil
        void store(uint64_t v) nogil


cdef extern from "common.h" namespace "rdmadev":
    cdef cppclass Deadline:
        @staticmethod
        Deadline After(double seconds)
        @staticmethod
        Deadline Never()
    string RecentEvents()
    uint64_t kCacheLine
    vector[pair[string, int]] ErrorKindTable()


cdef extern from "region.h" namespace "rdmadev":
    cdef cppclass RegionDesc:
        uint64_t id
        uint64_t size
        string Encode()
        @staticmethod
        RegionDesc Decode(const string& b) except +raise_py_error

    cdef cppclass Region:
        unsigned char* base() nogil
        uint64_t size() nogil
        uint64_t id()
        const RegionDesc& desc()
        void Grant(const string& peer)
        bool Granted(const string& peer)
        void CheckRange(uint64_t off, uint64_t n, const char* what) except +raise_py_error
        AtomicU64* Word(uint64_t off) except +raise_py_error
        bool closed()


cdef extern from "completion.h" namespace "rdmadev":
    cdef cppclass WaitPolicy:
        uint64_t spin_ns
        uint64_t yield_ns
        uint64_t max_sleep_ns
        uint64_t liveness_every_ns

    cdef cppclass Liveness:
        pass

    cdef cppclass ProgressCallback "rdmadev::Progress::Callback":
        pass

    uint64_t WaitWord(const AtomicU64* word, uint64_t target, const Deadline& deadline,
                      const WaitPolicy& policy, const Liveness& alive,
                      const string& what) except +raise_py_error nogil

    cdef cppclass Progress:
        uint64_t Submit(const AtomicU64* word, uint64_t target, Deadline deadline, Liveness alive,
                        ProgressCallback done, shared_ptr[void] keepalive,
                        string what) except +raise_py_error
        bool Cancel(uint64_t ticket) except +raise_py_error
        size_t pending()


cdef extern from "fabric.h" namespace "rdmadev":
    cdef cppclass Signal:
        uint64_t off
        uint64_t seq
        uint64_t aux

    uint64_t kSignalBytes

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
        void Close() nogil

    WaitPolicy PolicyFor(const WaitPolicy& base, const Endpoint* ep)
    string FabricUnviableReason(const string& name)
    const vector[string]& FabricPriority()


cdef extern from "verbs/verbs_options.h" namespace "rdmadev":
    cdef cppclass VerbsOptions:
        string device
        int port
        int gid_index


cdef extern from "domain.h" namespace "rdmadev":
    cdef cppclass DomainOptions:
        string name
        string secret
        vector[string] fabrics
        string tcp_listen
        VerbsOptions verbs
        WaitPolicy wait

    cdef cppclass Domain:
        @staticmethod
        shared_ptr[Domain] Open(const DomainOptions& options) except +raise_py_error nogil
        const DomainOptions& options()
        string address()
        vector[string] fabric_names()
        shared_ptr[Region] Allocate(uint64_t size, const string& label) except +raise_py_error nogil
        void Release(uint64_t id)
        shared_ptr[Endpoint] Connect(const string& address, const string& fabric,
                                     const Deadline& deadline) except +raise_py_error nogil
        string Choose(const string& address, const string& fabric) except +raise_py_error
        Progress& progress()
        void Close() nogil
        bool closed()


cdef extern from "channel.h" namespace "rdmadev":
    uint64_t kCreditBytes
    uint64_t kSeqOffset
    uint64_t kLengthOffset
    uint64_t kSlotHeaderBytes

    cdef cppclass RingLayout:
        uint32_t slots
        uint64_t slot_bytes
        uint64_t payload_offset
        uint64_t capacity
        uint64_t base
        uint64_t bytes()
        uint64_t header(uint64_t i)
        uint64_t payload(uint64_t i)
        void Validate() except +raise_py_error

    cdef cppclass Slot:
        uint64_t seq
        const unsigned char* data
        uint64_t length

    cdef cppclass RingSender:
        RingSender(shared_ptr[Endpoint] ep, shared_ptr[RemoteRegion] ring, RingLayout layout,
                   shared_ptr[Region] credit, uint64_t epoch, WaitPolicy policy) except +raise_py_error
        uint64_t Send(const void* src, uint64_t n, const Deadline& d) except +raise_py_error nogil
        uint64_t sent()

    cdef cppclass RingReceiver:
        RingReceiver(shared_ptr[Region] ring, RingLayout layout, shared_ptr[Endpoint] ep,
                     shared_ptr[RemoteRegion] credit, uint64_t epoch,
                     WaitPolicy policy) except +raise_py_error
        Slot Acquire(const Deadline& d) except +raise_py_error nogil
        void Release(uint64_t seq, const Deadline& d) except +raise_py_error nogil
        uint64_t acquired()
        uint64_t credit()
        uint64_t held()


cdef extern from "registry.h" namespace "rdmadev":
    cdef cppclass Sender "rdmadev::ChannelRegistry::Sender":
        shared_ptr[RingSender] ring
        shared_ptr[Domain] domain

    cdef cppclass Receiver "rdmadev::ChannelRegistry::Receiver":
        shared_ptr[RingReceiver] ring
        shared_ptr[Domain] domain

    cdef cppclass ChannelRegistry:
        @staticmethod
        ChannelRegistry& Global()
        void Bind(const string& key, Sender s)
        void Bind(const string& key, Receiver r)
        void Unbind(const string& key)
        vector[string] Keys()


cdef extern from "tcp/frame.h" namespace "rdmadev":
    cdef cppclass ServeResult:
        uint64_t frames
        string rejected


cdef extern from "tcp/tcp.h" namespace "rdmadev":
    ServeResult FeedFrames(Domain* domain, const string& peer, const string& data) except +raise_py_error nogil


cdef extern from "bench.h" namespace "rdmadev":
    double BenchMemcpy(uint64_t size, uint64_t iters) nogil
    double BenchPingPong(Endpoint& ep, const RemoteRegion& peer, const Region& mine, uint64_t size,
                         uint64_t iters, bool initiator, const WaitPolicy& policy,
                         double timeout_s) except +raise_py_error nogil
    double BenchStreamSend(RingSender& tx, const Region& src, uint64_t size, uint64_t count,
                           const Region& credit, const WaitPolicy& policy,
                           double timeout_s) except +raise_py_error nogil
    double BenchStreamRecv(RingReceiver& rx, uint64_t count, double timeout_s) except +raise_py_error nogil
    double BenchTcpPingPong(int fd, uint64_t size, uint64_t iters, bool initiator) except +raise_py_error nogil
    double BenchTcpStream(int fd, uint64_t size, uint64_t count, bool sender) except +raise_py_error nogil


cdef extern from "py_glue.h" namespace "rdmadev_py":
    ProgressCallback PyProgressCallback(object fn)
    Liveness AliveOf(const shared_ptr[Endpoint]& ep)
