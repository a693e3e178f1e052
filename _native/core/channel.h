// Channel: one transfer stream from a sender task to a receiver task, as a ring of K >= 1
// slots in a region on the receiver (the plan gives a static channel 1, a dynamic one 2),
// with credits returned to the sender so that a slot the receiver still holds is never
// overwritten.
//
// The ring's layout is the plan's, built from the constants below (the one definition: the
// bindings hand them to the planner, rdmadev._core.wire_layout(), graph_pass.layout.Layout):
// slot i starts at base + i * slot_bytes with a 64-byte header (u64 sequence word at
// +kSeqOffset and u64 byte length at +kLengthOffset, both written by the sender's Signal
// after the payload at +payload_offset). The ring never computes a stride of its own; it
// validates what it is given. Transfer n (counted from epoch+1, an epoch both sides agree on at
// setup, never read from memory) goes to slot (n - epoch - 1) % K. The sender's credit
// region holds, at the channel's credit offset, the highest n the receiver has released (in
// order); the channels of one task pair share one credit region, a cache line each.
//
// Steps: a slot's length word carries, above the payload length, the sender's step tag
// (StepTag of TF's step id, which the two tasks of one step share; 0 = untagged). A step that
// fails leaves the ring consistent: a receiver whose wait ends without a transfer gives its
// sequence number back (Abandon), and a transfer that arrives for a step whose receive had
// given up carries a tag that is not the current step's, so the next receive discards it
// (Discard) and takes the next one. Sequence numbers thus stay in step across cancelled and
// timed-out steps; no epoch change is needed.
//
// Steps of one channel run one at a time, but a step its caller gave up can still start
// receiving here after the next one began (TF cancels the remote part of a failed step with
// an RPC that can arrive before that part starts, and is then lost). So a reservation
// records its step's tag, and a receive of another step takes the place of receives still
// waiting (Reserve supersedes them: Take then refuses them, Abandon does nothing for them).
// The receive layer (_native/tf/kernels/recv_op.cc) leaves a transfer of a step not known to have failed here for
// that step's own receive for a while before taking it as a late one.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <utility>
#include <vector>

#include "completion.h"
#include "fabric.h"
#include "region.h"

