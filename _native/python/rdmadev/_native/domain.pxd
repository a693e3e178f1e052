from libcpp.memory cimport shared_ptr

from rdmadev._native.handle cimport Handle

from rdmadev._native.c_common cimport WaitPolicy
from rdmadev._native.c_fabric cimport Domain as CDomain


cdef class Domain(Handle):
    cdef shared_ptr[CDomain] p
    cdef WaitPolicy policy
    cdef object _rings, _endpoints, _regions  # weak references to its children
    cdef CDomain* _get(self) except NULL
