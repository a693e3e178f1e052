from libc.stdint cimport uint64_t
from libcpp.memory cimport shared_ptr

from rdmadev._native.handle cimport Handle

from rdmadev._native.c_common cimport WaitPolicy
from rdmadev._native.c_fabric cimport Domain as CDomain
from rdmadev._native.c_region cimport Region as CRegion


cdef class Region(Handle):
    cdef shared_ptr[CRegion] p
    cdef shared_ptr[CDomain] dom  # the native domain that revokes it on close()
    cdef WaitPolicy policy        # the domain's wait policy
    cdef object domain            # the Python Domain (a child keeps its parent alive)
    cdef CRegion* _get(self) except NULL


# The `length` bytes at `offset` of a write's source: a Region (checked as CRegion.CheckRange
# checks it) or any bytes-like object; the view keeps them alive for a nogil call.
cdef const unsigned char[::1] source_view(object src, uint64_t offset, uint64_t length, what)
