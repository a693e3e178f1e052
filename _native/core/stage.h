// Staged transfers (issue 12): a tensor of a run-time shape larger than its channel's slots.
//
// The sender copies the tensor into a region of its own, the channel's stage, and writes only
// a StageRecord into the slot (length word kStagedLength, channel.h), with the shape block as
// for any dynamic tensor. The receiver reads the tensor out of the stage with its fabric's
// one-sided read (RDMA READ on verbs, a copy from the mapping on shm, a read frame on tcp),
// straight into the output, and then releases the slot. That release is what frees the stage:
// the sender writes into it again only once its credit covers the transfer that named it.
// So a tensor of any size takes one slot, one write of the record and one read, with no round
// trip per slot-sized chunk; the receiving task then grows the channel's slots (growth), so
// later tensors of that size fit a slot again. Senders stage only on channels whose slots are
// smaller than DomainOptions::stage_below_slot_bytes: with larger slots, chunks overlap the
// sender's and the receiver's copies, which staging cannot (rdmadev/config.py explains the
// default with the figures).
//
// The stage is granted to the receiving task alone, counts against the sending domain's
// max_registered_bytes, grows (the tensor and a quarter more) when a larger tensor comes and
// goes with its ring (growth gives the channel a new one); when the limit forbids a stage,
// the sender falls back to chunks through the slots.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <string>

#include "channel.h"
#include "domain.h"
#include "fabric.h"
#include "region.h"

namespace rdmadev {

// What a staged slot carries (kStageRecordBytes, little-endian): the stage's descriptor (80),
// then u64 offset and u64 length of the tensor in it.
struct StageRecord {
  RegionDesc desc;
  uint64_t offset = 0;
  uint64_t length = 0;
  std::string Encode() const;
  // Throws kProtocol for bytes that are not a record.
  static StageRecord Decode(const uint8_t* bytes, uint64_t n);
};

// A stage grows to the tensor plus 1/kStageHeadroom of it, so a tensor that grows a little
// from step to step is not re-registered at every step (registration costs a page walk on
// every fabric and a pinning on verbs).
constexpr uint64_t kStageHeadroom = 4;

// The sending half's stage. A channel's executions run one at a time, and each uses the stage
// only after the credit covers busy(): callers serialize, the lock only guards the fields.
class Stage {
 public:
  // `reader`: the identity of the receiving task, the only peer granted the stage ("": any
  // authenticated peer, for channels bound by hand).
  explicit Stage(std::string reader) : reader_(std::move(reader)) {}
  // A region of at least `len` bytes for the next staged transfer: the current stage, or a
  // larger one that replaces it (the old one goes: its transfer is credited). Null when the
  // domain's max_registered_bytes leaves no room for it, or for good once allocating one
  // failed (e.g. verbs could not pin it under RLIMIT_MEMLOCK), which is logged once, naming
  // `channel`: the sender then uses chunks, which need no memory of their own.
  std::shared_ptr<Region> Room(const std::shared_ptr<Domain>& domain, uint64_t len,
                               const std::string& channel);
  // The transfer that last named the stage: it is free once the sender's credit reaches it.
  uint64_t busy() const;
  void set_busy(uint64_t n);

 private:
  mutable std::mutex mu_;
  const std::string reader_;
  std::shared_ptr<Region> region_;
  std::shared_ptr<void> lease_;  // releases region_ from its domain with the stage
  uint64_t busy_ = 0;
  bool failed_ = false;  // allocating a stage failed: no more attempts
};

// The receiving half's side: reads a staged tensor, attaching the sender's stage once (again
// only when the sender replaced it by a larger one).
class StageReader {
 public:
  // Reads the record's tensor into `dst` (`len` bytes, the size the shape block gives, which
  // the record must agree with). Throws kProtocol for a record that does not, and what the
  // fabric's Attach and Read throw.
  void Read(Endpoint& ep, const StageRecord& record, void* dst, uint64_t len,
            const Deadline& deadline);

 private:
  std::mutex mu_;
  std::shared_ptr<RemoteRegion> attached_;
};

}  // namespace rdmadev
