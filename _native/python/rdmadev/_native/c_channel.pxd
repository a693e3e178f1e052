# Raw declarations of _native/core/channel.h, registry.h and bench.h.
from libc.stdint cimport uint8_t, uint32_t, uint64_t
from libcpp cimport bool
from libcpp.memory cimport shared_ptr
from libcpp.string cimport string
from libcpp.vector cimport vector

from rdmadev._native.c_common cimport Deadline, WaitPolicy, raise_py_error
from rdmadev._native.c_fabric cimport Domain, Endpoint, RemoteRegion
from rdmadev._native.c_region cimport Region


cdef extern from "channel.h" namespace "rdmadev":
    uint64_t kCreditBytes
    uint64_t kSlotAlignment
    uint64_t kSlotHeaderBytes
    uint64_t kSeqOffset
    uint64_t kSeqBytes
    uint64_t kLengthOffset
    uint64_t kLengthBytes
    uint64_t kShapeBlockOffset
    uint64_t kShapeRankOffset
    uint64_t kShapeDimsOffset
    uint64_t kShapeDimBytes
    uint64_t kRegionAlignment
    bool kLittleEndian

    cdef cppclass RingLayout:
        uint32_t slots
        uint64_t slot_bytes
        uint64_t payload_offset
        uint64_t capacity
        uint64_t base
        uint64_t bytes()
        uint64_t rank_capacity()
        uint64_t header(uint64_t i)
        uint64_t payload(uint64_t i)
        void Validate() except +raise_py_error

    cdef cppclass Slot:
        uint64_t seq
        const unsigned char* data
        uint64_t length
        bool moved

    cdef cppclass TransferCounts:
        uint64_t sent
        uint64_t received
        uint64_t discarded
        uint64_t abandoned
        uint64_t superseded
        uint64_t grown
        uint64_t staged
        uint64_t stages
        uint64_t warm

    TransferCounts CountedTransfers()

    cdef cppclass RingSender:
        RingSender(shared_ptr[Endpoint] ep, shared_ptr[RemoteRegion] ring, RingLayout layout,
                   shared_ptr[Region] credit, uint64_t credit_offset, uint64_t epoch,
                   WaitPolicy policy) except +raise_py_error
        uint64_t Send(const void* src, uint64_t n, const Deadline& d, uint32_t tag,
                      const void* shape, uint64_t shape_len) except +raise_py_error nogil
        uint64_t SendStaged(const string& record, const Deadline& d, uint32_t tag,
                            const void* shape, uint64_t shape_len) except +raise_py_error nogil
        uint64_t SendMoved(const Deadline& d) except +raise_py_error nogil
        uint64_t sent()

    cdef cppclass RingReceiver:
        RingReceiver(shared_ptr[Region] ring, RingLayout layout, shared_ptr[Endpoint] ep,
                     shared_ptr[RemoteRegion] credit, uint64_t credit_offset, uint64_t epoch,
                     WaitPolicy policy) except +raise_py_error
        Slot Acquire(const Deadline& d) except +raise_py_error nogil
        void Release(uint64_t seq, const Deadline& d) except +raise_py_error nogil
        void Retire() nogil
        void Want(uint64_t n) nogil
        uint64_t acquired()
        uint64_t credit()
        uint64_t held()


cdef extern from "registry.h" namespace "rdmadev":
    double kParkedGraceS
    double kReleasedGraceS
    double kLateWriteGraceS
    double kVerdictWaitS
    shared_ptr[void] LeaseRegion(const shared_ptr[Domain]& domain, const shared_ptr[Region]& region)

    cdef enum Half "rdmadev::ChannelRegistry::Half":
        kSend "rdmadev::ChannelRegistry::kSend"
        kRecv "rdmadev::ChannelRegistry::kRecv"
        kBoth "rdmadev::ChannelRegistry::kBoth"

    cdef cppclass Sender "rdmadev::ChannelRegistry::Sender":
        shared_ptr[RingSender] ring
        shared_ptr[Domain] domain
        shared_ptr[void] lease
        string peer
        string reader

    cdef cppclass Receiver "rdmadev::ChannelRegistry::Receiver":
        shared_ptr[RingReceiver] ring
        shared_ptr[Domain] domain
        shared_ptr[void] lease
        string peer

    cdef cppclass Growth "rdmadev::ChannelRegistry::Growth":
        string key
        string peer
        uint64_t wanted
        RingLayout layout

    cdef cppclass Counts "rdmadev::ChannelRegistry::Counts":
        uint64_t senders
        uint64_t receivers
        uint64_t parked
        uint64_t retired

    cdef cppclass ChannelRegistry:
        @staticmethod
        ChannelRegistry& Global() nogil
        void Bind(const string& key, Sender s)
        void Bind(const string& key, Receiver r)
        void BindSuccessor(const string& key, Sender s)
        void BindSuccessor(const string& key, Receiver r)
        vector[Growth] Growing(const Domain* domain)
        Sender FindSender(const string& key, const Deadline& d, Sender* moving_from) except +raise_py_error nogil
        Receiver AdvanceReceiver(const string& key) except +raise_py_error nogil
        void Moved(const string& key) nogil
        Receiver FindReceiver(const string& key, const Deadline& d) except +raise_py_error nogil
        size_t Unbind(const string& key, Half half, double park_s)
        void Fail(const string& key, Half half, const string& why, const string& hint)
        void Unfail(const string& key, Half half)
        void KeepOnTf(const string& key, Half half)
        bool KeptOnTf(const string& key, Half half) nogil
        bool Held(const string& key, Half half)
        bool Lost(const string& key, Half half)
        size_t UnbindDomain(const Domain* domain)
        size_t UnbindPeer(const Domain* domain, const string& peer, const string& why,
                          const Endpoint* via)
        size_t PeerVerdict(const Domain* domain, const string& peer, const string& gone)
        size_t ReleaseDrained()
        Counts CountsFor(const Domain* domain)
        vector[string] Keys()


cdef extern from "bench.h" namespace "rdmadev":
    double BenchMemcpy(uint64_t size, uint64_t iters) nogil
    double BenchPingPong(Endpoint& ep, const RemoteRegion& peer, const Region& mine, uint64_t size,
                         uint64_t iters, bool initiator, const WaitPolicy& policy,
                         double timeout_s) except +raise_py_error nogil
    double BenchStreamSend(RingSender& tx, const uint8_t* src, uint64_t size, uint64_t count,
                           const Region& credit, const WaitPolicy& policy,
                           double timeout_s) except +raise_py_error nogil
    double BenchStreamRecv(RingReceiver& rx, uint64_t count, double timeout_s) except +raise_py_error nogil
    double BenchTcpPingPong(int fd, uint64_t size, uint64_t iters, bool initiator) except +raise_py_error nogil
    double BenchTcpStream(int fd, uint64_t size, uint64_t count, bool sender) except +raise_py_error nogil
