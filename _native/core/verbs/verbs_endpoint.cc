#include "verbs_endpoint.h"

#include <poll.h>
#include <sched.h>
#include <unistd.h>

#include <immintrin.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <mutex>
#include <thread>
#include <vector>

#include "../sockio.h"

namespace rdmadev {

#if RDMADEV_HAVE_VERBS
namespace {

// Bounce buffer per endpoint, for sources and destinations outside every registered
// region (rdmadev's own callers always pass regions; this keeps arbitrary pointers
// correct). 1 MiB is one large message: copying through it costs a memcpy (~12 GB/s here),
// far below any RDMA link.
constexpr size_t kBounceBytes = 1 << 20;
// Largest single RDMA message posted, whatever the port allows (its max_msg_sz is 1-2 GiB
// on NICs): keeps any one work request's retransmission bounded.
constexpr uint64_t kMaxMessage = uint64_t(1) << 30;
// After moving a queue pair to the error state, how long its flushed completions may take.
constexpr double kDrainSeconds = 5.0;
// Completion polling of a long transfer sleeps waited/64 at a time (<= 1.6% late), at most
// 2 ms: a wakeup costs ~30 us of CPU here (much more under emulation), and a 1 MiB write at
// the slowest link rdmadev runs on (Soft-RoCE under emulation, ~50 MB/s) takes ~20 ms.
constexpr uint64_t kSleepFraction = 64;
constexpr uint64_t kMaxCompletionSleepNs = 2000000;

// One RDMA message of a transfer.
struct Piece {
  ibv_wr_opcode op;
  uint64_t local;
  uint32_t lkey;
  uint32_t len;
  uint64_t remote;
  uint32_t rkey;
};

std::string WcText(const IbvLib& lib, const ibv_wc& wc) {
  return std::string(lib.wc_status_str(wc.status)) + " (wc status " +
         std::to_string(static_cast<int>(wc.status)) + ", vendor error " +
         std::to_string(wc.vendor_err) + ")";
}

void RequireVerbsKey(const RegionDesc& d) {
  if (d.verbs_rkey == 0) {
    throw Error(ErrorKind::kProtocol,
                "Failed to address peer region " + std::to_string(d.id) +
                    " over verbs: its descriptor carries no RDMA registration",
                0, "the owner must open the verbs fabric before allocating the region");
  }
}

class VerbsEndpoint : public Endpoint {
 public:
  VerbsEndpoint(std::shared_ptr<VerbsMemory> mem, std::unique_ptr<RcQp> qp, int fd,
                std::string reach, WaitPolicy policy)
      : mem_(std::move(mem)), qp_(std::move(qp)), fd_(fd), reach_(std::move(reach)),
        policy_(policy) {
    void* p = nullptr;
    if (posix_memalign(&p, kPageSize, kBounceBytes + kPageSize) != 0) {
      throw Error(ErrorKind::kRegion, "Failed to allocate the verbs bounce buffer", ENOMEM);
    }
    bounce_ = static_cast<uint8_t*>(p);
    std::memset(bounce_, 0, kBounceBytes + kPageSize);
    try {
      bounce_mr_ = mem_->RegisterBuffer(bounce_, kBounceBytes + kPageSize, "the bounce buffer");
    } catch (...) {
      free(bounce_);
      throw;
    }
  }
  ~VerbsEndpoint() override { Close(); }

  std::string fabric() const override { return "verbs"; }
  std::string peer() const override { return "verbs=" + reach_; }

  std::shared_ptr<RemoteRegion> Attach(const RegionDesc& desc) override {
    RequireVerbsKey(desc);
    return std::make_shared<RemoteRegion>(desc);
  }

