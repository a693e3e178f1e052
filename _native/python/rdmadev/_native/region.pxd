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
