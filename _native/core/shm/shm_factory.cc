// The shm fabric's registry entry.
#include "shm.h"
#include "shm_options.h"

namespace rdmadev {

ShmOptions ParseShmOptions(const FabricOptions& options) {
  OptionsOf("shm", options, {});
  return ShmOptions{};
}

namespace {

// Highest: two tasks on one host that can both use shm move data with one memcpy into the
// peer's mapping (~14 GB/s on these machines, 0.2 us one-way when spin-polled), faster than
// a loopback trip through any NIC or the kernel's TCP stack.
constexpr int kShmPriority = 300;

const FabricRegistration kRegistration({
    "shm", kShmPriority,
    [](const FabricOptions& options) { ParseShmOptions(options); },
    [](const FabricOptions& options) {
      ParseShmOptions(options);
      return ShmUnviableReason();
    },
    [](const FabricContext& ctx, const FabricOptions& options) {
      return MakeShmFabric(ctx, ParseShmOptions(options));
    },
});

}  // namespace
}  // namespace rdmadev
