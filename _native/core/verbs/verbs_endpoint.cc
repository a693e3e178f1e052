#include "verbs_endpoint.h"

#include <poll.h>
#include <sched.h>
#include <unistd.h>

#include <immintrin.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <deque>
#include <mutex>
#include <thread>
#include <vector>

#include "../sockio.h"
#include "verbs.h"

namespace rdmadev {

#if RDMADEV_HAVE_VERBS
namespace {

// Registered staging memory per endpoint. A write from memory outside every registered
// region (a TF tensor's buffer: what every TF send kernel passes) is copied into it and
// posted, and the write returns: the source may be reused at once, and the endpoint's next
// write (of any channel to this peer) is copied and posted while this one is on the wire.
// 4 MiB keeps four 1 MiB pieces in flight: at 100 Gb/s a piece is ~85 us on the wire and
// ~80 us of memcpy here, so the copy of the next piece hides behind the wire of the last.
constexpr uint64_t kStagingBytes = uint64_t(4) << 20;
// Largest piece of a staged write copied and posted at once (a quarter of the staging).
constexpr uint64_t kStagePieceBytes = uint64_t(1) << 20;
// Staging is handed out in whole cache lines (signal words, shape blocks, payload pieces).
constexpr uint64_t kStageAlign = kCacheLine;
// Largest single RDMA message posted, whatever the port allows (its max_msg_sz is 1-2 GiB
// on NICs): keeps any one work request's retransmission bounded.
constexpr uint64_t kMaxMessage = uint64_t(1) << 30;
// Work requests posted with one ibv_post_send: half the send queue, so a batch always fits
// beside the few unsignaled requests a write may leave before its signaled last one.
constexpr size_t kPostBatch = kVerbsSendDepth / 2;
// After moving a queue pair to the error state, how long its flushed completions may take;
// also how long Close waits for writes still on the wire to complete.
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

// Writes are asynchronous. Each one posts its work requests and returns once its source may
// be reused: a staged source at once (it was copied), a registered one when its requests
// complete (zero copy). Work requests are unsignaled except the last of each write and of
// each staged piece that more follow; an RC send queue completes in order, so a signaled
// completion releases every request posted before it and the staging they used (`pending_`).
// A failure seen after its write returned breaks the endpoint: the next write, read or
// liveness check on it fails with it.
class VerbsEndpoint : public Endpoint {
 public:
  VerbsEndpoint(std::shared_ptr<VerbsMemory> mem, std::unique_ptr<RcQp> qp, int fd,
                std::string reach, WaitPolicy policy)
      : mem_(std::move(mem)), qp_(std::move(qp)), fd_(fd), reach_(std::move(reach)),
        policy_(policy) {
    void* p = nullptr;
    if (posix_memalign(&p, kPageSize, kStagingBytes) != 0) {
      throw Error(ErrorKind::kRegion, "Failed to allocate the verbs staging buffer", ENOMEM);
    }
    staging_ = static_cast<uint8_t*>(p);
    std::memset(staging_, 0, kStagingBytes);
    try {
      staging_mr_ = mem_->RegisterBuffer(staging_, kStagingBytes, "the staging buffer");
    } catch (...) {
      free(staging_);
      throw;
    }
  }
  ~VerbsEndpoint() override { Close(); }

