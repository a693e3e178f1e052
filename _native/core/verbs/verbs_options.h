// Which RDMA device, port and GID the verbs fabric uses. Empty / 0 / -1 mean "choose":
// the first device with an ACTIVE port, and on Ethernet (RoCE) the first RoCE v2 GID that
// holds an IPv4 address (see verbs_device.h for the order).
#pragma once

#include <string>

namespace rdmadev {

struct VerbsOptions {
  std::string device;  // RDMADEV_DEVICE, e.g. "mlx5_0", "rxe0"
  int port = 0;        // RDMADEV_PORT, 1-based
  int gid_index = -1;  // RDMADEV_GID_INDEX
};

// From RDMADEV_DEVICE / RDMADEV_PORT / RDMADEV_GID_INDEX (rdmadev.config validates them
// too, with messages that name the variable; here a malformed number means "choose").
VerbsOptions VerbsOptionsFromEnv();

}  // namespace rdmadev