  void Write(const void* src, const RemoteRegion& dst, uint64_t roff, uint64_t len,
             const Signal* sig, const Deadline& deadline) override {
    CheckRemoteRange(dst.desc, roff, len, sig);
    RequireVerbsKey(dst.desc);
    std::lock_guard<std::mutex> lock(mu_);
    Usable();
    std::vector<Piece> pieces;
    uint32_t lkey = 0;
    if (len > 0 && mem_->LocalKey(src, len, &lkey)) {
      Split(IBV_WR_RDMA_WRITE, reinterpret_cast<uint64_t>(src), lkey, dst.desc, roff, len, &pieces);
    } else if (len > 0) {
      // Through the bounce buffer, one buffer-full at a time; the signal goes with the last.
      const auto* s = static_cast<const uint8_t*>(src);
      for (uint64_t done = 0; done < len;) {
        uint64_t n = std::min<uint64_t>(kBounceBytes, len - done);
        std::memcpy(bounce_, s + done, n);
        Split(IBV_WR_RDMA_WRITE, reinterpret_cast<uint64_t>(bounce_), bounce_mr_->lkey, dst.desc,
              roff + done, n, &pieces);
        done += n;
        if (done < len) {
          Run(pieces, deadline, "write");
          pieces.clear();
        }
      }
    }
    if (sig) {
      // The signal is two more RDMA WRITEs on the same queue pair, aux then seq. An RC
      // responder executes messages in order, so both land after the payload; but the
      // order in which the bytes of ONE message become visible is unspecified, so a
      // single 16-byte write could expose seq before aux. Two 8-byte messages keep
      // "a reader that acquires seq sees the payload and aux". (WRITE_WITH_IMM would
      // order it too, but it consumes a posted receive and raises a completion on the
      // target: the receiver would have to poll a CQ instead of the sequence word that
      // every fabric and the progress engine wait on, and any independent peer would
      // have to post receives.)
      auto* words = reinterpret_cast<uint64_t*>(bounce_ + kBounceBytes);
      words[0] = sig->seq;
      words[1] = sig->aux;
      uint64_t base = reinterpret_cast<uint64_t>(words);
      pieces.push_back({IBV_WR_RDMA_WRITE, base + 8, bounce_mr_->lkey, 8,
                        dst.desc.verbs_addr + sig->off + 8, dst.desc.verbs_rkey});
      pieces.push_back({IBV_WR_RDMA_WRITE, base, bounce_mr_->lkey, 8,
                        dst.desc.verbs_addr + sig->off, dst.desc.verbs_rkey});
    }
    if (!pieces.empty()) Run(pieces, deadline, "write");
  }

  void Read(const RemoteRegion& src, uint64_t roff, void* dst, uint64_t len,
            const Deadline& deadline) override {
    CheckRemoteRange(src.desc, roff, len, nullptr);
    RequireVerbsKey(src.desc);
    if (len == 0) return;
    std::lock_guard<std::mutex> lock(mu_);
    Usable();
    std::vector<Piece> pieces;
    uint32_t lkey = 0;
    if (mem_->LocalKey(dst, len, &lkey)) {
      Split(IBV_WR_RDMA_READ, reinterpret_cast<uint64_t>(dst), lkey, src.desc, roff, len, &pieces);
      Run(pieces, deadline, "read");
      return;
    }
    auto* d = static_cast<uint8_t*>(dst);
    for (uint64_t done = 0; done < len;) {
      uint64_t n = std::min<uint64_t>(kBounceBytes, len - done);
      pieces.clear();
      Split(IBV_WR_RDMA_READ, reinterpret_cast<uint64_t>(bounce_), bounce_mr_->lkey, src.desc,
            roff + done, n, &pieces);
      Run(pieces, deadline, "read");
      std::memcpy(d + done, bounce_, n);
      done += n;
    }
  }

  bool PeerAlive(std::string* why) override {
    std::lock_guard<std::mutex> lock(state_mu_);
    if (closed_) {
      *why = "endpoint closed";
      return false;
    }
    if (!broken_.empty()) {
      *why = broken_;
      return false;
    }
    // The peer never speaks on the side channel after setup: readable means it closed.
    if (PeerHungUp(fd_)) {
      *why = "verbs peer " + reach_ + " closed its side channel (the task exited or died)";
      return false;
    }
    return true;
  }

  void Close() override {
    closing_.store(true, std::memory_order_release);  // ends a transfer waiting below
    std::lock_guard<std::mutex> lock(mu_);
    std::lock_guard<std::mutex> state(state_mu_);
    if (closed_) return;
    closed_ = true;
    qp_.reset();  // QP (then its CQ) before the buffer's registration
    if (bounce_mr_) mem_->DeregisterBuffer(bounce_mr_);
    bounce_mr_ = nullptr;
    free(bounce_);
    bounce_ = nullptr;
    if (fd_ >= 0) close(fd_);
    fd_ = -1;
  }

