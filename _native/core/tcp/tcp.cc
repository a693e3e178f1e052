#include "tcp.h"

#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <immintrin.h>

#include <algorithm>
#include <cstring>
#include <mutex>

#include "../acceptor.h"
#include "../domain.h"
#include "../handshake.h"
#include "../sockio.h"
#include "frame.h"

namespace rdmadev {
namespace {

// Domain-separation tag of the handshake (see handshake.h).
constexpr char kTag[] = "rdmadev-tcp-v1";

// Whether the receiver thread polls its socket before blocking. Polling pays while frames
// come closer together than the spin budget (a stream of writes: each is seen within ~3 us
// instead of after a ~30 us wakeup); it costs when they come further apart (small tensors
// going back and forth): the receiver then holds its core for the whole budget after every
// frame, and that is the core the waiter woken by the frame's signal needs when both share
// one. So the gate keeps a score of recent polls, up by one for a poll that found data and
// down by one for one that did not, and is open while the score is above zero: a stream's
// occasional miss (a sender waiting for credits) keeps it open, a run of misses closes it.
// While closed, every kProbeEvery-th wait polls anyway, so a stream that starts is noticed.
class PollGate {
 public:
  bool ShouldPoll() { return score_ > 0 || ++closed_waits_ % kProbeEvery == 0; }
  void Polled(bool found) {
    score_ = found ? std::min(score_ + 1, kMaxScore) : std::max(score_ - 1, 0);
    closed_waits_ = 0;
  }

 private:
  // Misses in a row that close the gate after a run of hits.
  static constexpr int kMaxScore = 4;
  // A closed gate costs a stream at most this many wakeups before a probe; a ping-pong pays
  // the budget on 1/kProbeEvery of its frames.
  static constexpr unsigned kProbeEvery = 16;
  int score_ = kMaxScore;
  unsigned closed_waits_ = 0;
};

// Socket reads and writes for the serving side (one thread per connection). A read that
// finds no data polls the socket without blocking for up to `spin_ns` (the domain's spin
// budget) when the gate says so, then blocks (research/limits.md: TCP busy-poll 2.7 us, a
// cross-vCPU wakeup ~30 us).
class SocketStream : public ByteStream {
 public:
  explicit SocketStream(int fd, uint64_t spin_ns = 0) : fd_(fd), spin_ns_(spin_ns) {}
  size_t Recv(void* dst, size_t n, bool next_frame) override {
    auto* p = static_cast<uint8_t*>(dst);
    size_t done = 0;
    if (spin_ns_ > 0 && n > 0) {
      if (!TryRecv(p, n, &done)) return done;
      if (done == n) return n;
      // Waiting between frames is what the gate decides on; the rest of a frame is coming.
      const bool between = next_frame && done == 0;
      if (!between || gate_.ShouldPoll()) {
        const size_t before = done;
        auto until = Clock::now() + std::chrono::nanoseconds(spin_ns_);
        do {
          _mm_pause();
          if (!TryRecv(p, n, &done)) return done;
        } while (done < n && Clock::now() < until);
        if (between) gate_.Polled(done > before);
        if (done == n) return n;
      }
    }
    while (done < n) {
      ssize_t got = recv(fd_, p + done, n - done, MSG_WAITALL);
      if (got < 0 && errno == EINTR) continue;
      if (got <= 0) return done;
      done += static_cast<size_t>(got);
    }
    return done;
  }
  bool SendAll(const void* a, size_t na, const void* b, size_t nb) override {
    iovec iov[2] = {{const_cast<void*>(a), na}, {const_cast<void*>(b), nb}};
    int first = 0;
    while (first < 2) {
      msghdr m{};
      m.msg_iov = iov + first;
      m.msg_iovlen = 2 - first;
      ssize_t sent = sendmsg(fd_, &m, MSG_NOSIGNAL);
      if (sent < 0 && errno == EINTR) continue;
      if (sent < 0) return false;
      size_t left = static_cast<size_t>(sent);
      while (first < 2 && left >= iov[first].iov_len) left -= iov[first++].iov_len;
      if (first < 2) {
        iov[first].iov_base = static_cast<uint8_t*>(iov[first].iov_base) + left;
        iov[first].iov_len -= left;
      }
    }
    return true;
  }

