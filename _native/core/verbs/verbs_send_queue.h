// The send side of one verbs endpoint's queue pair: work requests posted in batches, the
// registered staging ring that sources outside every registered region are copied through,
// and the completions that give both back.
//
// Work requests are unsignaled except the last of each write and of each batch that more
// follow; an RC send queue completes in order, so a signaled completion releases every
// request posted before it and the staging they used. A failed completion, a failed post or a
// wait that cannot go on (deadline, closing, the peer's side channel hung up) breaks the
// queue for good: the endpoint hears why (Watch::broken) and the call throws.
#pragma once

#include <atomic>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "../completion.h"
#include "../region.h"
#include "ibv_lib.h"
#include "verbs_memory.h"
#include "verbs_qp.h"

namespace rdmadev {

// Registered staging memory per endpoint. A write from memory outside every registered
// region (a TF tensor's buffer: what every TF send kernel passes) is copied into it and
// posted, and the write returns: the source may be reused at once, and the endpoint's next
// write (of any channel to this peer) is copied and posted while this one is on the wire.
// 4 MiB keeps four 1 MiB pieces in flight: at 100 Gb/s a piece is ~85 us on the wire and
// ~80 us of memcpy here, so the copy of the next piece hides behind the wire of the last.
// Outside the #if: rdmadev.config sizes memlock budgets by it (the bindings export it as
// VERBS_STAGING_BYTES) on builds without verbs too.
constexpr uint64_t kStagingBytes = uint64_t(4) << 20;
#if RDMADEV_HAVE_VERBS
// Send work requests a queue pair may have outstanding. A staged write takes 1 per 1 MiB
// piece + 2 for the signal, so 64 keeps every piece the staging holds (4) and the writes of
// dozens of small tensors on the wire at once; a poster waits for completions beyond it.
constexpr int kVerbsSendDepth = 64;
// Largest piece of a staged write copied and posted at once (a quarter of the staging).
constexpr uint64_t kStagePieceBytes = uint64_t(1) << 20;
// After moving a queue pair to the error state, how long its flushed completions may take;
// also how long an endpoint's Close waits for writes still on the wire to complete.
constexpr double kDrainSeconds = 5.0;

// One RDMA message of a transfer.
struct Piece {
  ibv_wr_opcode op;
  uint64_t local;
  uint32_t lkey;
  uint32_t len;
  uint64_t remote;
  uint32_t rkey;
};

// Not thread-safe: the endpoint's lock serializes every call.
class VerbsSendQueue {
 public:
  // What a wait watches besides the queue, given by the endpoint.
  struct Watch {
    std::string reach;  // the peer, for messages
    int side_fd = -1;   // the side channel: hung up means the peer's process is gone
    WaitPolicy policy;
    const std::atomic<bool>* closing = nullptr;  // set when the endpoint closes
    std::function<void(const std::string&)> broken;  // told why the queue broke
  };

  // Takes the queue pair; allocates and registers the staging (throws kRegion).
  VerbsSendQueue(std::shared_ptr<VerbsMemory> mem, std::unique_ptr<RcQp> qp, Watch watch);
  // The queue pair (then its completion queue) goes before the staging's registration.
  ~VerbsSendQueue();
  VerbsSendQueue(const VerbsSendQueue&) = delete;
  VerbsSendQueue& operator=(const VerbsSendQueue&) = delete;

  // The messages of an RDMA `op` of `len` bytes between local memory (`lkey`) at `local` and
  // the peer's region at `roff`, each at most the port's largest message.
  void Split(ibv_wr_opcode op, uint64_t local, uint32_t lkey, const RegionDesc& remote,
             uint64_t roff, uint64_t len, std::vector<Piece>* out) const;
  // `n` bytes of staging (whole cache lines, contiguous), waiting for completions to give
  // some back when it is full.
  uint8_t* Stage(uint64_t n, const Deadline& deadline, const char* what);
  uint32_t staging_lkey() const;
  // Posts `pieces` in order, in batches; the last work request is signaled when
  // `signal_last` (and every batch's last when more batches follow, so that no wait is ever
  // for requests no completion covers).
  void Post(const std::vector<Piece>& pieces, bool signal_last, const Deadline& deadline,
            const char* what);
  // Waits until every request posted so far has completed.
  void WaitPosted(const Deadline& deadline, const char* what);
  // Takes what has completed, without waiting; a failure among it throws.
  void Reap(const Deadline& deadline, const char* what);
  // Takes what the completion queue holds without waiting: releases the requests and
  // staging that each signaled completion covers. Returns whether anything was there;
  // `*error` gets the first failed completion's description. Never throws.
  bool Poll(std::string* error, const char* what);
  // Whether every signaled request has completed.
  bool idle() const { return pending_.empty(); }

 private:
  // Requests posted up to and including the signaled one `wr_id`: its completion gives back
  // `wrs` send-queue entries and the staging below `staged_to`.
  struct Pending {
    uint64_t wr_id;
    uint64_t staged_to;
    uint64_t wrs;
  };

  void Release(uint64_t wr_id);
  template <typename Done>
  void Wait(Done done, const Deadline& deadline, const char* what);
  std::string Describe(const IbvLib& lib, const ibv_wc& wc, const char* what) const;
  [[noreturn]] void Broken(const std::string& error);
  [[noreturn]] void Abort(ErrorKind kind, const std::string& msg);

  std::shared_ptr<VerbsMemory> mem_;
  std::unique_ptr<RcQp> qp_;
  const Watch watch_;
  uint8_t* staging_ = nullptr;
  ibv_mr* staging_mr_ = nullptr;
  uint64_t head_ = 0;            // staging handed out up to here (a byte count, wrapping)
  uint64_t tail_ = 0;            // ... and given back up to here
  std::deque<Pending> pending_;  // signaled requests not yet completed, in post order
  uint64_t unsignaled_ = 0;      // requests posted since the last signaled one
  uint64_t in_flight_ = 0;       // send-queue entries taken (<= kVerbsSendDepth)
  uint64_t next_wr_id_ = 0;      // the last batch posted
  uint64_t completed_ = 0;       // the last signaled batch completed
};
#endif

}  // namespace rdmadev
