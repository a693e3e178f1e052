#include "bench.h"

#include <sys/mman.h>
#include <sys/socket.h>

#include <cstring>
#include <vector>

namespace rdmadev {
namespace {

double Seconds(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

void SendAllOrThrow(int fd, const void* p, size_t n) {
  auto* c = static_cast<const uint8_t*>(p);
  while (n > 0) {
    ssize_t s = send(fd, c, n, MSG_NOSIGNAL);
    if (s < 0 && errno == EINTR) continue;
    if (s <= 0) ThrowErrno(ErrorKind::kPeerLost, "Failed to send (raw tcp bench)", errno);
    c += s;
    n -= static_cast<size_t>(s);
  }
}

void RecvAllOrThrow(int fd, void* p, size_t n) {
  auto* c = static_cast<uint8_t*>(p);
  while (n > 0) {
    ssize_t s = recv(fd, c, n, MSG_WAITALL);
    if (s < 0 && errno == EINTR) continue;
    if (s <= 0) ThrowErrno(ErrorKind::kPeerLost, "Failed to receive (raw tcp bench)", s ? errno : ECONNRESET);
    c += s;
    n -= static_cast<size_t>(s);
  }
}

constexpr uint64_t kPayloadAt = kCacheLine;  // ping-pong payload offset, after the signal

}  // namespace

double BenchMemcpy(uint64_t size, uint64_t iters) {
  std::vector<uint8_t> a(size ? size : 1, 1), b(size ? size : 1, 2);
  // A call through a volatile pointer so the compiler cannot elide or fold the copies.
  void* (*volatile copy)(void*, const void*, size_t) = std::memcpy;
  auto t0 = Clock::now();
  for (uint64_t i = 0; i < iters; ++i) copy(i & 1 ? a.data() : b.data(), i & 1 ? b.data() : a.data(), size);
  return Seconds(t0, Clock::now());
}

double BenchPingPong(Endpoint& ep, const RemoteRegion& peer, const Region& mine, uint64_t size,
                     uint64_t iters, bool initiator, const WaitPolicy& base, double timeout_s) {
  const WaitPolicy policy = PolicyFor(base, &ep);
  mine.CheckRange(kPayloadAt, size, "run ping-pong");
  Deadline deadline = Deadline::After(timeout_s);
  auto* word = mine.Word(0);
  const uint8_t* payload = mine.base() + kPayloadAt;
  auto t0 = Clock::now();
  for (uint64_t i = 1; i <= iters; ++i) {
    if (!initiator) WaitWord(word, i, deadline, policy, nullptr, "ping");
    Signal sig{0, i, size};
    ep.Write(payload, peer, kPayloadAt, size, &sig, deadline);
    if (initiator) WaitWord(word, i, deadline, policy, nullptr, "pong");
  }
  return Seconds(t0, Clock::now());
}

double BenchStreamSend(RingSender& tx, const uint8_t* src, uint64_t size, uint64_t count,
                       const Region& credit, const WaitPolicy& policy, double timeout_s) {
  Deadline deadline = Deadline::After(timeout_s);
  uint64_t first = tx.sent() + 1;
  auto t0 = Clock::now();
  for (uint64_t i = 0; i < count; ++i) tx.Send(src, size, deadline);
  WaitWord(tx.CreditNeeded().first, first + count - 1, deadline, policy, nullptr, "the last release");
  return Seconds(t0, Clock::now());
}

double BenchStreamRecv(RingReceiver& rx, uint64_t count, double timeout_s) {
  Deadline deadline = Deadline::After(timeout_s);
  Clock::time_point t0;
  for (uint64_t i = 0; i < count; ++i) {
    Slot s = rx.Acquire(deadline);
    if (i == 0) t0 = Clock::now();
    rx.Release(s.seq, deadline);
  }
  return count ? Seconds(t0, Clock::now()) : 0.0;
}

double BenchTcpPingPong(int fd, uint64_t size, uint64_t iters, bool initiator) {
  std::vector<uint8_t> buf(size ? size : 1, 7);
  auto t0 = Clock::now();
  for (uint64_t i = 0; i < iters; ++i) {
    if (initiator) {
      SendAllOrThrow(fd, buf.data(), size);
      RecvAllOrThrow(fd, buf.data(), size);
    } else {
      RecvAllOrThrow(fd, buf.data(), size);
      SendAllOrThrow(fd, buf.data(), size);
    }
  }
  return Seconds(t0, Clock::now());
}

double BenchTcpStream(int fd, uint64_t size, uint64_t count, bool sender) {
  // Pre-faulted buffer, as the fabric's regions are.
  std::vector<uint8_t> buf(size ? size : 1, 3);
  uint8_t ack = 0;
  auto t0 = Clock::now();
  for (uint64_t i = 0; i < count; ++i) {
    if (sender) SendAllOrThrow(fd, buf.data(), size);
    else RecvAllOrThrow(fd, buf.data(), size);
  }
  if (sender) RecvAllOrThrow(fd, &ack, 1);
  else SendAllOrThrow(fd, &ack, 1);
  return Seconds(t0, Clock::now());
}

}  // namespace rdmadev