namespace rdmadev {

// The length word: payload length in the low kTagShift bits, the step tag above them.
constexpr int kTagShift = 40;
constexpr uint64_t kMaxPayloadBytes = uint64_t(1) << kTagShift;  // 1 TiB per tensor
constexpr uint32_t kMaxTag = (1u << (64 - kTagShift)) - 1;
// The length of the marker transfer that moves a channel to its successor ring: above any
// capacity a layout may have (RingLayout::Validate caps capacity below it).
constexpr uint64_t kMovedLength = kMaxPayloadBytes - 1;
// The length of a staged transfer (stage.h): the slot carries a StageRecord naming where the
// sender staged the tensor, not the tensor. Below kMovedLength and above every capacity too.
constexpr uint64_t kStagedLength = kMaxPayloadBytes - 2;
// The length of a dead transfer: TF's sending half ran with a dead input (the branch of a
// conditional not taken), so the receiving half outputs a dead tensor, as TF's rendezvous
// does (_native/tf/kernels/recv_op.cc). No payload; below kStagedLength and above every capacity too.
constexpr uint64_t kDeadLength = kMaxPayloadBytes - 3;
// Bytes of an encoded StageRecord: the stage's region descriptor, u64 offset, u64 length.
constexpr uint64_t kStageRecordBytes = RegionDesc::kEncodedSize + 16;
// The tag of step `step_id` (never 0): a 24-bit hash, so a stale transfer is mistaken for the
// current step's with probability 2^-24, and only after a failed step left one behind.
uint32_t StepTag(uint64_t step_id);

// The layout of receive regions (the planner lays them out with these, graph_pass.layout):
//
//   slot (slot_bytes, a multiple of kSlotAlignment)
//   +0   header, kSlotHeaderBytes = 64
//        +0  u64 sequence word (kSeqOffset): written last, with release ordering; 0 = never written
//        +8  u64 payload byte length (kLengthOffset) of this message, the step tag above kTagShift
//        +16 .. +63 reserved, zero
//   +64  shape block (dynamic channels only): u64 rank at +0, then u64 dims[rank capacity] at
//        +8; its size is rounded up to kSlotAlignment
//   +payload_offset  payload: the capacity rounded up to kSlotAlignment
//
// Static channels have no shape block (payload_offset == kSlotHeaderBytes); control signals have
// no payload (slot_bytes == kSlotHeaderBytes).
//
// Alignment of every slot, header and payload. A cache line (64 on x86-64 and most aarch64
// parts), so the sequence word the receiver polls never shares a line with another slot's
// payload (no false sharing between the writer and the poller); it equals TF's
// EIGEN_MAX_ALIGN_BYTES=64 (tf.sysconfig.get_compile_flags()), so a payload can be aliased as a
// Tensor buffer without a copy.
constexpr uint64_t kSlotAlignment = kCacheLine;
// Bytes of the slot header: one aligned unit, room for the two words below and reserved space.
constexpr uint64_t kSlotHeaderBytes = kCacheLine;
// Byte positions the protocol writes in a slot header. A Signal (fabric.h) puts its seq at
// +0 and its aux (here the payload length) at +8.
constexpr uint64_t kSeqOffset = 0;
constexpr uint64_t kSeqBytes = 8;
constexpr uint64_t kLengthOffset = 8;
constexpr uint64_t kLengthBytes = 8;
static_assert(kSeqOffset == 0 && kLengthOffset == kSeqOffset + kSeqBytes &&
                  kSignalBytes == kSeqBytes + kLengthBytes,
              "a Signal writes seq at its offset and aux 8 bytes after it (fabric.h)");
// A dynamic channel's slot has a shape block between the header and the payload: u64 rank at
// +0, then u64 dims (TF dims are int64), written by the sender before the payload and the
// signal.
constexpr uint64_t kShapeBlockOffset = kSlotHeaderBytes;
constexpr uint64_t kShapeRankOffset = 0;
constexpr uint64_t kShapeDimsOffset = 8;
constexpr uint64_t kShapeDimBytes = 8;
// Alignment of each region inside a task's block: a page, so every region can be registered
// (ibv_reg_mr) or mapped (mmap of a memfd) on its own without sharing a page with another
// peer's.
constexpr uint64_t kRegionAlignment = kPageSize;
// Every integer in a region is little-endian: every supported host is (x86-64, aarch64), and
// the two ends of a channel write and read them with plain stores and loads.
constexpr bool kLittleEndian = __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__;
static_assert(kLittleEndian, "rdmadev's regions hold little-endian integers");

struct RingLayout {
  uint32_t slots = 0;
  uint64_t slot_bytes = 0;      // stride between slots, a multiple of 64
  uint64_t payload_offset = 0;  // payload start within a slot, >= the 64-byte header
  uint64_t capacity = 0;        // payload bytes per slot (payload_offset + capacity <= slot_bytes)
  uint64_t base = 0;            // offset of slot 0 in the region (a plan packs several rings)

