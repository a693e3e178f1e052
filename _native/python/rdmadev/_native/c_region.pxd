# Raw declarations of _native/core/region.h.
from libc.stdint cimport uint64_t
from libcpp cimport bool
from libcpp.string cimport string

from rdmadev._native.c_common cimport AtomicU64, raise_py_error


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
        void Quiet()
