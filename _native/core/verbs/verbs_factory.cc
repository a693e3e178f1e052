// The verbs fabric's registry entry and its options parser.
#include "verbs.h"
#include "verbs_device.h"
#include "verbs_options.h"

namespace rdmadev {
namespace {

// Ports are numbered from 1; a device has at most 255 (ibv_device_attr.phys_port_cnt is a u8).
constexpr int kMaxPort = 255;
// GID table indexes are 16-bit in the kernel's sysfs layout; real tables hold 16-256 entries,
// and an index beyond the port's table is refused when the device is opened, naming it.
constexpr int kMaxGidIndex = 65535;

// Between shm and tcp: across hosts an RDMA NIC moves bytes without either CPU copying
// them; on one host shm's single memcpy is still cheaper than a trip through the NIC.
constexpr int kVerbsPriority = 200;

}  // namespace

VerbsOptions ParseVerbsOptions(const FabricOptions& options) {
  VerbsOptions o;
  for (const auto& kv : OptionsOf("verbs", options, {"device", "port", "gid_index"})) {
    if (kv.first == "device") o.device = kv.second;
    if (kv.first == "port") o.port = OptionInt("verbs", "port", kv.second, 1, kMaxPort);
    if (kv.first == "gid_index") {
      o.gid_index = OptionInt("verbs", "gid_index", kv.second, 0, kMaxGidIndex);
    }
  }
  return o;
}

namespace {

const FabricRegistration kRegistration({
    "verbs", kVerbsPriority,
    [](const FabricOptions& options) { ParseVerbsOptions(options); },
    [](const FabricOptions& options) { return VerbsUnviableReason(ParseVerbsOptions(options)); },
    [](const FabricContext& ctx, const FabricOptions& options) {
      return MakeVerbsFabric(ctx, ParseVerbsOptions(options));
    },
});

}  // namespace
}  // namespace rdmadev
