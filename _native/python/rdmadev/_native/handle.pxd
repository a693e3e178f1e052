cdef class Handle:
    cdef object __weakref__
