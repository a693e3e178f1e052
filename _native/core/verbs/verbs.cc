#include "verbs.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <mutex>
#include <vector>

#include "../acceptor.h"
#include "../handshake.h"
#include "../sockio.h"
#include "verbs_device.h"
#include "verbs_endpoint.h"

namespace rdmadev {

#if RDMADEV_HAVE_VERBS
namespace {

// Domain-separation tag of the side channel's handshake (see handshake.h).
constexpr char kTag[] = "rdmadev-verbs-v1";

class VerbsFabric : public Fabric {
 public:
  VerbsFabric(std::shared_ptr<VerbsMemory> mem, const std::string& listen, std::string name,
              std::string secret, WaitPolicy wait)
      : mem_(std::move(mem)), name_(std::move(name)), secret_(std::move(secret)), wait_(wait),
        acceptor_(SideChannelListen(listen), VerbsBackend::kName, kTag, secret_,
                  [this](int fd, const std::string& peer, const std::string& where) {
                    Serve(fd, peer, where);
                  }) {
    reach_ = acceptor_.reach() + "/" + GidText(mem_->dev().gid.raw);
  }
  ~VerbsFabric() override { Close(); }

  std::string name() const override { return VerbsBackend::kName; }
  std::string reach() const override { return reach_; }
  bool CanReach(const std::string& peer_reach) const override {
    size_t slash = peer_reach.rfind('/');
    return slash != std::string::npos && peer_reach.find(':') < slash;
  }

  std::shared_ptr<Endpoint> Connect(const std::string& peer_reach,
                                    const Deadline& deadline) override {
    if (!CanReach(peer_reach)) {
      throw Error(ErrorKind::kProtocol, "Failed to parse verbs reach '" + peer_reach + "'", 0,
                  "pass the exact Domain.address string of the peer");
    }
    std::string side = peer_reach.substr(0, peer_reach.rfind('/'));
    int fd = ConnectTcp(side, deadline);
    bool owned = false;  // once the endpoint exists it owns (and closes) fd
    try {
      ClientHandshake(fd, kTag, secret_, name_, side, deadline);
      auto qp = CreateRcQp(mem_->dev(), mem_->pd(), kVerbsSendDepth);
      QpInfo mine = LocalQpInfo(mem_->dev(), *qp), theirs{};
      iovec iov[1] = {{&mine, sizeof mine}};
      SendFully(fd, iov, 1, deadline, side);
      // The acceptor connects its QP to ours (RTR) before it answers, so nothing we send
      // can reach a QP that is not ready.
      RecvFully(fd, &theirs, sizeof theirs, deadline, side);
      ConnectRcQp(mem_->dev(), qp.get(), theirs);
      auto ep = MakeVerbsEndpoint(mem_, std::move(qp), fd, peer_reach, wait_);
      owned = true;
      std::lock_guard<std::mutex> lock(mu_);
      if (stopping_) {
        ep->Close();
        throw Error(ErrorKind::kClosed, "Failed to connect: the verbs fabric is closed");
      }
      endpoints_.erase(std::remove_if(endpoints_.begin(), endpoints_.end(),
                                      [](const std::weak_ptr<Endpoint>& w) { return w.expired(); }),
                       endpoints_.end());
      endpoints_.push_back(ep);
      return ep;
    } catch (...) {
      if (!owned) close(fd);
      throw;
    }
  }

  double late_write_window_s() const override { return kLateWriteGraceS; }
  void RegisterChunk(Chunk& chunk) override {
    std::lock_guard<std::mutex> lock(mu_);
    if (stopping_) throw Error(ErrorKind::kClosed, "Failed to register region: verbs fabric closed");
    mem_->Register(chunk);
  }
  void DeregisterChunk(Chunk& chunk) override {
    std::lock_guard<std::mutex> lock(mu_);
    if (!stopping_) mem_->Deregister(chunk);
  }

  void Close() override {
    std::vector<std::weak_ptr<Endpoint>> eps;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (stopping_) return;
      stopping_ = true;
      eps.swap(endpoints_);
    }
    // Children before parents: every queue pair (the peers' side channels, whose threads
    // the acceptor joins, then ours), then the registrations, then (when the last endpoint
    // lets go of mem_) the PD and the device.
    acceptor_.Close();
    for (auto& w : eps) {
      if (auto ep = w.lock()) ep->Close();
    }
    mem_->DeregisterAll();
    mem_.reset();
  }

 private:
  // The side channel listens on the tcp fabric's host, any free port.
  static std::string SideChannelListen(const std::string& listen) {
    std::string host, port;
    SplitHostPort(listen, &host, &port);
    return host.find(':') != std::string::npos ? "[" + host + "]:0" : host + ":0";
  }

  // The accepting side of one authenticated side channel: connect a QP to the peer's,
  // keep it until the peer hangs up (or the acceptor shuts the socket down).
  void Serve(int fd, const std::string& peer, const std::string& where) {
    Deadline d = Deadline::After(kHandshakeSeconds);
    QpInfo theirs{};
    fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);
    RecvFully(fd, &theirs, sizeof theirs, d, where);
    auto qp = CreateRcQp(mem_->dev(), mem_->pd(), 1);
    ConnectRcQp(mem_->dev(), qp.get(), theirs);
    QpInfo mine = LocalQpInfo(mem_->dev(), *qp);
    iovec iov[1] = {{&mine, sizeof mine}};
    SendFully(fd, iov, 1, d, where);
    // Serve until the peer closes: it never sends again, so readable = gone.
    for (;;) {
      pollfd p{fd, POLLIN | POLLRDHUP, -1};
      int n = poll(&p, 1, -1);
      if (n > 0 || (n < 0 && errno != EINTR)) break;
    }
    // qp (and its CQ) is destroyed here, before the fabric's registrations.
  }

  std::shared_ptr<VerbsMemory> mem_;
  std::string name_, secret_, reach_;
  WaitPolicy wait_;
  std::mutex mu_;
  bool stopping_ = false;
  std::vector<std::weak_ptr<Endpoint>> endpoints_;
  Acceptor acceptor_;  // last: its threads use the members above
};

}  // namespace

std::unique_ptr<Fabric> VerbsBackend::Make(const FabricContext& ctx, const VerbsOptions& opts) {
  if (ctx.secret.empty()) {
    throw Error(ErrorKind::kConfig, "Failed to open the verbs fabric: no cluster secret", 0,
                "set RDMADEV_SECRET (the same value in every task)");
  }
  RequireCrypto();  // peers authenticate with HMAC-SHA256: fail at open, not at the first peer
  std::string why;
  const IbvLib* lib = LoadIbv(&why);
  if (!lib) throw Error(ErrorKind::kFabric, "Failed to open the verbs fabric: " + why);
  auto mem = std::make_shared<VerbsMemory>(OpenVerbsDevice(*lib, opts));
  return std::unique_ptr<Fabric>(
      new VerbsFabric(std::move(mem), ctx.listen, ctx.name, ctx.secret, ctx.wait));
}

#else

std::unique_ptr<Fabric> VerbsBackend::Make(const FabricContext&, const VerbsOptions& opts) {
  throw Error(ErrorKind::kFabric, "Failed to open the verbs fabric: " + UnviableReason(opts));
}

#endif

}  // namespace rdmadev
