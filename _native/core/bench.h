// Loops for benchmarks/fabric_bench.py, run in C++ so that the figures measure the core's
// own API (the path TensorFlow kernels take) and not the Python interpreter.
#pragma once

#include <cstdint>

#include "channel.h"
#include "fabric.h"

namespace rdmadev {

// Seconds for `iters` memcpy calls of `size` bytes between two pre-faulted buffers.
double BenchMemcpy(uint64_t size, uint64_t iters);

// Ping-pong through two regions: each side's region holds the 16-byte signal at 0 and the
// payload at 64. The initiator writes transfer i and waits for the echo of i; the
// responder echoes. Returns the seconds the whole exchange took on this side.
double BenchPingPong(Endpoint& ep, const RemoteRegion& peer, const Region& mine, uint64_t size,
                     uint64_t iters, bool initiator, const WaitPolicy& policy, double timeout_s);

// Streams `count` transfers of the `size` bytes at `src` (a region's, or any memory, as a TF
// tensor's buffer) through a ring and waits until the receiver has released the last one.
// Returns seconds.
double BenchStreamSend(RingSender& tx, const uint8_t* src, uint64_t size, uint64_t count,
                       const Region& credit, const WaitPolicy& policy, double timeout_s);
// Acquires and releases `count` transfers without touching the payload (the receiving CPU
// does nothing, as with RDMA). Returns seconds from the first acquire to the last release.
double BenchStreamRecv(RingReceiver& rx, uint64_t count, double timeout_s);

// Raw TCP on a connected blocking socket, the baseline for the tcp fabric.
double BenchTcpPingPong(int fd, uint64_t size, uint64_t iters, bool initiator);
double BenchTcpStream(int fd, uint64_t size, uint64_t count, bool sender);

}  // namespace rdmadev