  uint64_t bytes() const { return slot_bytes * slots; }
  // Bytes of each slot's shape block: 0 for a static channel.
  uint64_t shape_bytes() const { return payload_offset - kShapeBlockOffset; }
  // Dims the shape block holds.
  uint64_t rank_capacity() const {
    return shape_bytes() > kShapeDimsOffset ? (shape_bytes() - kShapeDimsOffset) / kShapeDimBytes : 0;
  }
  uint64_t header(uint64_t i) const { return base + i * slot_bytes; }
  uint64_t payload(uint64_t i) const { return header(i) + payload_offset; }
  // Throws kConfig naming the bad field and the fix.
  void Validate() const;
};
// A channel's credit line: one cache line (so that two channels' credits never share one)
// holding the u64 credit word at +0. A credit region holds one line per channel.
constexpr uint64_t kCreditBytes = kCacheLine;
// Throws kConfig unless `offset` is a whole credit line inside a credit region of `size`.
void CheckCreditLine(uint64_t offset, uint64_t size);

// Transfers completed by every channel of this process since it started.
struct TransferCounts {
  uint64_t sent = 0;
  uint64_t received = 0;   // taken, including discarded ones
  uint64_t discarded = 0;  // stale transfers of a failed step, dropped unread
  uint64_t abandoned = 0;  // waits that ended without a transfer
  uint64_t superseded = 0;  // waits a later step's receive took the place of (Reserve)
  uint64_t grown = 0;      // larger rings this process registered for its receivers (growth)
  uint64_t staged = 0;     // transfers this process sent staged (a tensor larger than a slot)
  uint64_t stages = 0;     // stage regions this process registered for its senders
  uint64_t warm = 0;       // received tensors copied into a buffer kept from an earlier step
};
// Counts one larger ring registered for a receiver (the registry binds its successor).
void CountGrown();
// Counts one transfer sent staged, and one stage region registered.
void CountStaged();
void CountStage();
// Counts one received tensor copied into a kept buffer (the TF ops' warm.h).
void CountWarm();
TransferCounts CountedTransfers();

// Both halves are safe to call from several threads (TF kernels, the progress thread,
// tensor buffers released anywhere).
class RingSender {
 public:
  // `credit_offset`: this channel's line in the (local) credit region.
  RingSender(std::shared_ptr<Endpoint> to_receiver, std::shared_ptr<RemoteRegion> ring,
             RingLayout layout, std::shared_ptr<Region> credit, uint64_t credit_offset,
             uint64_t epoch, WaitPolicy policy);
  // Waits for a free slot (credit), writes `shape_len` bytes of a shape block (dynamic
  // channels; at most layout().shape_bytes()) and len bytes from src, and signals with the
  // step `tag` (0: untagged); returns n.
  uint64_t Send(const void* src, uint64_t len, const Deadline& deadline, uint32_t tag = 0,
                const void* shape = nullptr, uint64_t shape_len = 0);
  // Like Send, for a tensor the sender staged (stage.h): the slot carries `record` (an encoded
  // StageRecord, kStageRecordBytes) and the length word kStagedLength. Needs a dynamic
  // channel whose slots hold a record.
  uint64_t SendStaged(const std::string& record, const Deadline& deadline, uint32_t tag,
                      const void* shape, uint64_t shape_len);
  // Writes the marker that moves the channel to its successor ring (nothing follows on
  // this one), waiting for a credit like Send; returns n.
  uint64_t SendMoved(const Deadline& deadline);
  // Writes a dead transfer (kDeadLength, no payload) for step `tag`, waiting for a credit
  // like Send; returns n.
  uint64_t SendDead(const Deadline& deadline, uint32_t tag);
  uint64_t sent() const { return sent_.load(std::memory_order_acquire); }
  // Whether the receiver has credited every transfer sent on this ring (or none was sent):
  // it will read nothing more out of this sender's memory (a stage) and write no more
  // credits into it. Lock-free: a send waiting for a credit holds the ring's lock.
  bool Drained() const;
  // For asynchronous senders: the credit word and the value it must reach before the next
  // Send can go without waiting (target 0: it already can).
  std::pair<const std::atomic<uint64_t>*, uint64_t> CreditNeeded() const;
  const RingLayout& layout() const { return layout_; }
  const std::shared_ptr<Endpoint>& endpoint() const { return ep_; }
  // The local region the receiver writes credits into.
  const std::shared_ptr<Region>& credit_region() const { return credit_; }
  // The control plane unbound this half (ChannelRegistry: its function was released, its
  // peer failed or restarted, or the key was bound again): a wait on it ends (the TF ops'
  // liveness check asks, every WaitPolicy::liveness_every_ns) instead of holding the ring
  // and its region until the wait's deadline.
  void MarkUnbound() { unbound_.store(true, std::memory_order_release); }
  bool unbound() const { return unbound_.load(std::memory_order_acquire); }

 private:
  // Under mu_: waits for slot n's credit, writes `len` bytes of src (after `shape_len` of a
  // shape block) and signals n with `length_word`.
  uint64_t PostLocked(const void* src, uint64_t len, uint64_t length_word, const void* shape,
                      uint64_t shape_len, const Deadline& deadline);
  mutable std::mutex mu_;
  std::shared_ptr<Endpoint> ep_;
  std::shared_ptr<RemoteRegion> ring_;
  RingLayout layout_;
  std::shared_ptr<Region> credit_;
  uint64_t credit_off_;
  const uint64_t epoch_;
  std::atomic<uint64_t> sent_;  // written under mu_; read without it (sent(), Drained())
  WaitPolicy policy_;
  std::atomic<bool> unbound_{false};
};

struct Slot {
  uint64_t seq = 0;
  const uint8_t* data = nullptr;
  uint64_t length = 0;
  uint32_t tag = 0;  // the sender's step tag (0: untagged)
  const uint8_t* shape = nullptr;  // the slot's shape block (dynamic channels), else null
  bool moved = false;  // the marker: the sender moved to the successor ring (no data)
  bool staged = false;  // data/length are a StageRecord (stage.h), not the tensor
  bool dead = false;    // a dead transfer (kDeadLength): no data
};

class RingReceiver {
 public:
  // `credit_offset`: this channel's line in the sender's credit region.
  RingReceiver(std::shared_ptr<Region> ring, RingLayout layout,
               std::shared_ptr<Endpoint> to_sender, std::shared_ptr<RemoteRegion> credit,
               uint64_t credit_offset, uint64_t epoch, WaitPolicy policy);
  // Waits for the next transfer in order. At most K may be held (acquired, not released).
  // A wait that fails (deadline, peer gone or silent) gives its sequence back.
  Slot Acquire(const Deadline& deadline);
  // Gives slot `seq` back; the sender's credit advances over every released prefix.
  void Release(uint64_t seq, const Deadline& deadline);
  uint64_t acquired() const;
  uint64_t credit() const;
  uint64_t held() const;  // acquired, not yet released