  std::string fabric() const override { return VerbsBackend::kName; }
  std::string peer() const override { return "verbs=" + reach_; }
  bool late_write_breaks() const override { return true; }

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
    ReapLocked(deadline, "write");
    std::vector<Piece> pieces;
    uint32_t lkey = 0;
    bool zero_copy = len > 0 && mem_->LocalKey(src, len, &lkey);
    if (zero_copy) {
      Split(IBV_WR_RDMA_WRITE, reinterpret_cast<uint64_t>(src), lkey, dst.desc, roff, len, &pieces);
      Post(pieces, sig == nullptr, deadline, "write");
    } else {
      const auto* s = static_cast<const uint8_t*>(src);
      for (uint64_t done = 0; done < len;) {
        uint64_t n = std::min(kStagePieceBytes, len - done);
        uint8_t* stage = Stage(n, deadline, "write");
        std::memcpy(stage, s + done, n);
        pieces.clear();
        Split(IBV_WR_RDMA_WRITE, reinterpret_cast<uint64_t>(stage), staging_mr_->lkey, dst.desc,
              roff + done, n, &pieces);
        done += n;
        Post(pieces, done < len || sig == nullptr, deadline, "write");
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
      auto* words = reinterpret_cast<uint64_t*>(Stage(kSignalBytes, deadline, "write"));
      words[0] = sig->seq;
      words[1] = sig->aux;
      uint64_t base = reinterpret_cast<uint64_t>(words);
      pieces.assign({{IBV_WR_RDMA_WRITE, base + 8, staging_mr_->lkey, 8,
                      dst.desc.verbs_addr + sig->off + 8, dst.desc.verbs_rkey},
                     {IBV_WR_RDMA_WRITE, base, staging_mr_->lkey, 8,
                      dst.desc.verbs_addr + sig->off, dst.desc.verbs_rkey}});
      Post(pieces, true, deadline, "write");
    }
    if (zero_copy) WaitLocked([this, id = next_wr_id_] { return completed_ >= id; }, deadline, "write");
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
      Post(pieces, true, deadline, "read");
      WaitLocked([this, id = next_wr_id_] { return completed_ >= id; }, deadline, "read");
      return;
    }
    auto* d = static_cast<uint8_t*>(dst);
    for (uint64_t done = 0; done < len;) {
      uint64_t n = std::min(kStagePieceBytes, len - done);
      uint8_t* stage = Stage(n, deadline, "read");
      pieces.clear();
      Split(IBV_WR_RDMA_READ, reinterpret_cast<uint64_t>(stage), staging_mr_->lkey, src.desc,
            roff + done, n, &pieces);
      Post(pieces, true, deadline, "read");
      WaitLocked([this, id = next_wr_id_] { return completed_ >= id; }, deadline, "read");
      std::memcpy(d + done, stage, n);
      done += n;
    }
  }

  bool PeerAlive(std::string* why) override {
    {
      // A write that failed after it returned is seen here too, when no transfer is polling
      // the completion queue (a sender waiting for a credit asks this).
      std::unique_lock<std::mutex> busy(mu_, std::try_to_lock);
      if (busy.owns_lock() && qp_) {
        std::string error;
        PollLocked(&error, "write");
        if (!error.empty()) MarkBroken(error);
      }
    }
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
    bool broken;
    {
      // Closed from here on: Alive answers "closed" at once instead of waiting out the drain.
      std::lock_guard<std::mutex> state(state_mu_);
      if (closed_) return;
      closed_ = true;
      broken = !broken_.empty();
    }
    // Writes still on the wire land first (their callers were told they were sent), unless
    // the queue pair failed or the peer is gone.
    Deadline drain = Deadline::After(kDrainSeconds);
    while (!broken && !pending_.empty() && !drain.passed() && !PeerHungUp(fd_)) {
      std::string error;
      if (!PollLocked(&error, "write")) std::this_thread::sleep_for(std::chrono::microseconds(100));
      if (!error.empty()) {
        MarkBroken(error);
        broken = true;
      }
    }
    qp_.reset();  // QP (then its CQ) before the staging's registration
    if (staging_mr_) mem_->DeregisterBuffer(staging_mr_);
    staging_mr_ = nullptr;
    free(staging_);
    staging_ = nullptr;
    if (fd_ >= 0) close(fd_);
    fd_ = -1;
  }

 private:
  // Requests posted up to and including the signaled one `wr_id`: its completion gives back
  // `wrs` send-queue entries and the staging below `staged_to`.
  struct Pending {
    uint64_t wr_id;
    uint64_t staged_to;
    uint64_t wrs;
  };

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

