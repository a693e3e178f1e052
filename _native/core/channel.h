// Channel: one transfer stream from a sender task to a receiver task, as a ring of K >= 2
// slots in a region on the receiver, with credits returned to the sender so that a slot
// the receiver still holds is never overwritten.
//
// Slot i (of stride S = 64 + capacity rounded up to 64) starts with a 64-byte header:
// u64 sequence word at +0 and u64 byte length at +8, written by the sender's Signal after
// the payload at +64. Transfer n (counted from epoch+1, an epoch both sides agree on at
// setup, never read from memory) goes to slot (n - epoch - 1) % K. The sender's credit
// region holds at +0 the highest n the receiver has released (in order).
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <utility>
#include <vector>

#include "completion.h"
#include "fabric.h"
#include "region.h"

namespace rdmadev {

struct RingLayout {
  uint32_t slots = 2;
  uint64_t capacity = 0;  // payload bytes per slot
  uint64_t base = 0;      // offset of slot 0 in the region (a plan packs several rings)

  static constexpr uint64_t kHeader = kCacheLine;
  uint64_t stride() const { return kHeader + RoundUp(capacity, kCacheLine); }
  uint64_t bytes() const { return stride() * slots; }
  uint64_t header(uint64_t i) const { return base + i * stride(); }
  uint64_t payload(uint64_t i) const { return base + i * stride() + kHeader; }
  void Validate() const;  // throws kConfig
};
constexpr uint64_t kCreditBytes = kCacheLine;

// Both halves are safe to call from several threads (TF kernels, the progress thread,
// tensor buffers released anywhere).
class RingSender {
 public:
  RingSender(std::shared_ptr<Endpoint> to_receiver, std::shared_ptr<RemoteRegion> ring,
             RingLayout layout, std::shared_ptr<Region> credit, uint64_t epoch, WaitPolicy policy);
  // Waits for a free slot (credit), writes len bytes from src and signals; returns n.
  uint64_t Send(const void* src, uint64_t len, const Deadline& deadline);
  uint64_t sent() const { return sent_; }
  // For asynchronous senders: the credit word and the value it must reach before the next
  // Send can go without waiting (target 0: it already can).
  std::pair<const std::atomic<uint64_t>*, uint64_t> CreditNeeded() const;
  const RingLayout& layout() const { return layout_; }
  const std::shared_ptr<Endpoint>& endpoint() const { return ep_; }

 private:
  mutable std::mutex mu_;
  std::shared_ptr<Endpoint> ep_;
  std::shared_ptr<RemoteRegion> ring_;
  RingLayout layout_;
  std::shared_ptr<Region> credit_;
  uint64_t epoch_, sent_;
  WaitPolicy policy_;
};

struct Slot {
  uint64_t seq = 0;
  const uint8_t* data = nullptr;
  uint64_t length = 0;
};

class RingReceiver {
 public:
  RingReceiver(std::shared_ptr<Region> ring, RingLayout layout,
               std::shared_ptr<Endpoint> to_sender, std::shared_ptr<RemoteRegion> credit,
               uint64_t epoch, WaitPolicy policy);
  // Waits for the next transfer in order. At most K may be held (acquired, not released).
  Slot Acquire(const Deadline& deadline);
  // Gives slot `seq` back; the sender's credit advances over every released prefix.
  void Release(uint64_t seq, const Deadline& deadline);
  uint64_t acquired() const;
  uint64_t credit() const;
  uint64_t held() const;  // acquired, not yet released

  // Asynchronous receiving (the TF wait kernel): Reserve() hands out the next sequence
  // number in call order, WordFor(n) is the word to wait on (it reaches n), and Take(n),
  // once it has, acquires the slot without waiting.
  uint64_t Reserve();
  const std::atomic<uint64_t>* WordFor(uint64_t n) const;
  Slot Take(uint64_t n);
  const RingLayout& layout() const { return layout_; }
  const std::shared_ptr<Endpoint>& endpoint() const { return ep_; }

 private:
  Slot TakeLocked(uint64_t n, uint64_t seen);
  std::shared_ptr<Region> ring_;
  RingLayout layout_;
  std::shared_ptr<Endpoint> ep_;
  std::shared_ptr<RemoteRegion> credit_;
  uint64_t epoch_, acquired_, credit_seq_;
  uint64_t reported_;  // highest credit written to the sender
  std::vector<bool> released_;  // by slot, for transfers in (credit_seq_, acquired_]
  WaitPolicy policy_;
  mutable std::mutex mu_;
  uint64_t reserved_;  // highest sequence handed out by Reserve()
};

}  // namespace rdmadev
