// The verbs fabric's protection domain and memory registrations: one registration per chunk
// of regions, made when the chunk is mapped (arena.h -> Fabric::RegisterChunk), so no
// transfer and no region ever registers memory; plus the lookup a write uses to find the
// local key of its source bytes.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <shared_mutex>
#include <string>

#include "../region.h"
#include "verbs_device.h"

namespace rdmadev {

#if RDMADEV_HAVE_VERBS
class VerbsMemory {
 public:
  explicit VerbsMemory(std::unique_ptr<VerbsDevice> dev);  // allocates the PD; throws kFabric
  ~VerbsMemory();                                          // DeregisterAll, then PD, then device
  const VerbsDevice& dev() const { return *dev_; }
  ibv_pd* pd() const { return pd_; }

  // Registers the chunk (local write, remote read and write) and records its address and
  // rkey in it, for its regions' descriptors. Throws kRegion; when the memlock limit is the
  // cause, the message says how many bytes are needed and how to raise the limit.
  void Register(Chunk& chunk);
  void Deregister(Chunk& chunk);
  // Registers a private buffer (an endpoint's bounce and signal buffer).
  ibv_mr* RegisterBuffer(void* p, size_t len, const std::string& what);
  void DeregisterBuffer(ibv_mr* mr);
  // The local key of a registration holding [p, p + len); false when there is none.
  bool LocalKey(const void* p, uint64_t len, uint32_t* lkey) const;
  // Drops every registration (the fabric's Close, after its queue pairs are gone).
  void DeregisterAll();

 private:
  ibv_mr* Reg(void* p, size_t len, const std::string& what);
  std::unique_ptr<VerbsDevice> dev_;
  ibv_pd* pd_ = nullptr;
  mutable std::shared_mutex mu_;
  std::map<uint64_t, ibv_mr*> by_chunk_;    // chunk id -> registration
  std::map<uintptr_t, ibv_mr*> by_address_;  // start address -> registration
  uint64_t registered_bytes_ = 0;
};
#endif

}  // namespace rdmadev