 private:
  // Takes what has arrived of bytes *done..n without blocking; false when the stream ended
  // or failed.
  bool TryRecv(uint8_t* p, size_t n, size_t* done) {
    ssize_t got = recv(fd_, p + *done, n - *done, MSG_DONTWAIT);
    if (got > 0) *done += static_cast<size_t>(got);
    return got > 0 || (got < 0 && (errno == EAGAIN || errno == EINTR));
  }

  int fd_;
  uint64_t spin_ns_;
  PollGate gate_;
};

class TcpEndpoint : public Endpoint {
 public:
  TcpEndpoint(int fd, std::string reach) : fd_(fd), reach_(std::move(reach)) {}
  ~TcpEndpoint() override { Close(); }
  std::string fabric() const override { return TcpBackend::kName; }
  std::string peer() const override { return "tcp=" + reach_; }
  bool delivered_by_local_thread() const override { return true; }

  std::shared_ptr<RemoteRegion> Attach(const RegionDesc& desc) override {
    return std::make_shared<RemoteRegion>(desc);
  }

  void Write(const void* src, const RemoteRegion& dst, uint64_t roff, uint64_t len,
             const Signal* sig, const Deadline& deadline) override {
    CheckRemoteRange(dst.desc, roff, len, sig);
    FrameHeader h = Header(kOpWrite, dst, roff, len);
    if (sig) {
      h.flags = kFlagSignal;
      h.sig_off = sig->off;
      h.sig_seq = sig->seq;
      h.sig_aux = sig->aux;
    }
    iovec iov[2] = {{&h, sizeof h}, {const_cast<void*>(src), len}};
    std::lock_guard<std::mutex> lock(mu_);
    SendFully(Fd(), iov, len ? 2 : 1, deadline, reach_);
  }

  void Read(const RemoteRegion& src, uint64_t roff, void* dst, uint64_t len,
            const Deadline& deadline) override {
    CheckRemoteRange(src.desc, roff, len, nullptr);
    FrameHeader h = Header(kOpRead, src, roff, len);
    iovec iov[1] = {{&h, sizeof h}};
    std::lock_guard<std::mutex> lock(mu_);
    int fd = Fd();
    SendFully(fd, iov, 1, deadline, reach_);
    FrameHeader resp;
    RecvFully(fd, &resp, sizeof resp, deadline, reach_);
    // A response answers this read: its region, its length, and status 0 (frame.h: a
    // READ_RESPONSE's offset is its status); anything else is a peer not speaking the protocol.
    if (resp.magic != kFrameMagic || resp.op != kOpReadResponse || resp.length != len ||
        resp.region != src.desc.id || resp.offset != 0) {
      throw Error(ErrorKind::kProtocol, "Malformed read response from " + reach_);
    }
    RecvFully(fd, dst, len, deadline, reach_);
  }

  bool PeerAlive(std::string* why) override {
    std::lock_guard<std::mutex> lock(mu_);
    if (fd_ < 0) {
      *why = "endpoint closed";
      return false;
    }
    // The serving side never speaks unprompted, so readable means closed or reset.
    pollfd p{fd_, POLLIN | POLLRDHUP, 0};
    if (poll(&p, 1, 0) > 0 && (p.revents & (POLLIN | POLLRDHUP | POLLHUP | POLLERR))) {
      *why = "tcp connection to " + reach_ + " was closed by the peer";
      return false;
    }
    return true;
  }

  void Close() override {
    std::lock_guard<std::mutex> lock(mu_);
    if (fd_ >= 0) close(fd_);
    fd_ = -1;
  }

