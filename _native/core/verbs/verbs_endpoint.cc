#include "verbs_endpoint.h"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <mutex>
#include <thread>
#include <vector>

#include "../sockio.h"
#include "verbs.h"

namespace rdmadev {

#if RDMADEV_HAVE_VERBS
namespace {

// How long attaching a region waits for the READ of its directory word: the queue pair's
// retry budget (~1.9 s by default, at most 7.5 s: verbs_qp.h, verbs_options.h) and then some
// on a loaded host.
constexpr double kAttachReadS = 10;

void RequireVerbsKey(const RegionDesc& d) {
  if (d.verbs_rkey == 0) {
    throw Error(ErrorKind::kProtocol,
                "Failed to address peer region " + std::to_string(d.id) +
                    " over verbs: its descriptor carries no RDMA registration",
                0, "the owner must open the verbs fabric before allocating the region");
  }
}

// Writes are asynchronous. Each one posts its work requests on the send queue
// (verbs_send_queue.h) and returns once its source may be reused: a staged source at once
// (it was copied), a registered one when its requests complete (zero copy). A failure seen
// after its write returned breaks the endpoint: the next write, read or liveness check on it
// fails with it.
class VerbsEndpoint : public Endpoint {
 public:
  VerbsEndpoint(std::shared_ptr<VerbsMemory> mem, std::unique_ptr<RcQp> qp, int fd,
                std::string reach, WaitPolicy policy)
      : mem_(mem), fd_(fd), reach_(std::move(reach)) {
    VerbsSendQueue::Watch watch;
    watch.reach = reach_;
    watch.side_fd = fd_;
    watch.policy = policy;
    watch.closing = &closing_;
    watch.broken = [this](const std::string& error) { MarkBroken(error); };
    sq_ = std::make_unique<VerbsSendQueue>(std::move(mem), std::move(qp), std::move(watch));
  }
  ~VerbsEndpoint() override { Close(); }

  std::string fabric() const override { return VerbsBackend::kName; }
  std::string peer() const override { return "verbs=" + reach_; }
  bool late_write_breaks() const override { return true; }

  // One RDMA READ of the region's directory word in its chunk: a closed region is refused.
  std::shared_ptr<RemoteRegion> Attach(const RegionDesc& desc) override {
    RequireVerbsKey(desc);
    if (desc.offset % kPageSize != 0 || desc.offset > desc.verbs_addr) {
      throw Error(ErrorKind::kProtocol, "Failed to attach region " + std::to_string(desc.id) +
                                            ": its offset in its chunk is malformed",
                  0, "pass the exact descriptor the owning process gave");
    }
    RemoteRegion directory(desc);
    directory.desc.size = 8;
    directory.desc.verbs_addr = desc.verbs_addr - desc.offset + Chunk::DirectoryOffset(desc.offset);
    uint64_t entry = 0;
    Read(directory, 0, &entry, sizeof entry, Deadline::After(kAttachReadS));
    CheckRegionLive(desc, entry);
    return std::make_shared<RemoteRegion>(desc);
  }

  void Write(const void* src, const RemoteRegion& dst, uint64_t roff, uint64_t len,
             const Signal* sig, const Deadline& deadline) override {
    CheckRemoteRange(dst.desc, roff, len, sig);
    RequireVerbsKey(dst.desc);
    std::lock_guard<std::mutex> lock(mu_);
    Usable();
    sq_->Reap(deadline, "write");
    std::vector<Piece> pieces;
    uint32_t lkey = 0;
    bool zero_copy = len > 0 && mem_->LocalKey(src, len, &lkey);
    if (zero_copy) {
      sq_->Split(IBV_WR_RDMA_WRITE, reinterpret_cast<uint64_t>(src), lkey, dst.desc, roff, len,
                 &pieces);
      sq_->Post(pieces, sig == nullptr, deadline, "write");
    } else {
      const auto* s = static_cast<const uint8_t*>(src);
      for (uint64_t done = 0; done < len;) {
        uint64_t n = std::min(kStagePieceBytes, len - done);
        uint8_t* stage = sq_->Stage(n, deadline, "write");
        std::memcpy(stage, s + done, n);
        pieces.clear();
        sq_->Split(IBV_WR_RDMA_WRITE, reinterpret_cast<uint64_t>(stage), sq_->staging_lkey(),
                   dst.desc, roff + done, n, &pieces);
        done += n;
        sq_->Post(pieces, done < len || sig == nullptr, deadline, "write");
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
      auto* words = reinterpret_cast<uint64_t*>(sq_->Stage(kSignalBytes, deadline, "write"));
      words[0] = sig->seq;
      words[1] = sig->aux;
      uint64_t base = reinterpret_cast<uint64_t>(words);
      pieces.assign({{IBV_WR_RDMA_WRITE, base + 8, sq_->staging_lkey(), 8,
                      dst.desc.verbs_addr + sig->off + 8, dst.desc.verbs_rkey},
                     {IBV_WR_RDMA_WRITE, base, sq_->staging_lkey(), 8,
                      dst.desc.verbs_addr + sig->off, dst.desc.verbs_rkey}});
      sq_->Post(pieces, true, deadline, "write");
    }
    if (zero_copy) sq_->WaitPosted(deadline, "write");
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
      sq_->Split(IBV_WR_RDMA_READ, reinterpret_cast<uint64_t>(dst), lkey, src.desc, roff, len,
                 &pieces);
      sq_->Post(pieces, true, deadline, "read");
      sq_->WaitPosted(deadline, "read");
      return;
    }
    auto* d = static_cast<uint8_t*>(dst);
    for (uint64_t done = 0; done < len;) {
      uint64_t n = std::min(kStagePieceBytes, len - done);
      uint8_t* stage = sq_->Stage(n, deadline, "read");
      pieces.clear();
      sq_->Split(IBV_WR_RDMA_READ, reinterpret_cast<uint64_t>(stage), sq_->staging_lkey(),
                 src.desc, roff + done, n, &pieces);
      sq_->Post(pieces, true, deadline, "read");
      sq_->WaitPosted(deadline, "read");
      std::memcpy(d + done, stage, n);
      done += n;
    }
  }

  bool PeerAlive(std::string* why) override {
    {
      // A write that failed after it returned is seen here too, when no transfer is polling
      // the completion queue (a sender waiting for a credit asks this).
      std::unique_lock<std::mutex> busy(mu_, std::try_to_lock);
      if (busy.owns_lock() && sq_) {
        std::string error;
        sq_->Poll(&error, "write");
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
    while (!broken && !sq_->idle() && !drain.passed() && !PeerHungUp(fd_)) {
      std::string error;
      if (!sq_->Poll(&error, "write")) std::this_thread::sleep_for(std::chrono::microseconds(100));
      if (!error.empty()) {
        MarkBroken(error);
        broken = true;
      }
    }
    sq_.reset();  // the queue pair, then the staging's registration
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

  void MarkBroken(const std::string& error) {
    std::lock_guard<std::mutex> lock(state_mu_);
    if (broken_.empty()) broken_ = error;
  }

  std::shared_ptr<VerbsMemory> mem_;
  int fd_;
  std::string reach_;
  std::mutex mu_;        // one poster at a time: owns the send queue
  std::mutex state_mu_;  // closed_ / broken_ (Alive must not wait for a transfer)
  std::atomic<bool> closing_{false};
  bool closed_ = false;
  std::string broken_;
  std::unique_ptr<VerbsSendQueue> sq_;  // null once closed
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
