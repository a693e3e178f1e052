// Which RDMA device, port and GID the verbs fabric uses, from the domain's fabric options:
//   verbs.device     e.g. "mlx5_0", "rxe0" (rdmadev.Config: RDMADEV_DEVICE)
//   verbs.port       1-based port of that device (RDMADEV_PORT)
//   verbs.gid_index  GID table index on RoCE (RDMADEV_GID_INDEX)
// Unset (empty / 0 / -1 here) means "choose": the first device with an ACTIVE port, and on
// Ethernet (RoCE) the first RoCE v2 GID that holds an IPv4 address (see verbs_device.h).
#pragma once

#include <string>

#include "../fabric.h"

namespace rdmadev {

struct VerbsOptions {
  std::string device;
  int port = 0;
  int gid_index = -1;
};

// From the "verbs.*" entries of the domain's fabric options; throws kConfig naming the key
// whose value is malformed or out of range, or that verbs does not know.
VerbsOptions ParseVerbsOptions(const FabricOptions& options);

}  // namespace rdmadev
