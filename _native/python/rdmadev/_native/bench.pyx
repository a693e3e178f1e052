# cython: language_level=3
"""Benchmark loops that run entirely in C++ (the GIL released): the physical references
(memcpy, raw TCP) and fabric ping-pong. Ring streaming is RingSender/RingReceiver.bench_stream."""
from libc.stdint cimport uint64_t

from rdmadev._native.c_channel cimport (BenchMemcpy, BenchPingPong, BenchTcpPingPong,
                                        BenchTcpStream)
from rdmadev._native.c_fabric cimport Endpoint as CEndpoint, RemoteRegion as CRemote
from rdmadev._native.c_region cimport Region as CRegion
from rdmadev._native.endpoint cimport Endpoint, RemoteRegion
from rdmadev._native.region cimport Region

__all__ = ["bench_memcpy", "bench_pingpong", "bench_tcp_pingpong", "bench_tcp_stream"]


def bench_memcpy(uint64_t size, uint64_t iters):
    """Seconds for `iters` memcpy calls of `size` bytes (the physical reference)."""
    cdef double t
    with nogil:
        t = BenchMemcpy(size, iters)
    return t


def bench_pingpong(Endpoint ep, RemoteRegion peer, Region mine, uint64_t size, uint64_t iters,
                   bint initiator, double timeout=60.0):
    """Seconds for `iters` round trips of `size` bytes (payload at 64, signal at 0)."""
    cdef CEndpoint* e = ep._get()
    cdef CRemote* r = peer._get()
    cdef CRegion* m = mine._get()
    cdef double t
    with nogil:
        t = BenchPingPong(e[0], r[0], m[0], size, iters, initiator, ep.policy, timeout)
    return t


def bench_tcp_pingpong(int fd, uint64_t size, uint64_t iters, bint initiator):
    """Seconds for `iters` raw TCP round trips on a connected blocking socket."""
    cdef double t
    with nogil:
        t = BenchTcpPingPong(fd, size, iters, initiator)
    return t


def bench_tcp_stream(int fd, uint64_t size, uint64_t count, bint sender):
    """Seconds to stream `count` messages of `size` bytes over raw TCP (then a 1-byte ack)."""
    cdef double t
    with nogil:
        t = BenchTcpStream(fd, size, count, sender)
    return t
