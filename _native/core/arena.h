// Arena: where a Domain places its regions. Memory is mapped, and registered with the
// Domain's fabrics, once per chunk rather than once per region: fds, mappings (here and in
// the peers that map it) and verbs registrations grow with the chunks, not with the channels
// or the instantiations that come and go.
//
// Each chunk holds the regions granted to one peer (the first peer Domain::Allocate is given):
// a verbs rkey or a shm mapping opens the whole chunk to that peer, so a peer can reach only
// memory granted to it, as with a region per registration. Within a chunk a region takes a
// span of whole pages, first fit; a region that goes gives its span back, quarantined for the
// late-write window of the Domain's fabrics unless it went quietly (Region::Quiet).
//
// Chunk sizes: a peer's first chunk is kMinChunkBytes or the region's span if larger; each
// next one as large as all that peer's chunks together (their total doubles), up to
// kMaxChunkBytes, so a peer's chunks number O(log) of its bytes. A new chunk takes at most what
// is left of the Domain's budget (RDMADEV_MAX_REGISTERED_BYTES), and once nothing is left only
// the region's own pages. A chunk whose regions all went, quarantine over, goes at the next
// Trim.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "region.h"

namespace rdmadev {

// 64 KiB: 16 pages, a few pairs' rings and credits of small tensors; a ps with 1,000 workers
// maps 64 MiB for them. 64 MiB: registering one costs ~64 ms on a NIC (~1 ms per MB), paid
// once by a plan that needs it.
constexpr uint64_t kMinChunkBytes = 64 << 10;
constexpr uint64_t kMaxChunkBytes = 64 << 20;

struct ChunkCounts {
  uint64_t chunks = 0;       // chunks held
  uint64_t bytes = 0;        // their bytes (directories, regions, quarantined and free spans)
  uint64_t quarantined = 0;  // bytes of spans quarantined for late writes
};

// Not thread-safe: its Domain serializes the calls.
class Arena {
 public:
  // `registered`: the Domain's fabrics learn a new chunk (throws kRegion, the chunk then
  // goes); `deregistered`: they forget a chunk that goes (never throws).
  using ChunkHook = std::function<void(Chunk&)>;
  Arena(std::string label, ChunkHook registered, ChunkHook deregistered)
      : label_(std::move(label)),
        registered_(std::move(registered)),
        deregistered_(std::move(deregistered)) {}
  // How long a span given back by a region that did not go quietly waits before it is taken
  // again, in the chunks mapped from now on: the longest late-write window of the Domain's
  // fabrics (set once they are open).
  void set_quarantine_s(double s) { quarantine_s_ = s; }

  // Region `id` of `size` bytes, in one of `peer`'s chunks (a new one when none has room);
  // `budget`: the Domain's (0: none).
  std::shared_ptr<Region> Place(uint64_t id, uint64_t size, const std::string& peer,
                                uint64_t budget);
  // Chunks whose regions all went, quarantine over, go (deregistered first).
  void Trim();
  ChunkCounts Stats() const;
  // Forgets every chunk without deregistering it (the Domain closed its fabrics); each goes
  // with its last region.
  void Clear() { chunks_.clear(); }

 private:
  uint64_t Held() const;
  std::string label_;
  ChunkHook registered_, deregistered_;
  double quarantine_s_ = kLateWriteGraceS;
  uint64_t next_chunk_ = 1;
  std::map<std::string, std::vector<std::shared_ptr<Chunk>>> chunks_;  // by peer
};

}  // namespace rdmadev
