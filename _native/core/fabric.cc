#include "fabric.h"

#include <sys/mman.h>

namespace rdmadev {

RemoteRegion::~RemoteRegion() {
  if (mapped) munmap(mapped, mapped_len);
}

void CheckRemoteRange(const RegionDesc& d, uint64_t off, uint64_t len, const Signal* sig) {
  if (!RangeInside(off, len, d.size)) {
    throw Error(ErrorKind::kBounds,
                "Failed to access peer region " + std::to_string(d.id) + ": range [" +
                    std::to_string(off) + ", +" + std::to_string(len) + ") lies outside its " +
                    std::to_string(d.size) + " bytes",
                0, "keep offset + length within the remote region's size");
  }
  if (sig && (sig->off % 8 != 0 || !RangeInside(sig->off, kSignalBytes, d.size))) {
    throw Error(ErrorKind::kBounds,
                "Failed to signal peer region " + std::to_string(d.id) + ": signal at " +
                    std::to_string(sig->off) + " is unaligned or outside its " +
                    std::to_string(d.size) + " bytes",
                0, "place the 16-byte signal 8-byte aligned inside the region");
  }
}

WaitPolicy PolicyFor(const WaitPolicy& base, const Endpoint* ep) {
  WaitPolicy p = base;
  if (ep && ep->delivered_by_local_thread()) p.spin_ns = 0;
  return p;
}

}  // namespace rdmadev
