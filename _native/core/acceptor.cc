#include "acceptor.h"

#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstring>

#include "common.h"
#include "handshake.h"
#include "sockio.h"

namespace rdmadev {
namespace {

// Bound on authenticated inbound connections: a cluster has a handful of peers (one tcp
// connection or one verbs side channel per peer endpoint); this only bounds the threads a
// peer holding the secret can make us start.
constexpr size_t kMaxConnections = 512;
// Bound on connections still in their handshake, budgeted apart from the authenticated ones:
// a legitimate peer is through it in milliseconds, so when a new connection would exceed
// it, the oldest handshaking one is dropped. Silent sockets then hold at most this many
// threads and descriptors, and a flood of them cannot lock a real peer out: its connection
// is the newest while it proves the secret. (rdmadev's control service uses the same rule,
// MAX_HANDSHAKING in rdmadev/cluster/control.py.)
constexpr size_t kMaxHandshaking = 64;
// How long the accept loop sleeps when nothing happens before it joins finished connection
// threads: one wakeup a second costs nothing, and a finished connection keeps only an
// exited thread and its descriptor for that long.
constexpr int kReapMs = 1000;
// After accept() fails for lack of a resource (EMFILE/ENFILE: descriptors; ENOBUFS/ENOMEM),
// the connection stays queued and poll() reports it again at once: retrying at once spun
// the accept thread at ~90% of a core. It waits this long between attempts instead: ten
// attempts a second cost nothing measurable, and a queued peer waits at most this long
// once the resource is free again.
constexpr int kAcceptBackoffMs = 100;
// Name of the accept thread (at most 15 characters), as `top -H` and /proc/<pid>/task show.
constexpr char kThreadName[] = "rdmadev-accept";

// accept() errors that say nothing about the next attempt: the peer gave up, or a signal.
bool Transient(int err) {
  return err == EAGAIN || err == EWOULDBLOCK || err == EINTR || err == ECONNABORTED ||
         err == EPROTO;
}

}  // namespace

Acceptor::Acceptor(const std::string& listen, std::string fabric, std::string tag,
                   std::string secret, Handler handler)
    : fabric_(std::move(fabric)), tag_(std::move(tag)), secret_(std::move(secret)),
      handler_(std::move(handler)) {
  listen_fd_ = ListenTcp(listen, &reach_);
  // Non-blocking: after a backoff the loop calls accept() without poll() having said a
  // connection is queued, and the peer may have given up meanwhile.
  fcntl(listen_fd_, F_SETFL, fcntl(listen_fd_, F_GETFL) | O_NONBLOCK);
  wake_fd_ = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (wake_fd_ < 0) {
    int err = errno;
    close(listen_fd_);
    ThrowErrno(ErrorKind::kFabric, "Failed to create the " + fabric_ + " acceptor's eventfd", err);
  }
  thread_ = std::thread([this] { Loop(); });
  // Named here rather than by the thread itself, so the name is set once this returns.
  pthread_setname_np(thread_.native_handle(), kThreadName);
}

Acceptor::~Acceptor() { Close(); }

void Acceptor::Close() {
  std::list<std::unique_ptr<Conn>> conns;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stopping_) return;
    stopping_ = true;
    conns.swap(conns_);
    for (auto& c : conns) shutdown(c->fd, SHUT_RDWR);
  }
  uint64_t one = 1;
  if (write(wake_fd_, &one, sizeof one) < 0) { /* the loop also checks stopping_ */ }
  if (thread_.joinable()) thread_.join();
  for (auto& c : conns) {
    if (c->thread.joinable()) c->thread.join();
    close(c->fd);
  }
  close(listen_fd_);
  close(wake_fd_);
}