  // `n` bytes of staging (whole cache lines, contiguous), waiting for completions to give
  // some back when it is full. Staging is a ring: [tail_, head_) is in flight.
  uint8_t* Stage(uint64_t n, const Deadline& deadline, const char* what) {
    n = (n + kStageAlign - 1) / kStageAlign * kStageAlign;
    for (;;) {
      if (pending_.empty() && unsignaled_ == 0) head_ = tail_ = 0;  // all back: start over
      uint64_t at = head_ % kStagingBytes;
      uint64_t start = at + n > kStagingBytes ? head_ + (kStagingBytes - at) : head_;  // no wrap
      if (start + n - tail_ <= kStagingBytes) {
        head_ = start + n;
        return staging_ + start % kStagingBytes;
      }
      WaitLocked([this, seen = completed_] { return completed_ != seen; }, deadline, what);
    }
  }

  // Posts `pieces` in order, in batches; the last work request is signaled when `signal_last`
  // (and every batch's last when more batches follow, so that no wait is ever for requests
  // no completion covers).
  void Post(const std::vector<Piece>& pieces, bool signal_last, const Deadline& deadline,
            const char* what) {
    for (size_t first = 0; first < pieces.size(); first += kPostBatch) {
      const size_t n = std::min(kPostBatch, pieces.size() - first);
      const bool signaled = signal_last || first + n < pieces.size();
      WaitLocked([this, n] { return in_flight_ + n <= kVerbsSendDepth; }, deadline, what);
      ibv_sge sge[kPostBatch];
      ibv_send_wr wr[kPostBatch];
      std::memset(wr, 0, sizeof(ibv_send_wr) * n);
      const uint64_t id = ++next_wr_id_;
      for (size_t i = 0; i < n; ++i) {
        const Piece& p = pieces[first + i];
        sge[i] = {p.local, p.len, p.lkey};
        wr[i].wr_id = id;  // a failed or flushed request reports its batch
        wr[i].sg_list = &sge[i];
        wr[i].num_sge = 1;
        wr[i].opcode = p.op;
        wr[i].wr.rdma.remote_addr = p.remote;
        wr[i].wr.rdma.rkey = p.rkey;
        wr[i].next = i + 1 < n ? &wr[i + 1] : nullptr;
      }
      if (signaled) wr[n - 1].send_flags = IBV_SEND_SIGNALED;
      in_flight_ += n;
      if (signaled) {
        pending_.push_back({id, head_, unsignaled_ + n});
        unsignaled_ = 0;
      } else {
        unsignaled_ += n;
      }
      ibv_send_wr* bad = nullptr;
      int rc = ibv_post_send(qp_->qp, wr, &bad);
      if (rc != 0) {
        // Part of the chain may be in flight: flush it before the buffers can be reused.
        Abort(ErrorKind::kFabric, std::string("Failed to post RDMA ") + what + ": " + std::strerror(rc));
      }
    }
  }

  // Takes what the completion queue holds without waiting: releases the requests and staging
  // that each signaled completion covers. Returns whether anything was there; `*error` gets
  // the first failed completion's description. Never throws (Close and PeerAlive call it).
  bool PollLocked(std::string* error, const char* what) {
    const IbvLib& lib = *mem_->dev().lib;
    ibv_wc wc[16];
    int n = ibv_poll_cq(qp_->cq, 16, wc);
    if (n < 0) {
      if (error->empty()) *error = "Failed to poll the completion queue of the queue pair to " + reach_;
      return false;
    }
    for (int i = 0; i < n; ++i) {
      if (wc[i].status != IBV_WC_SUCCESS && error->empty()) *error = Describe(lib, wc[i], what);
      Release(wc[i].wr_id);
    }
    return n > 0;
  }

  void Release(uint64_t wr_id) {
    while (!pending_.empty() && pending_.front().wr_id <= wr_id) {
      tail_ = pending_.front().staged_to;
      in_flight_ -= pending_.front().wrs;
      completed_ = pending_.front().wr_id;
      pending_.pop_front();
    }
  }

