// Which RDMA device, port and GID the verbs fabric uses, from the domain's fabric options:
//   verbs.device     e.g. "mlx5_0", "rxe0" (rdmadev.Config: RDMADEV_DEVICE)
//   verbs.port       1-based port of that device (RDMADEV_PORT)
//   verbs.gid_index  GID table index on RoCE (RDMADEV_GID_INDEX)
// Unset (empty / 0 / -1 here) means "choose": the first device with an ACTIVE port, and on
// Ethernet (RoCE) the first RoCE v2 GID that holds an IPv4 address (see verbs_device.h).
#pragma once

#include <string>
#include <vector>

#include "../fabric.h"

namespace rdmadev {

struct VerbsOptions {
  std::string device;
  int port = 0;
  int gid_index = -1;

  // Ports are numbered from 1; a device has at most 255 (ibv_device_attr.phys_port_cnt is a
  // u8).
  static constexpr int kMaxPort = 255;
  // GID table indexes are 16-bit in the kernel's sysfs layout; real tables hold 16-256
  // entries, and an index beyond the port's table is refused when the device is opened,
  // naming it.
  static constexpr int kMaxGidIndex = 65535;

  // The "verbs.<key>" keys it reads (ParseFabricOptions refuses any other).
  static std::vector<std::string> Keys() { return {"device", "port", "gid_index"}; }
  // Sets `key` from `text`; throws kConfig naming "verbs.<key>" when it is malformed or out
  // of range.
  void Set(const std::string& key, const std::string& text) {
    if (key == "device") device = text;
    if (key == "port") port = OptionInt("verbs", "port", text, 1, kMaxPort);
    if (key == "gid_index") gid_index = OptionInt("verbs", "gid_index", text, 0, kMaxGidIndex);
  }
};

}  // namespace rdmadev
