#include "verbs_send_queue.h"

#include <sched.h>

#include <immintrin.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <thread>

#include "../sockio.h"

namespace rdmadev {

#if RDMADEV_HAVE_VERBS
namespace {

// Staging is handed out in whole cache lines (signal words, shape blocks, payload pieces).
constexpr uint64_t kStageAlign = kCacheLine;
// Largest single RDMA message posted, whatever the port allows (its max_msg_sz is 1-2 GiB
// on NICs): keeps any one work request's retransmission bounded.
constexpr uint64_t kMaxMessage = uint64_t(1) << 30;
// Work requests posted with one ibv_post_send: half the send queue, so a batch always fits
// beside the few unsignaled requests a write may leave before its signaled last one.
constexpr size_t kPostBatch = kVerbsSendDepth / 2;
// Completion polling of a long transfer sleeps waited/64 at a time (<= 1.6% late), at most
// 2 ms: a wakeup costs ~30 us of CPU here (much more under emulation), and a 1 MiB write at
// the slowest link rdmadev runs on (Soft-RoCE under emulation, ~50 MB/s) takes ~20 ms.
constexpr uint64_t kSleepFraction = 64;
constexpr uint64_t kMaxCompletionSleepNs = 2000000;

std::string WcText(const IbvLib& lib, const ibv_wc& wc) {
  return std::string(lib.wc_status_str(wc.status)) + " (wc status " +
         std::to_string(static_cast<int>(wc.status)) + ", vendor error " +
         std::to_string(wc.vendor_err) + ")";
}

}  // namespace

VerbsSendQueue::VerbsSendQueue(std::shared_ptr<VerbsMemory> mem, std::unique_ptr<RcQp> qp,
                               Watch watch)
    : mem_(std::move(mem)), qp_(std::move(qp)), watch_(std::move(watch)) {
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

VerbsSendQueue::~VerbsSendQueue() {
  qp_.reset();  // QP (then its CQ) before the staging's registration
  if (staging_mr_) mem_->DeregisterBuffer(staging_mr_);
  free(staging_);
}

void VerbsSendQueue::Split(ibv_wr_opcode op, uint64_t local, uint32_t lkey,
                           const RegionDesc& remote, uint64_t roff, uint64_t len,
                           std::vector<Piece>* out) const {
  uint64_t cap = std::min<uint64_t>(kMaxMessage, mem_->dev().max_msg ? mem_->dev().max_msg : kMaxMessage);
  for (uint64_t done = 0; done < len;) {
    uint64_t n = std::min(cap, len - done);
    out->push_back({op, local + done, lkey, static_cast<uint32_t>(n),
                    remote.verbs_addr + roff + done, remote.verbs_rkey});
    done += n;
  }
}

// Staging is a ring: [tail_, head_) is in flight.
uint8_t* VerbsSendQueue::Stage(uint64_t n, const Deadline& deadline, const char* what) {
  n = (n + kStageAlign - 1) / kStageAlign * kStageAlign;
  for (;;) {
    if (pending_.empty() && unsignaled_ == 0) head_ = tail_ = 0;  // all back: start over
    uint64_t at = head_ % kStagingBytes;
    uint64_t start = at + n > kStagingBytes ? head_ + (kStagingBytes - at) : head_;  // no wrap
    if (start + n - tail_ <= kStagingBytes) {
      head_ = start + n;
      return staging_ + start % kStagingBytes;
    }
    Wait([this, seen = completed_] { return completed_ != seen; }, deadline, what);
  }
}

uint32_t VerbsSendQueue::staging_lkey() const { return staging_mr_->lkey; }

void VerbsSendQueue::Post(const std::vector<Piece>& pieces, bool signal_last,
                          const Deadline& deadline, const char* what) {
  for (size_t first = 0; first < pieces.size(); first += kPostBatch) {
    const size_t n = std::min(kPostBatch, pieces.size() - first);
    const bool signaled = signal_last || first + n < pieces.size();
    Wait([this, n] { return in_flight_ + n <= kVerbsSendDepth; }, deadline, what);
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

void VerbsSendQueue::WaitPosted(const Deadline& deadline, const char* what) {
  Wait([this, id = next_wr_id_] { return completed_ >= id; }, deadline, what);
}

void VerbsSendQueue::Reap(const Deadline& deadline, const char* what) {
  Wait([] { return true; }, deadline, what);
}

bool VerbsSendQueue::Poll(std::string* error, const char* what) {
  const IbvLib& lib = *mem_->dev().lib;
  ibv_wc wc[16];
  int n = ibv_poll_cq(qp_->cq, 16, wc);
  if (n < 0) {
    if (error->empty()) *error = "Failed to poll the completion queue of the queue pair to " + watch_.reach;
    return false;
  }
  for (int i = 0; i < n; ++i) {
    if (wc[i].status != IBV_WC_SUCCESS && error->empty()) *error = Describe(lib, wc[i], what);
    Release(wc[i].wr_id);
  }
  return n > 0;
}

void VerbsSendQueue::Release(uint64_t wr_id) {
  while (!pending_.empty() && pending_.front().wr_id <= wr_id) {
    tail_ = pending_.front().staged_to;
    in_flight_ -= pending_.front().wrs;
    completed_ = pending_.front().wr_id;
    pending_.pop_front();
  }
}

// Polls the CQ until `done()`: spin, then yield, then short sleeps (the domain's wait
// policy); every liveness_every_ns the side channel is checked, so a dead peer process
// fails the transfer at once rather than after the transport's retries.
template <typename Done>
void VerbsSendQueue::Wait(Done done, const Deadline& deadline, const char* what) {
  const WaitPolicy& policy = watch_.policy;
  auto start = Clock::now();
  auto next_liveness = start + std::chrono::nanoseconds(policy.liveness_every_ns);
  for (;;) {
    std::string error;
    bool polled = Poll(&error, what);
    if (!error.empty()) Broken(error);
    if (done()) return;
    if (polled) continue;
    if (pending_.empty()) {
      // Unreachable: every wait is for something a signaled request covers.
      Abort(ErrorKind::kFabric, std::string("Failed to ") + what +
                                    ": waiting on the verbs send queue with nothing signaled");
    }
    auto now = Clock::now();
    if (watch_.closing->load(std::memory_order_acquire)) {
      Abort(ErrorKind::kClosed, std::string("Failed to ") + what + ": the endpoint was closed");
    }
    if (deadline.passed()) {
      Abort(ErrorKind::kTimeout, std::string("Timed out on an RDMA ") + what + " to " + watch_.reach);
    }
    if (now >= next_liveness) {
      next_liveness = now + std::chrono::nanoseconds(policy.liveness_every_ns);
      if (PeerHungUp(watch_.side_fd)) {
        Abort(ErrorKind::kPeerLost, "Peer lost: verbs peer " + watch_.reach +
                                        " closed its side channel during an RDMA " + what);
      }
    }
    uint64_t waited = std::chrono::duration_cast<std::chrono::nanoseconds>(now - start).count();
    if (waited < policy.spin_ns) {
      _mm_pause();
    } else if (waited < policy.spin_ns + policy.yield_ns) {
      sched_yield();
    } else {
      // A long transfer: sleep in steps that grow with the time already waited (at most
      // 1/kSleepFraction late), so a 16 MiB write on a slow link is not interrupted by
      // thousands of wakeups competing for the core the device's work runs on.
      uint64_t step = std::min(kMaxCompletionSleepNs,
                               std::max<uint64_t>(policy.max_sleep_ns, waited / kSleepFraction));
      std::this_thread::sleep_for(std::chrono::nanoseconds(step));
    }
  }
}

std::string VerbsSendQueue::Describe(const IbvLib& lib, const ibv_wc& wc, const char* what) const {
  std::string s = std::string("RDMA ") + what + " to " + watch_.reach + " failed: " + WcText(lib, wc);
  if (wc.status == IBV_WC_RETRY_EXC_ERR) {
    s = "Peer lost: " + s +
        "; the peer stopped acknowledging (it died or the network is down; on Soft-RoCE, its "
        "loaded host may acknowledge later than RDMADEV_ACK_TIMEOUT allows: raise it)";
  } else if (wc.status == IBV_WC_REM_ACCESS_ERR) {
    s += "; the peer's region is closed (deregistered) or the descriptor is stale";
  }
  return s;
}

void VerbsSendQueue::Broken(const std::string& error) {
  watch_.broken(error);
  if (error.find("REM_ACCESS") != std::string::npos || error.find("remote access") != std::string::npos) {
    throw Error(ErrorKind::kRegion, error, EACCES, "ask the peer for a fresh descriptor");
  }
  throw Error(ErrorKind::kPeerLost, error, ECONNRESET,
              "the peer task died or its network path is down; see its log");
}

// Fails the queue pair so that every outstanding request is flushed, waits (bounded) for
// them, and throws: after this the queue is unusable.
void VerbsSendQueue::Abort(ErrorKind kind, const std::string& msg) {
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
  watch_.broken(msg);
  throw Error(kind, msg, kind == ErrorKind::kTimeout ? ETIMEDOUT : ECONNRESET,
              kind == ErrorKind::kTimeout
                  ? "the peer is overloaded or unreachable; raise RDMADEV_DEADLINE_S"
                  : "the peer task died or closed the connection");
}
#endif

}  // namespace rdmadev
