from libcpp.memory cimport shared_ptr

from rdmadev._native.handle cimport Handle

from rdmadev._native.c_common cimport WaitPolicy
from rdmadev._native.c_fabric cimport Domain as CDomain, Endpoint as CEndpoint
from rdmadev._native.c_fabric cimport RemoteRegion as CRemote


cdef class Endpoint(Handle):
    cdef shared_ptr[CEndpoint] p
    cdef shared_ptr[CDomain] dom
    cdef WaitPolicy policy
    cdef object domain
    cdef object _remotes  # weak references to the RemoteRegions attached through it
    cdef CEndpoint* _get(self) except NULL


cdef class RemoteRegion(Handle):
    cdef shared_ptr[CRemote] p
    cdef Endpoint endpoint
    cdef CRemote* _get(self) except NULL