  // What has completed, without waiting; a failure among it throws.
  void ReapLocked(const Deadline& deadline, const char* what) {
    WaitLocked([] { return true; }, deadline, what);
  }

  // Polls the CQ until `done()`: spin, then yield, then short sleeps (the domain's wait
  // policy); every liveness_every_ns the side channel is checked, so a dead peer process
  // fails the transfer at once rather than after the transport's retries.
  template <typename Done>
  void WaitLocked(Done done, const Deadline& deadline, const char* what) {
    auto start = Clock::now();
    auto next_liveness = start + std::chrono::nanoseconds(policy_.liveness_every_ns);
    for (;;) {
      std::string error;
      bool polled = PollLocked(&error, what);
      if (!error.empty()) Broken(error);
      if (done()) return;
      if (polled) continue;
      if (pending_.empty()) {
        // Unreachable: every wait is for something a signaled request covers.
        Abort(ErrorKind::kFabric, std::string("Failed to ") + what +
                                      ": waiting on the verbs send queue with nothing signaled");
      }
      auto now = Clock::now();
      if (closing_.load(std::memory_order_acquire)) {
        Abort(ErrorKind::kClosed, std::string("Failed to ") + what + ": the endpoint was closed");
      }
      if (deadline.passed()) {
        Abort(ErrorKind::kTimeout, std::string("Timed out on an RDMA ") + what + " to " + reach_);
      }
      if (now >= next_liveness) {
        next_liveness = now + std::chrono::nanoseconds(policy_.liveness_every_ns);
        if (PeerHungUp(fd_)) {
          Abort(ErrorKind::kPeerLost, "Peer lost: verbs peer " + reach_ +
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

  void MarkBroken(const std::string& error) {
    std::lock_guard<std::mutex> lock(state_mu_);
    if (broken_.empty()) broken_ = error;
  }

  [[noreturn]] void Broken(const std::string& error) {
    MarkBroken(error);
    if (error.find("REM_ACCESS") != std::string::npos || error.find("remote access") != std::string::npos) {
      throw Error(ErrorKind::kRegion, error, EACCES, "ask the peer for a fresh descriptor");
    }
    throw Error(ErrorKind::kPeerLost, error, ECONNRESET,
                "the peer task died or its network path is down; see its log");
  }

  // Fails the queue pair so that every outstanding request is flushed, waits (bounded) for
  // them, and throws: after this the endpoint is unusable.
  [[noreturn]] void Abort(ErrorKind kind, const std::string& msg) {
    FailRcQp(qp_.get());
    Deadline drain = Deadline::After(kDrainSeconds);
    const uint64_t last = next_wr_id_;
    while (completed_ < last && !drain.passed()) {
      ibv_wc wc[16];
      int n = ibv_poll_cq(qp_->cq, 16, wc);
      if (n < 0) break;
      for (int i = 0; i < n; ++i) {
        Release(wc[i].wr_id);
        completed_ = std::max(completed_, wc[i].wr_id);
      }
      if (n == 0) std::this_thread::sleep_for(std::chrono::microseconds(100));
    }
    MarkBroken(msg);
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
  std::mutex mu_;        // one poster at a time: owns the QP, CQ, staging and the state below
  std::mutex state_mu_;  // closed_ / broken_ (Alive must not wait for a transfer)
  std::atomic<bool> closing_{false};
  bool closed_ = false;
  std::string broken_;
  uint8_t* staging_ = nullptr;
  ibv_mr* staging_mr_ = nullptr;
  uint64_t head_ = 0;               // staging handed out up to here (a byte count, wrapping)
  uint64_t tail_ = 0;               // ... and given back up to here
  std::deque<Pending> pending_;     // signaled requests not yet completed, in post order
  uint64_t unsignaled_ = 0;         // requests posted since the last signaled one
  uint64_t in_flight_ = 0;          // send-queue entries taken (<= kVerbsSendDepth)
  uint64_t next_wr_id_ = 0;         // the last batch posted
  uint64_t completed_ = 0;          // the last signaled batch completed
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
