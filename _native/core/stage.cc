#include "stage.h"

#include <cstring>

#include "registry.h"

namespace rdmadev {

static_assert(kStageRecordBytes == RegionDesc::kEncodedSize + 2 * sizeof(uint64_t),
              "a record is a descriptor, an offset and a length");

std::string StageRecord::Encode() const {
  std::string out = desc.Encode();
  out.append(reinterpret_cast<const char*>(&offset), sizeof offset);
  out.append(reinterpret_cast<const char*>(&length), sizeof length);
  return out;
}

StageRecord StageRecord::Decode(const uint8_t* bytes, uint64_t n) {
  if (n != kStageRecordBytes) {
    throw Error(ErrorKind::kProtocol,
                "Failed to read a staged tensor: its record has " + std::to_string(n) +
                    " bytes, not " + std::to_string(kStageRecordBytes),
                0, "run the same rdmadev version in every task");
  }
  StageRecord r;
  r.desc = RegionDesc::Decode(
      std::string(reinterpret_cast<const char*>(bytes), RegionDesc::kEncodedSize));
  std::memcpy(&r.offset, bytes + RegionDesc::kEncodedSize, sizeof r.offset);
  std::memcpy(&r.length, bytes + RegionDesc::kEncodedSize + sizeof r.offset, sizeof r.length);
  return r;
}

std::shared_ptr<Region> Stage::Room(const std::shared_ptr<Domain>& domain, uint64_t len,
                                    const std::string& channel) {
  std::lock_guard<std::mutex> lock(mu_);
  if (region_ && region_->size() >= len) return region_;
  if (failed_) return nullptr;
  const uint64_t size = RoundUp(len + len / kStageHeadroom, kPageSize);
  const uint64_t limit = domain->options().max_registered_bytes;
  const uint64_t had = region_ ? region_->size() : 0;
  if (limit && domain->RegionStats().second - had + size > limit) return nullptr;
  lease_.reset();  // the old stage goes first: it counts against the limit too
  region_.reset();
  std::shared_ptr<Region> region;
  try {
    region = domain->Allocate(size, "stage", reader_.empty() ? kAnyPeer : reader_);
  } catch (const Error& e) {
    failed_ = true;
    LogEvent("channel " + channel + ": no stage of " + std::to_string(size) +
             " bytes, its tensors larger than a slot go in chunks: " + e.what());
    return nullptr;
  }
  lease_ = LeaseRegion(domain, region);
  region_ = std::move(region);
  CountStage();
  return region_;
}

uint64_t Stage::busy() const {
  std::lock_guard<std::mutex> lock(mu_);
  return busy_;
}

void Stage::set_busy(uint64_t n) {
  std::lock_guard<std::mutex> lock(mu_);
  busy_ = n;
}

void StageReader::Read(Endpoint& ep, const StageRecord& record, void* dst, uint64_t len,
                       const Deadline& deadline) {
  if (record.length != len || !RangeInside(record.offset, len, record.desc.size)) {
    throw Error(ErrorKind::kProtocol,
                "Failed to read a staged tensor: the sender's record names " +
                    std::to_string(record.length) + " bytes at offset " +
                    std::to_string(record.offset) + " of a " + std::to_string(record.desc.size) +
                    "-byte stage for a tensor of " + std::to_string(len) + " bytes",
                0, "the sender does not follow the protocol: run the same rdmadev version in "
                   "every task");
  }
  std::shared_ptr<RemoteRegion> stage;
  {
    std::lock_guard<std::mutex> lock(mu_);
    const RegionDesc* had = attached_ ? &attached_->desc : nullptr;
    if (!had || had->id != record.desc.id || had->size != record.desc.size ||
        had->rkey != record.desc.rkey || had->verbs_rkey != record.desc.verbs_rkey) {
      attached_.reset();  // the sender replaced its stage: let the old one go first
      attached_ = ep.Attach(record.desc);
    }
    stage = attached_;
  }
  ep.Read(*stage, record.offset, dst, len, deadline);
}

}  // namespace rdmadev
