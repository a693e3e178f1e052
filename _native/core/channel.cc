#include "channel.h"

#include <algorithm>
#include <string>

namespace rdmadev {

namespace {

std::atomic<uint64_t> g_sent{0}, g_received{0}, g_discarded{0}, g_abandoned{0}, g_superseded{0},
    g_grown{0}, g_staged{0}, g_stages{0}, g_warm{0};

// A slot's length word (channel.h): `len` (a payload length or a marker length) and step `tag`.
uint64_t LengthWord(uint64_t len, uint32_t tag) {
  return len | (uint64_t(tag & kMaxTag) << kTagShift);
}

// Rings beyond 2^48 bytes are a corrupted plan, not a real tensor: no host maps that much.
constexpr uint64_t kMaxRingBytes = uint64_t(1) << 48;

[[noreturn]] void BadLayout(const std::string& field, uint64_t value, const std::string& why) {
  throw Error(ErrorKind::kConfig,
              "Failed to lay out ring: " + field + " = " + std::to_string(value) + " " + why, 0,
              "build the layout from the plan (rdmadev._core.LAYOUT.slot_bytes(capacity) gives "
              "slot_bytes and payload_offset; RDMADEV_SLOTS >= 1)");
}

}  // namespace

void RingLayout::Validate() const {
  if (slots < 1) BadLayout("slots", slots, "is below 1: a ring needs a slot");
  if (slot_bytes == 0 || slot_bytes % kCacheLine != 0) {
    BadLayout("slot_bytes", slot_bytes, "is not a positive multiple of 64");
  }
  if (payload_offset % kCacheLine != 0 || payload_offset < kSlotHeaderBytes) {
    BadLayout("payload_offset", payload_offset, "is not a multiple of 64 that is >= 64 (the header)");
  }
  if (capacity >= kDeadLength) {  // the lowest of the lengths that mark a transfer
    BadLayout("capacity_bytes", capacity, "reaches the protocol's 2^40 bytes per tensor");
  }
  if (payload_offset + capacity > slot_bytes) {
    BadLayout("capacity_bytes", capacity,
              "does not fit the slot (payload_offset " + std::to_string(payload_offset) +
                  " + capacity_bytes > slot_bytes " + std::to_string(slot_bytes) + ")");
  }
  if (slot_bytes > kMaxRingBytes / slots) {
    BadLayout("slot_bytes", slot_bytes, "times " + std::to_string(slots) + " slots is absurd");
  }
  if (base % kCacheLine != 0 || base > kMaxRingBytes) {
    BadLayout("offset", base, "is not a 64-byte aligned offset in the region");
  }
}

TransferCounts CountedTransfers() {
  TransferCounts c;
  c.sent = g_sent.load(std::memory_order_relaxed);
  c.received = g_received.load(std::memory_order_relaxed);
  c.discarded = g_discarded.load(std::memory_order_relaxed);
  c.abandoned = g_abandoned.load(std::memory_order_relaxed);
  c.superseded = g_superseded.load(std::memory_order_relaxed);
  c.grown = g_grown.load(std::memory_order_relaxed);
  c.staged = g_staged.load(std::memory_order_relaxed);
  c.stages = g_stages.load(std::memory_order_relaxed);
  c.warm = g_warm.load(std::memory_order_relaxed);
  return c;
}

void CountGrown() { g_grown.fetch_add(1, std::memory_order_relaxed); }
void CountStaged() { g_staged.fetch_add(1, std::memory_order_relaxed); }
void CountStage() { g_stages.fetch_add(1, std::memory_order_relaxed); }
void CountWarm() { g_warm.fetch_add(1, std::memory_order_relaxed); }

uint32_t StepTag(uint64_t x) {
  // splitmix64's finalizer: step ids are counters or random, either way spread over 24 bits.
  x ^= x >> 30;
  x *= 0xbf58476d1ce4e5b9ULL;
  x ^= x >> 27;
  x *= 0x94d049bb133111ebULL;
  x ^= x >> 31;
  return 1 + static_cast<uint32_t>(x % kMaxTag);
}

void CheckCreditLine(uint64_t offset, uint64_t size) {
  if (offset % kCreditBytes != 0 || !RangeInside(offset, kCreditBytes, size)) {
    throw Error(ErrorKind::kConfig,
                "Failed to set up channel: credit offset " + std::to_string(offset) +
                    " is not a whole " + std::to_string(kCreditBytes) +
                    "-byte line inside the credit region of " + std::to_string(size) + " bytes",
                0, "give channel i of a task pair the credit line at i * CREDIT_BYTES of a region "
                   "of (channels * CREDIT_BYTES) bytes");
  }
}

RingSender::RingSender(std::shared_ptr<Endpoint> to_receiver, std::shared_ptr<RemoteRegion> ring,
                       RingLayout layout, std::shared_ptr<Region> credit, uint64_t credit_offset,
                       uint64_t epoch, WaitPolicy policy)
    : ep_(std::move(to_receiver)), ring_(std::move(ring)), layout_(layout),
      credit_(std::move(credit)), credit_off_(credit_offset), epoch_(epoch), sent_(epoch),
      policy_(PolicyFor(policy, ep_.get())) {
  layout_.Validate();
  if (!RangeInside(layout_.base, layout_.bytes(), ring_->desc.size)) {
    throw Error(ErrorKind::kConfig, "Failed to set up channel: the receiver's ring region has " +
                                        std::to_string(ring_->desc.size) + " bytes, the layout needs " +
                                        std::to_string(layout_.bytes()),
                0, "both sides must use the layout of the same plan");
  }
  CheckCreditLine(credit_off_, credit_->size());
}

std::pair<const std::atomic<uint64_t>*, uint64_t> RingSender::CreditNeeded() const {
  std::lock_guard<std::mutex> lock(mu_);
  uint64_t n = sent_ + 1;
  if (n - epoch_ <= layout_.slots) return {credit_->Word(credit_off_), 0};
  return {credit_->Word(credit_off_), n - layout_.slots};
}

bool RingSender::Drained() const {
  const uint64_t n = sent_.load(std::memory_order_acquire);
  return n == epoch_ || credit_->Word(credit_off_)->load(std::memory_order_acquire) >= n;
}

uint64_t RingSender::Send(const void* src, uint64_t len, const Deadline& deadline, uint32_t tag,
                          const void* shape, uint64_t shape_len) {
  std::lock_guard<std::mutex> lock(mu_);
  if (shape_len > layout_.shape_bytes()) {
    throw Error(ErrorKind::kBounds, "Failed to send: a " + std::to_string(shape_len) +
                                        "-byte shape block exceeds the channel's " +
                                        std::to_string(layout_.shape_bytes()),
                0, "the tensor's rank is larger than planned: re-plan the channel");
  }
  if (len > layout_.capacity) {
    throw Error(ErrorKind::kBounds, "Failed to send: " + std::to_string(len) +
                                        " bytes exceed the channel's planned slot capacity of " +
                                        std::to_string(layout_.capacity),
                0, "the tensor is larger than planned: re-plan the channel for this size");
  }
  uint64_t n = PostLocked(src, len, LengthWord(len, tag), shape, shape_len, deadline);
  g_sent.fetch_add(1, std::memory_order_relaxed);
  return n;
}

uint64_t RingSender::SendStaged(const std::string& record, const Deadline& deadline, uint32_t tag,
                                const void* shape, uint64_t shape_len) {
  std::lock_guard<std::mutex> lock(mu_);
  if (!layout_.shape_bytes() || shape_len > layout_.shape_bytes() || record.size() > layout_.capacity) {
    throw Error(ErrorKind::kBounds,
                "Failed to send staged: the channel's slots (" + std::to_string(layout_.capacity) +
                    " bytes, a " + std::to_string(layout_.shape_bytes()) +
                    "-byte shape block) cannot hold a " + std::to_string(record.size()) +
                    "-byte stage record and a " + std::to_string(shape_len) + "-byte shape",
                0, "stage only on a dynamic channel whose slots hold a stage record");
  }
  uint64_t n = PostLocked(record.data(), record.size(),
                          LengthWord(kStagedLength, tag), shape, shape_len,
                          deadline);
  g_sent.fetch_add(1, std::memory_order_relaxed);
  return n;
}

uint64_t RingSender::SendMoved(const Deadline& deadline) {
  std::lock_guard<std::mutex> lock(mu_);
  return PostLocked(nullptr, 0, kMovedLength, nullptr, 0, deadline);
}

uint64_t RingSender::SendDead(const Deadline& deadline, uint32_t tag) {
  std::lock_guard<std::mutex> lock(mu_);
  uint64_t n = PostLocked(nullptr, 0, LengthWord(kDeadLength, tag), nullptr, 0, deadline);
  g_sent.fetch_add(1, std::memory_order_relaxed);
  return n;
}

uint64_t RingSender::PostLocked(const void* src, uint64_t len, uint64_t length_word,
                                const void* shape, uint64_t shape_len, const Deadline& deadline) {
  uint64_t n = sent_ + 1;
  uint64_t k = layout_.slots;
  if (n - epoch_ > k) {
    auto ep = ep_;
    WaitWord(credit_->Word(credit_off_), n - k, deadline, policy_,
             [ep](std::string* why) { return ep->Alive(why); }, "a free slot (credit)");
  }
  uint64_t slot = (n - epoch_ - 1) % k;
  Signal sig{layout_.header(slot), n, length_word};
  // Writes of one endpoint land in order, so the signal after the payload covers both.
  if (shape_len) ep_->Write(shape, *ring_, layout_.header(slot) + kShapeBlockOffset, shape_len,
                            nullptr, deadline);
  ep_->Write(src, *ring_, layout_.payload(slot), len, &sig, deadline);
  sent_.store(n, std::memory_order_release);
  return n;
}

RingReceiver::RingReceiver(std::shared_ptr<Region> ring, RingLayout layout,
                           std::shared_ptr<Endpoint> to_sender, std::shared_ptr<RemoteRegion> credit,
                           uint64_t credit_offset, uint64_t epoch, WaitPolicy policy)
    : ring_(std::move(ring)), layout_(layout), ep_(std::move(to_sender)),
      credit_(std::move(credit)), credit_off_(credit_offset), epoch_(epoch), acquired_(epoch), credit_seq_(epoch),
      reported_(epoch), released_(layout.slots, false), policy_(PolicyFor(policy, ep_.get())),
      reserved_(epoch) {
  layout_.Validate();
  ring_->CheckRange(layout_.base, layout_.bytes(), "lay out ring");
  CheckCreditLine(credit_off_, credit_->desc.size);
}

Slot RingReceiver::Acquire(const Deadline& deadline) {
  const Reservation r = Reserve();
  auto ep = ep_;
  uint64_t seen;
  try {
    seen = WaitWord(WordFor(r.n), r.n, deadline, policy_,
                    [ep](std::string* why) { return ep->Alive(why); },
                    "transfer " + std::to_string(r.n));
  } catch (const Error&) {
    Abandon(r);  // the next Acquire waits for transfer n again (a silent peer may resume)
    throw;
  }
  std::lock_guard<std::mutex> lock(mu_);
  Forget(r.gen);
  return TakeLocked(r.n, seen);
}

RingReceiver::Reservation RingReceiver::Reserve(uint32_t tag) {
  std::lock_guard<std::mutex> lock(mu_);
  const bool others_wait =
      tag && !waiting_.empty() &&
      std::all_of(waiting_.begin(), waiting_.end(),
                  [tag](const Waiting& w) { return w.tag && w.tag != tag; });
  if (others_wait) {  // their sequence numbers are this step's to wait for
    g_superseded.fetch_add(waiting_.size(), std::memory_order_relaxed);
    superseded_below_.store(next_gen_, std::memory_order_release);
    reserved_ = acquired_;
    waiting_.clear();
    superseded_.fetch_add(1, std::memory_order_release);
    let_go_.fetch_add(1, std::memory_order_release);
  }
  uint64_t n = reserved_ + 1;
  if (n - credit_seq_ > layout_.slots) {
    throw Error(ErrorKind::kProtocol, "Failed to acquire: all " + std::to_string(layout_.slots) +
                                          " slots are held",
                0, "release a slot before acquiring the next");
  }
  reserved_ = n;
  Reservation r{n, next_gen_++};
  waiting_.push_back({r.n, r.gen, tag});
  return r;
}

void RingReceiver::Forget(uint64_t gen) {
  for (auto it = waiting_.begin(); it != waiting_.end(); ++it) {
    if (it->gen == gen) {
      waiting_.erase(it);
      return;
    }
  }
}

bool RingReceiver::Superseded(const Reservation& r) const {
  return r.gen < superseded_below_.load(std::memory_order_acquire);
}

uint32_t RingReceiver::TagAt(uint64_t n) const {
  const uint64_t slot = (n - epoch_ - 1) % layout_.slots;
  const uint64_t word =
      ring_->Word(layout_.header(slot) + kLengthOffset)->load(std::memory_order_relaxed);
  return static_cast<uint32_t>(word >> kTagShift);
}

const std::atomic<uint64_t>* RingReceiver::WordFor(uint64_t n) const {
  return ring_->Word(layout_.header((n - epoch_ - 1) % layout_.slots) + kSeqOffset);
}

Slot RingReceiver::Take(const Reservation& r) {
  std::lock_guard<std::mutex> lock(mu_);
  if (r.gen < superseded_below_) {
    throw Error(ErrorKind::kClosed, "Transfer " + std::to_string(r.n) +
                                        " was left to a later step's receive");
  }
  Forget(r.gen);
  return TakeLocked(r.n, WordFor(r.n)->load(std::memory_order_acquire));
}

Slot RingReceiver::TakeLocked(uint64_t n, uint64_t seen) {
  uint64_t slot = (n - epoch_ - 1) % layout_.slots;
  uint64_t word = ring_->Word(layout_.header(slot) + kLengthOffset)->load(std::memory_order_relaxed);
  uint64_t len = word & (kMaxPayloadBytes - 1);
  if (n == acquired_ + 1 && seen == n && len == kMovedLength) {
    acquired_ = n;
    Slot moved;
    moved.seq = n;
    moved.moved = true;
    return moved;
  }
  // A staged slot holds its record where the payload goes (RingSender::SendStaged).
  const bool staged = len == kStagedLength && layout_.shape_bytes() &&
                      layout_.capacity >= kStageRecordBytes;
  if (staged) len = kStageRecordBytes;
  const bool dead = len == kDeadLength;
  if (dead) len = 0;
  if (n != acquired_ + 1 || seen != n || len > layout_.capacity) {
    throw Error(ErrorKind::kProtocol, "Channel out of step: slot " + std::to_string(slot) +
                                          " holds sequence " + std::to_string(seen) + " (" +
                                          std::to_string(len) + " bytes), expected " +
                                          std::to_string(n),
                0, "both sides must agree on the epoch and slot count");
  }
  acquired_ = n;
  g_received.fetch_add(1, std::memory_order_relaxed);
  const uint8_t* shape =
      layout_.shape_bytes() ? ring_->base() + layout_.header(slot) + kShapeBlockOffset : nullptr;
  Slot taken{n, ring_->base() + layout_.payload(slot), len,
             static_cast<uint32_t>(word >> kTagShift), shape};
  taken.staged = staged;
  taken.dead = dead;
  return taken;
}

bool RingReceiver::Abandon(const Reservation& r) {
  std::lock_guard<std::mutex> lock(mu_);
  if (r.gen < superseded_below_) return true;  // a later step's receive has its number
  Forget(r.gen);
  return AbandonLocked(r.n);
}

bool RingReceiver::AbandonLocked(uint64_t n) {
  g_abandoned.fetch_add(1, std::memory_order_relaxed);
  if (n != reserved_ || n != acquired_ + 1) return false;
  reserved_ = n - 1;
  let_go_.fetch_add(1, std::memory_order_release);
  return true;
}

void RingReceiver::Retire() {
  std::lock_guard<std::mutex> lock(mu_);
  retired_ = true;
}

void RingReceiver::Want(uint64_t bytes) {
  uint64_t had = wanted_.load(std::memory_order_relaxed);
  while (bytes > had && !wanted_.compare_exchange_weak(had, bytes, std::memory_order_relaxed)) {
  }
}

void RingReceiver::Discard(uint64_t n, const Deadline& deadline) {
  g_discarded.fetch_add(1, std::memory_order_relaxed);
  Release(n, deadline);
}

uint64_t RingReceiver::acquired() const {
  std::lock_guard<std::mutex> lock(mu_);
  return acquired_;
}

uint64_t RingReceiver::credit() const {
  std::lock_guard<std::mutex> lock(mu_);
  return credit_seq_;
}

uint64_t RingReceiver::held() const {
  std::lock_guard<std::mutex> lock(mu_);
  return acquired_ - credit_seq_;
}

void RingReceiver::Release(uint64_t seq, const Deadline& deadline) {
  std::lock_guard<std::mutex> lock(mu_);
  if (seq <= credit_seq_ || seq > acquired_) {
    throw Error(ErrorKind::kProtocol, "Failed to release transfer " + std::to_string(seq) +
                                          ": it is not held (held: " + std::to_string(credit_seq_ + 1) +
                                          ".." + std::to_string(acquired_) + ")");
  }
  uint64_t k = layout_.slots;
  released_[(seq - epoch_ - 1) % k] = true;
  uint64_t before = credit_seq_;
  while (credit_seq_ < acquired_ && released_[(credit_seq_ - epoch_) % k]) {
    released_[(credit_seq_ - epoch_) % k] = false;
    ++credit_seq_;
  }
  if (credit_seq_ != before) let_go_.fetch_add(1, std::memory_order_release);
  // Credits go back in batches of K/4 (at least 1): each credit is a message the sender's
  // side must receive (on tcp a frame and a thread wakeup), and the sender never needs the
  // newest one while more than 3/4 of the ring is free. Unreported releases stay below the
  // batch (<= K), so a sender blocked on credit is always eventually unblocked.
  const uint64_t batch = std::max<uint64_t>(1, layout_.slots / 4);
  if (!retired_ && credit_seq_ != before && credit_seq_ - reported_ >= batch) {
    Signal sig{credit_off_, credit_seq_, 0};
    ep_->Write(nullptr, *credit_, 0, 0, &sig, deadline);
    reported_ = credit_seq_;
  }
}

}  // namespace rdmadev
