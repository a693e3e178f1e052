#include "arena.h"

#include <algorithm>

namespace rdmadev {

uint64_t Arena::Held() const {
  uint64_t held = 0;
  for (const auto& kv : chunks_) {
    for (const auto& c : kv.second) held += c->size();
  }
  return held;
}

std::shared_ptr<Region> Arena::Place(uint64_t id, uint64_t size, const std::string& peer,
                                     uint64_t budget) {
  const uint64_t span = RoundUp(size == 0 ? 1 : size, kPageSize);
  if (span < size) throw Error(ErrorKind::kRegion, "Failed to allocate region: size overflows");
  uint64_t offset = 0;
  for (const auto& c : chunks_[peer]) {
    if (c->Take(span, &offset)) return Region::Place(id, size, c, offset);
  }
  Trim();  // may drop the peer's entry: `mine` is taken after it
  auto& mine = chunks_[peer];
  uint64_t peer_bytes = 0;
  for (const auto& c : mine) peer_bytes += c->size();
  uint64_t bytes = std::clamp(peer_bytes, kMinChunkBytes, kMaxChunkBytes);
  if (budget) {
    const uint64_t held = Held();
    bytes = std::min(bytes, held < budget ? RoundUp(budget - held, kPageSize) : 0);
  }
  bytes = std::max(bytes, span);
  auto chunk = Chunk::Map(next_chunk_++, bytes, label_ + "/" + peer);
  chunk->set_quarantine_s(quarantine_s_);
  registered_(*chunk);  // throws: the chunk goes unregistered
  chunk->Take(span, &offset);
  mine.push_back(chunk);
  return Region::Place(id, size, std::move(chunk), offset);
}

void Arena::Trim() {
  for (auto it = chunks_.begin(); it != chunks_.end();) {
    auto& mine = it->second;
    for (auto c = mine.begin(); c != mine.end();) {
      // Only this arena holds an idle chunk: no region of it is left to reach it.
      if ((*c)->idle()) {
        deregistered_(**c);
        c = mine.erase(c);
      } else {
        ++c;
      }
    }
    it = mine.empty() ? chunks_.erase(it) : std::next(it);
  }
}

ChunkCounts Arena::Stats() const {
  ChunkCounts counts;
  for (const auto& kv : chunks_) {
    for (const auto& c : kv.second) {
      ++counts.chunks;
      counts.bytes += c->size();
      counts.quarantined += c->quarantined();
    }
  }
  return counts;
}

}  // namespace rdmadev
