// shm fabric: tasks on one host. A region is a memfd; the peer maps it through
// /proc/<owner pid>/fd/<fd> and a write is a memcpy straight into that mapping followed
// by a release store of the sequence word: the receiving CPU does nothing. memfds live
// only as long as some process holds them, so nothing is ever left in /dev/shm.
#pragma once

#include <memory>
#include <string>

#include "../fabric.h"
#include "shm_options.h"

namespace rdmadev {

// The shm fabric in the registry (fabric.h: FabricFactoryOf).
struct ShmBackend {
  static constexpr char kName[] = "shm";
  // Highest: two tasks on one host that can both use shm move data with one memcpy into the
  // peer's mapping (~14 GB/s on these machines, 0.2 us one-way when spin-polled), faster
  // than a loopback trip through any NIC or the kernel's TCP stack.
  static constexpr int kPriority = 300;
  using Options = ShmOptions;
  // "" when memfds, pidfds and /proc are there, else which is missing.
  static std::string UnviableReason(const ShmOptions& options);
  static std::unique_ptr<Fabric> Make(const FabricContext& ctx, const ShmOptions& options);
};

}  // namespace rdmadev
