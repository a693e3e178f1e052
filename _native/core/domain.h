// Domain: one process's view of the remote-device layer: its regions (the registry the
// fabrics serve them from) and the chunks that hold them (arena.h), its open fabrics, its
// identity and secret.
#pragma once

#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "arena.h"
#include "completion.h"
#include "fabric.h"
#include "region.h"

namespace rdmadev {

struct DomainOptions {
  std::string name = "task";          // identity presented to peers (e.g. "worker:0")
  std::string secret;                 // cluster secret for authenticated fabrics
  std::vector<std::string> fabrics;   // which to open, e.g. {"shm", "tcp"}
  std::string tcp_listen = "127.0.0.1:0";  // host:port the tcp fabric listens on (the verbs
                                           // side channel listens on the same host, any port)
  // Fabric-specific settings, "<fabric>.<key>" -> text (e.g. "verbs.device" -> "mlx5_0");
  // each fabric validates its own keys (see fabric.h), a key of no fabric is refused.
  FabricOptions fabric_options;
  WaitPolicy wait;
  // Bytes of regions this domain may hold before a stage (stage.h) is refused: the task's
  // RDMADEV_MAX_REGISTERED_BYTES, which the control plane applies to rings (0: no limit).
  uint64_t max_registered_bytes = 0;
  // A sender stages a dynamic tensor larger than its channel's slots when they hold fewer
  // bytes than this, else sends it in chunks (RDMADEV_STAGE_BELOW_SLOT_BYTES; 0: never stage).
  uint64_t stage_below_slot_bytes = 0;
};

class Domain : public std::enable_shared_from_this<Domain> {
 public:
  static std::shared_ptr<Domain> Open(const DomainOptions& options);
  ~Domain();

  const DomainOptions& options() const { return options_; }
  // Every opened fabric's reach, best first: "shm=<reach>;tcp=<reach>".
  std::string address() const;
  std::vector<std::string> fabric_names() const;

  // A region of `size` bytes granted to `peer`, placed in a chunk of the regions granted to
  // that peer (arena.h).
  std::shared_ptr<Region> Allocate(uint64_t size, const std::string& label,
                                   const std::string& peer = kAnyPeer);
  // The live region with this id, or null (the tcp fabric serves frames through this);
  // *retired (if given) says whether the id named a region this domain has released.
  std::shared_ptr<Region> Find(uint64_t id, bool* retired = nullptr) const;
  void Release(uint64_t id);
  // Regions live in this domain and their bytes (what its plans use).
  std::pair<uint64_t, uint64_t> RegionStats() const;
  // Chunks this domain holds and their bytes (what it has mapped and registered with its
  // fabrics: its regions, their quarantined spans and free room); idle chunks go first.
  ChunkCounts ChunkStats();
  // Chunks whose regions all went, quarantine over, go now.
  void Trim();

  // An endpoint to the peer at `peer_address` over `fabric` ("auto": the best fabric both
  // ends can reach, in FabricPriority order).
  std::shared_ptr<Endpoint> Connect(const std::string& peer_address, const std::string& fabric,
                                    const Deadline& deadline);
  // The fabric Connect would pick, or throws kFabric naming what each side offered.
  std::string Choose(const std::string& peer_address, const std::string& fabric) const;

  Progress& progress() { return *progress_; }
  void Close();
  bool closed() const;

 private:
  explicit Domain(const DomainOptions& options);
  DomainOptions options_;
  mutable std::mutex mu_;
  bool closed_ = false;
  uint64_t next_region_ = 1;
  std::map<uint64_t, std::shared_ptr<Region>> regions_;
  // Places regions; its own lock, taken before mu_ (a new chunk is mapped and faulted in
  // without holding up Find, which the tcp fabric serves every frame through).
  std::mutex arena_mu_;
  Arena arena_;
  void RegisterChunk(Chunk& chunk);    // with every fabric, under mu_; throws kRegion
  void DeregisterChunk(Chunk& chunk);  // from every fabric, under mu_
  std::vector<std::unique_ptr<Fabric>> fabrics_;  // in priority order
  std::unique_ptr<Progress> progress_;
};

// Parses "name=reach;name=reach" into pairs; throws kProtocol on malformed input.
std::vector<std::pair<std::string, std::string>> ParseAddress(const std::string& address);

}  // namespace rdmadev
