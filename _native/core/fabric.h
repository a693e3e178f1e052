// The interface every fabric implements: a peer task seen as a device with a memory
// interface. Each fabric lives in its own folder with the same file set (<name>.h/.cc).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "common.h"
#include "completion.h"
#include "region.h"

namespace rdmadev {

class Domain;

// Completion signal that travels with a write: after the payload is in place, the remote
// region gets `aux` at sig_off+8 and then, with release ordering, `seq` at sig_off. A
// reader that acquires `seq` sees the payload and `aux`. (verbs will carry it as a
// second RDMA WRITE on the same RC QP, ordered after the payload.)
struct Signal {
  uint64_t off = 0;
  uint64_t seq = 0;
  uint64_t aux = 0;
};
constexpr uint64_t kSignalBytes = 16;

// A region of the peer's, attached through an endpoint.
struct RemoteRegion {
  RegionDesc desc;
  uint8_t* mapped = nullptr;  // shm: the peer's memory mapped here; others: null
  uint64_t mapped_len = 0;
  ~RemoteRegion();
};

// Throws kBounds for a remote range outside the peer's region (checked by the sender;
// the receiving side checks again wherever it is a trust boundary).
void CheckRemoteRange(const RegionDesc& d, uint64_t off, uint64_t len, const Signal* sig);

class Endpoint {
 public:
  virtual ~Endpoint() = default;
  virtual std::string fabric() const = 0;
  virtual std::string peer() const = 0;  // the peer's address, for messages
  // Makes the peer's region (from its descriptor) addressable from here.
  virtual std::shared_ptr<RemoteRegion> Attach(const RegionDesc& desc) = 0;
  // One-sided write of len bytes from src into the peer's region at roff, then the signal.
  virtual void Write(const void* src, const RemoteRegion& dst, uint64_t roff, uint64_t len,
                     const Signal* sig, const Deadline& deadline) = 0;
  // One-sided read of len bytes at roff of the peer's region into dst.
  virtual void Read(const RemoteRegion& src, uint64_t roff, void* dst, uint64_t len,
                    const Deadline& deadline) = 0;
  // True when the bytes the peer writes into our regions are stored by a thread of this
  // process (tcp's receiver thread) rather than by the peer's CPU or a NIC: a waiter must
  // then not spin, or it takes the core that thread needs (2 vCPUs here).
  virtual bool delivered_by_local_thread() const { return false; }
  // Cheap, non-blocking: false (with the reason) once the peer is known to be gone.
  virtual bool Alive(std::string* why) = 0;
  virtual void Close() = 0;
};

class Fabric {
 public:
  virtual ~Fabric() = default;
  virtual std::string name() const = 0;
  // This process's reach on the fabric, as text inside a domain address ("<name>=<reach>").
  virtual std::string reach() const = 0;
  // Whether this process can reach a peer that advertises `peer_reach` on this fabric.
  virtual bool CanReach(const std::string& peer_reach) const = 0;
  virtual std::shared_ptr<Endpoint> Connect(const std::string& peer_reach,
                                            const Deadline& deadline) = 0;
  // Called by Domain::Allocate before a region is handed out: a fabric whose hardware must
  // know the memory (verbs: one memory registration per region) registers it here and
  // records in the region's descriptor what a peer needs to address it. Throws kRegion.
  virtual void RegisterRegion(Region& region) {}
  // Called by Domain::Release before the region is closed: peers lose access. Never throws.
  virtual void DeregisterRegion(Region& region) {}
  virtual void Close() = 0;
};

// The wait policy for data coming from `ep`'s peer: no pure spin phase when a local
// thread delivers it (see Endpoint::delivered_by_local_thread).
WaitPolicy PolicyFor(const WaitPolicy& base, const Endpoint* ep);

// Why a fabric cannot run in this process ("" when it can), without opening it.
std::string FabricUnviableReason(const std::string& name);
// Fabric names, best first: the order in which two tasks pick a common fabric.
const std::vector<std::string>& FabricPriority();

}  // namespace rdmadev