  // Asynchronous receiving (the TF wait kernel): Reserve(tag) hands out the next sequence
  // number in call order, WordFor(n) is the word to wait on (it reaches n), and Take(r),
  // once it has, acquires the slot without waiting.
  struct Reservation {
    uint64_t n = 0;    // the transfer waited for
    uint64_t gen = 0;  // tells this reservation from a later one of the same n (Superseded)
  };
  // Throws kProtocol when every slot is held. A receive of step `tag` (nonzero) that finds
  // receives of other steps still waiting takes their place: they are superseded, and it
  // is handed the first of their sequence numbers.
  Reservation Reserve(uint32_t tag = 0);
  const std::atomic<uint64_t>* WordFor(uint64_t n) const;
  // Throws kClosed if `r` was superseded (it then takes nothing).
  Slot Take(const Reservation& r);
  // The step tag written with transfer n; valid once WordFor(n) reached n.
  uint32_t TagAt(uint64_t n) const;
  // Whether a later step's Reserve took the place of `r`.
  bool Superseded(const Reservation& r) const;
  // Counts supersessions of this ring: a wait on it ends when a reservation is superseded.
  const std::atomic<uint64_t>* SupersededWord() const { return &superseded_; }
  // Counts slots let go (released, given back, superseded): a receive that found every slot
  // held waits on it for one.
  const std::atomic<uint64_t>* LetGoWord() const { return &let_go_; }
  // The wait for `r` ended without taking it (cancelled, timed out): its sequence number is
  // handed out again by the next Reserve(). False when a later reservation is outstanding
  // (steps of one channel overlapping), which cannot be undone; true, doing nothing, when
  // `r` was superseded.
  bool Abandon(const Reservation& r);
  // Releases taken transfer `n` unread: it belongs to a step whose receive gave up.
  void Discard(uint64_t n, const Deadline& deadline);
  // The sender moved to the successor ring (this one's marker was taken): releases from now
  // on write no credit (the sender no longer reads them).
  void Retire();
  // Records a tensor of `bytes` that arrived in chunks: the channel wants slots that large.
  void Want(uint64_t bytes);
  // The largest tensor that arrived in chunks (0: none); the control plane grows the ring.
  uint64_t wanted() const { return wanted_.load(std::memory_order_relaxed); }
  const RingLayout& layout() const { return layout_; }
  const std::shared_ptr<Endpoint>& endpoint() const { return ep_; }
  // The local region the sender writes into.
  const std::shared_ptr<Region>& ring_region() const { return ring_; }
  // As RingSender's: a wait on an unbound half ends.
  void MarkUnbound() { unbound_.store(true, std::memory_order_release); }
  bool unbound() const { return unbound_.load(std::memory_order_acquire); }

 private:
  Slot TakeLocked(uint64_t n, uint64_t seen);
  bool AbandonLocked(uint64_t n);
  // A reservation not yet taken or given back, and its step.
  struct Waiting {
    uint64_t n, gen;
    uint32_t tag;
  };
  void Forget(uint64_t gen);  // drops `gen` from waiting_ (mu_ held)
  std::shared_ptr<Region> ring_;
  RingLayout layout_;
  std::shared_ptr<Endpoint> ep_;
  std::shared_ptr<RemoteRegion> credit_;
  uint64_t credit_off_;
  uint64_t epoch_, acquired_, credit_seq_;
  uint64_t reported_;  // highest credit written to the sender
  std::vector<bool> released_;  // by slot, for transfers in (credit_seq_, acquired_]
  WaitPolicy policy_;
  mutable std::mutex mu_;
  uint64_t reserved_;  // highest sequence handed out by Reserve()
  std::vector<Waiting> waiting_;  // reservations in (acquired_, reserved_], oldest first
  uint64_t next_gen_ = 1;
  // A reservation still waiting with a lower gen is superseded; written under mu_, read
  // without it (Superseded: every receive asks).
  std::atomic<uint64_t> superseded_below_{0};
  std::atomic<uint64_t> superseded_{0}, let_go_{0};
  bool retired_ = false;
  std::atomic<uint64_t> wanted_{0};
  std::atomic<bool> unbound_{false};
};

}  // namespace rdmadev