 private:
  void Usable() {
    std::lock_guard<std::mutex> lock(state_mu_);
    if (closed_) throw Error(ErrorKind::kClosed, "Failed to use endpoint to " + reach_ + ": closed");
    if (!broken_.empty()) {
      throw Error(ErrorKind::kPeerLost, "Failed to use endpoint to " + reach_ + ": " + broken_, 0,
                  "connect a new endpoint once the peer is back");
    }
  }

  void Split(ibv_wr_opcode op, uint64_t local, uint32_t lkey, const RegionDesc& remote,
             uint64_t roff, uint64_t len, std::vector<Piece>* out) const {
    uint64_t cap = std::min<uint64_t>(kMaxMessage, mem_->dev().max_msg ? mem_->dev().max_msg : kMaxMessage);
    for (uint64_t done = 0; done < len;) {
      uint64_t n = std::min(cap, len - done);
      out->push_back({op, local + done, lkey, static_cast<uint32_t>(n),
                      remote.verbs_addr + roff + done, remote.verbs_rkey});
      done += n;
    }
  }

  // Posts the pieces in order (chains of at most kVerbsSendDepth, only the last of each chain
  // signaled: an RC send queue completes in order) and waits for each chain's completion.
  void Run(const std::vector<Piece>& pieces, const Deadline& deadline, const char* what) {
    for (size_t first = 0; first < pieces.size(); first += kVerbsSendDepth) {
      size_t n = std::min<size_t>(kVerbsSendDepth, pieces.size() - first);
      ibv_sge sge[kVerbsSendDepth];
      ibv_send_wr wr[kVerbsSendDepth];
      std::memset(wr, 0, sizeof(ibv_send_wr) * n);
      uint64_t id = ++next_wr_id_;
      for (size_t i = 0; i < n; ++i) {
        const Piece& p = pieces[first + i];
        sge[i] = {p.local, p.len, p.lkey};
        wr[i].wr_id = id;
        wr[i].sg_list = &sge[i];
        wr[i].num_sge = 1;
        wr[i].opcode = p.op;
        wr[i].wr.rdma.remote_addr = p.remote;
        wr[i].wr.rdma.rkey = p.rkey;
        wr[i].next = i + 1 < n ? &wr[i + 1] : nullptr;
      }
      wr[n - 1].send_flags = IBV_SEND_SIGNALED;
      ibv_send_wr* bad = nullptr;
      int rc = ibv_post_send(qp_->qp, wr, &bad);
      if (rc != 0) {
        if (bad == wr) ThrowErrno(ErrorKind::kFabric, std::string("Failed to post RDMA ") + what, rc);
        // Part of the chain is in flight: flush it before the buffers can be reused.
        Abort(id, ErrorKind::kFabric, std::string("Failed to post RDMA ") + what + ": " +
                                          std::strerror(rc));
      }
      Complete(id, deadline, what);
    }
  }

  // Polls the CQ until the work request `id` completes: spin, then yield, then short
  // sleeps (the domain's wait policy); every liveness_every_ns the side channel is
  // checked, so a dead peer process fails the transfer at once rather than after the
  // transport's retries.
  void Complete(uint64_t id, const Deadline& deadline, const char* what) {
    const IbvLib& lib = *mem_->dev().lib;
    auto start = Clock::now();
    auto next_liveness = start + std::chrono::nanoseconds(policy_.liveness_every_ns);
    std::string error;
    for (;;) {
      ibv_wc wc[8];
      int n = ibv_poll_cq(qp_->cq, 8, wc);
      if (n < 0) Abort(id, ErrorKind::kFabric, "Failed to poll the completion queue");
      bool done = false;
      for (int i = 0; i < n; ++i) {
        if (wc[i].status != IBV_WC_SUCCESS && error.empty()) error = Describe(lib, wc[i], what);
        if (wc[i].wr_id == id) done = true;
      }
      if (done) {
        if (!error.empty()) Broken(error);
        return;
      }
      if (n > 0) continue;
      auto now = Clock::now();
      if (closing_.load(std::memory_order_acquire)) {
        Abort(id, ErrorKind::kClosed, std::string("Failed to ") + what + ": the endpoint was closed");
      }
      if (deadline.passed()) {
        Abort(id, ErrorKind::kTimeout, std::string("Timed out on an RDMA ") + what + " to " + reach_);
      }
      if (now >= next_liveness) {
        next_liveness = now + std::chrono::nanoseconds(policy_.liveness_every_ns);
        if (PeerHungUp(fd_)) {
          Abort(id, ErrorKind::kPeerLost, "Peer lost: verbs peer " + reach_ +
                                              " closed its side channel during an RDMA " + what);
        }
      }
      uint64_t waited = std::chrono::duration_cast<std::chrono::nanoseconds>(now - start).count();
      if (waited < policy_.spin_ns) {
        _mm_pause();
      } else if (waited < policy_.spin_ns + policy_.yield_ns) {
        sched_yield();
      } else {
        // A long transfer: sleep in steps that grow with the time already waited (at most
        // 1/kSleepFraction late), so a 16 MiB write on a slow link is not interrupted by
        // thousands of wakeups competing for the core the device's work runs on.
        uint64_t step = std::min(kMaxCompletionSleepNs,
                                 std::max<uint64_t>(policy_.max_sleep_ns, waited / kSleepFraction));
        std::this_thread::sleep_for(std::chrono::nanoseconds(step));
      }
    }
  }