void Acceptor::Loop() {
  bool starved = false;  // the last accept() failed for lack of a resource
  for (;;) {
    pollfd p[2] = {{wake_fd_, POLLIN, 0}, {listen_fd_, POLLIN, 0}};
    // While starved only Close wakes the loop early; otherwise a queued connection does.
    int n = poll(p, starved ? 1 : 2, starved ? kAcceptBackoffMs : kReapMs);
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (stopping_) return;
      Reap();
    }
    if (!starved && (n <= 0 || !(p[1].revents & POLLIN))) continue;
    sockaddr_storage ss{};
    socklen_t len = sizeof ss;
    int fd = accept4(listen_fd_, reinterpret_cast<sockaddr*>(&ss), &len, SOCK_CLOEXEC);
    if (fd < 0) {
      int err = errno;
      if (Transient(err)) {
        starved = false;
        continue;
      }
      if (!starved) {  // once per episode, not once per attempt
        const std::string fix = ErrnoHint(err);
        LogEvent(fabric_ + ": cannot accept connections on " + reach_ + ": " +
                 std::strerror(err) + " (errno " + std::to_string(err) + "); retrying every " +
                 std::to_string(kAcceptBackoffMs) + " ms" + (fix.empty() ? "" : ". Fix: " + fix));
      }
      starved = true;
      continue;
    }
    if (starved) LogEvent(fabric_ + ": accepting connections on " + reach_ + " again");
    starved = false;
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    std::string where = PeerText(ss);
    std::lock_guard<std::mutex> lock(mu_);
    if (stopping_ || !Admit(where)) {
      close(fd);
      continue;
    }
    auto c = std::make_unique<Conn>();
    c->fd = fd;
    Conn* raw = c.get();
    raw->thread = std::thread([this, raw, where] { Serve(raw, where); });
    conns_.push_back(std::move(c));
  }
}

bool Acceptor::Admit(const std::string& where) {
  size_t handshaking = 0, serving = 0;
  for (const auto& c : conns_) {
    if (c->done.load(std::memory_order_acquire)) continue;
    int state = c->state.load(std::memory_order_acquire);
    handshaking += state == kHandshaking;
    serving += state == kServing;
  }
  if (serving >= kMaxConnections) {
    refused_.Log(fabric_ + ": refused a connection from " + where + ": " +
                 std::to_string(serving) + " authenticated connections are open");
    return false;
  }
  if (handshaking < kMaxHandshaking) {
    crowded_ = false;
    return true;
  }
  for (auto& c : conns_) {  // oldest first
    int expected = kHandshaking;
    if (!c->done.load(std::memory_order_acquire) &&
        c->state.compare_exchange_strong(expected, kDropped, std::memory_order_acq_rel)) {
      shutdown(c->fd, SHUT_RDWR);  // its handshake fails at once; its thread ends
      break;
    }
  }
  if (!crowded_) {  // once per episode: a flood would otherwise log a line per connection
    LogEvent(fabric_ + ": " + std::to_string(handshaking) +
             " connections are in their handshake; dropping the oldest for each new one "
             "(the newest from " + where + ")");
    crowded_ = true;
  }
  return true;
}

void Acceptor::Serve(Conn* c, const std::string& where) {
  std::string peer;
  try {
    peer = AcceptHandshake(c->fd, tag_, secret_, where, Deadline::After(kHandshakeSeconds));
  } catch (const Error& e) {
    if (c->state.load(std::memory_order_acquire) != kDropped) {  // drops: Admit logs once
      const char* what = e.kind() == ErrorKind::kAuth       ? ""
                         : e.kind() == ErrorKind::kProtocol ? "malformed handshake: "
                                                            : "truncated handshake: ";
      failed_handshakes_.Log(fabric_ + ": " + what + e.what() + "; disconnected");
    }
  }
  int expected = kHandshaking;
  if (!peer.empty() &&
      c->state.compare_exchange_strong(expected, kServing, std::memory_order_acq_rel)) {
    try {
      handler_(c->fd, peer, where);
    } catch (const std::exception& e) {  // a connection's failure never ends the process
      LogEvent(fabric_ + ": connection from peer '" + peer + "' at " + where + " failed: " + e.what());
    }
  }
  shutdown(c->fd, SHUT_RDWR);
  c->done.store(true, std::memory_order_release);
}

void Acceptor::Reap() {
  for (auto it = conns_.begin(); it != conns_.end();) {
    if ((*it)->done.load(std::memory_order_acquire)) {
      (*it)->thread.join();
      close((*it)->fd);
      it = conns_.erase(it);
    } else {
      ++it;
    }
  }
}

}  // namespace rdmadev
