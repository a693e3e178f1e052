# Raw declarations of the core's shared vocabulary (_native/core/common.h, completion.h) and
# of the CPython glue (py_glue.h). Nothing here but `cdef extern`.
from libc.stdint cimport uint64_t
from libcpp cimport bool
from libcpp.memory cimport shared_ptr
from libcpp.string cimport string
from libcpp.utility cimport pair
from libcpp.vector cimport vector


cdef extern from "py_glue.h" namespace "rdmadev_py":
    void raise_py_error() except *


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
    string ErrnoHint(int err)


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


cdef inline Deadline deadline_of(timeout):
    """A Deadline `timeout` seconds from now (None: never)."""
    if timeout is None:
        return Deadline.Never()
    return Deadline.After(float(timeout))


cdef inline bytes as_bytes(s):
    return s.encode() if isinstance(s, str) else bytes(s)
