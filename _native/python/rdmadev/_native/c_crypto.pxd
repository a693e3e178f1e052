# Raw declarations of _native/core/hmac.h and handshake.h.
from libcpp cimport bool
from libcpp.string cimport string

from rdmadev._native.c_common cimport Deadline, raise_py_error


cdef extern from "hmac.h" namespace "rdmadev":
    cdef cppclass Digest "rdmadev::Digest":
        unsigned char* data()
        size_t size()
    Digest HmacSha256(const string& key, const string& message) except +raise_py_error nogil
    void RequireCrypto() except +raise_py_error


cdef extern from "handshake.h" namespace "rdmadev":
    Digest HandshakeProof(const string& tag, const string& role, const string& secret,
                          const string& first, const string& second,
                          const string& name) except +raise_py_error nogil
    void ClientHandshake(int fd, const string& tag, const string& secret, const string& name,
                         const string& peer, const Deadline& deadline) except +raise_py_error nogil
    string AcceptHandshake(int fd, const string& tag, const string& secret, const string& where,
                           const Deadline& deadline) except +raise_py_error nogil
