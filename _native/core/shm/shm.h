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

std::string ShmUnviableReason();
std::unique_ptr<Fabric> MakeShmFabric(const FabricContext& ctx, const ShmOptions& options);

}  // namespace rdmadev