 private:
  int Fd() const {
    if (fd_ < 0) throw Error(ErrorKind::kClosed, "Failed to use endpoint to " + reach_ + ": closed");
    return fd_;
  }
  static FrameHeader Header(FrameOp op, const RemoteRegion& r, uint64_t off, uint64_t len) {
    FrameHeader h{};
    h.magic = kFrameMagic;
    h.op = op;
    h.region = r.desc.id;
    h.rkey = r.desc.rkey;
    h.offset = off;
    h.length = len;
    return h;
  }
  std::mutex mu_;
  int fd_;
  std::string reach_;
};

class TcpFabric : public Fabric {
 public:
  TcpFabric(Domain* domain, const std::string& listen, std::string name, std::string secret)
      : domain_(domain), name_(std::move(name)), secret_(std::move(secret)),
        acceptor_(listen, TcpBackend::kName, kTag, secret_,
                  [this](int fd, const std::string& peer, const std::string& where) {
                    Serve(fd, peer, where);
                  }) {}
  ~TcpFabric() override { Close(); }

  std::string name() const override { return TcpBackend::kName; }
  std::string reach() const override { return acceptor_.reach(); }
  bool CanReach(const std::string& peer_reach) const override {
    return peer_reach.find(':') != std::string::npos;
  }

  std::shared_ptr<Endpoint> Connect(const std::string& peer_reach,
                                    const Deadline& deadline) override {
    int fd = ConnectTcp(peer_reach, deadline);
    try {
      ClientHandshake(fd, kTag, secret_, name_, peer_reach, deadline);
    } catch (...) {
      close(fd);
      throw;
    }
    return std::make_shared<TcpEndpoint>(fd, peer_reach);
  }

  void Close() override { acceptor_.Close(); }

 private:
  // One authenticated inbound connection: frames until the peer leaves, breaks the
  // protocol, or the acceptor shuts the socket down.
  void Serve(int fd, const std::string& peer, const std::string& where) {
    SocketStream s(fd, domain_->options().wait.spin_ns);
    Domain* d = domain_;
    ServeResult r = ServeFrames(s, peer, [d](uint64_t id, bool* retired) {
      return d->Find(id, retired);
    });
    if (!r.rejected.empty()) {
      rejected_frames_.Log("tcp: rejected a frame from peer '" + peer + "' at " + where + ": " +
                           r.rejected + "; disconnected");
    }
  }

  Domain* domain_;
  std::string name_, secret_;
  LogBudget rejected_frames_{"tcp: rejected frames"};
  Acceptor acceptor_;  // last: its threads use the members above
};

class BufferStream : public ByteStream {
 public:
  explicit BufferStream(const std::string& b) : buf_(b) {}
  size_t Recv(void* dst, size_t n, bool) override {
    size_t got = std::min(n, buf_.size() - pos_);  // what is left, as a socket would give it
    std::memcpy(dst, buf_.data() + pos_, got);
    pos_ += got;
    return got;
  }
  bool SendAll(const void*, size_t, const void*, size_t) override { return true; }

 private:
  const std::string& buf_;
  size_t pos_ = 0;
};

}  // namespace

std::string TcpBackend::UnviableReason(const TcpOptions&) {
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return std::string("cannot create a TCP socket: ") + std::strerror(errno);
  close(fd);
  return "";
}

std::unique_ptr<Fabric> TcpBackend::Make(const FabricContext& ctx, const TcpOptions&) {
  if (ctx.secret.empty()) {
    throw Error(ErrorKind::kConfig, "Failed to open the tcp fabric: no cluster secret", 0,
                "set RDMADEV_SECRET (the same value in every task)");
  }
  RequireCrypto();  // peers authenticate with HMAC-SHA256: fail at open, not at the first peer
  return std::unique_ptr<Fabric>(new TcpFabric(ctx.domain, ctx.listen, ctx.name, ctx.secret));
}

ServeResult FeedFrames(Domain* domain, const std::string& peer, const std::string& bytes) {
  BufferStream s(bytes);
  return ServeFrames(s, peer, [domain](uint64_t id, bool* retired) {
    return domain->Find(id, retired);
  });
}

}  // namespace rdmadev