  std::string Describe(const IbvLib& lib, const ibv_wc& wc, const char* what) {
    std::string s = std::string("RDMA ") + what + " to " + reach_ + " failed: " + WcText(lib, wc);
    if (wc.status == IBV_WC_RETRY_EXC_ERR) {
      s = "Peer lost: " + s + "; the peer stopped acknowledging (it died or the network is down)";
    } else if (wc.status == IBV_WC_REM_ACCESS_ERR) {
      s += "; the peer's region is closed (deregistered) or the descriptor is stale";
    }
    return s;
  }

  [[noreturn]] void Broken(const std::string& error) {
    {
      std::lock_guard<std::mutex> lock(state_mu_);
      broken_ = error;
    }
    if (error.find("REM_ACCESS") != std::string::npos || error.find("remote access") != std::string::npos) {
      throw Error(ErrorKind::kRegion, error, EACCES, "ask the peer for a fresh descriptor");
    }
    throw Error(ErrorKind::kPeerLost, error, ECONNRESET,
                "the peer task died or its network path is down; see its log");
  }

  // Fails the queue pair so that work request `id` is flushed, waits (bounded) for it, and
  // throws: after this the endpoint is unusable.
  [[noreturn]] void Abort(uint64_t id, ErrorKind kind, const std::string& msg) {
    FailRcQp(qp_.get());
    Deadline drain = Deadline::After(kDrainSeconds);
    bool seen = false;
    while (!seen && !drain.passed()) {
      ibv_wc wc[8];
      int n = ibv_poll_cq(qp_->cq, 8, wc);
      if (n < 0) break;
      for (int i = 0; i < n; ++i) seen = seen || wc[i].wr_id == id;
      if (n == 0) std::this_thread::sleep_for(std::chrono::microseconds(100));
    }
    {
      std::lock_guard<std::mutex> lock(state_mu_);
      if (broken_.empty()) broken_ = msg;
    }
    throw Error(kind, msg, kind == ErrorKind::kTimeout ? ETIMEDOUT : ECONNRESET,
                kind == ErrorKind::kTimeout
                    ? "the peer is overloaded or unreachable; raise RDMADEV_DEADLINE_S"
                    : "the peer task died or closed the connection");
  }

  std::shared_ptr<VerbsMemory> mem_;
  std::unique_ptr<RcQp> qp_;
  int fd_;
  std::string reach_;
  WaitPolicy policy_;
  std::mutex mu_;        // one transfer at a time: owns the QP, CQ and bounce buffer
  std::mutex state_mu_;  // closed_ / broken_ (Alive must not wait for a transfer)
  std::atomic<bool> closing_{false};
  bool closed_ = false;
  std::string broken_;
  uint8_t* bounce_ = nullptr;
  ibv_mr* bounce_mr_ = nullptr;
  uint64_t next_wr_id_ = 0;
};

}  // namespace

std::shared_ptr<Endpoint> MakeVerbsEndpoint(std::shared_ptr<VerbsMemory> mem,
                                            std::unique_ptr<RcQp> qp, int fd, std::string reach,
                                            WaitPolicy policy) {
  return std::make_shared<VerbsEndpoint>(std::move(mem), std::move(qp), fd, std::move(reach),
                                         policy);
}
#endif

}  // namespace rdmadev
