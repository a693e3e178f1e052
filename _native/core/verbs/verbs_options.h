// Which RDMA device, port and GID the verbs fabric uses, from the domain's fabric options:
//   verbs.device     e.g. "mlx5_0", "rxe0" (rdmadev.Config: RDMADEV_DEVICE)
//   verbs.port       1-based port of that device (RDMADEV_PORT)
//   verbs.gid_index  GID table index on RoCE (RDMADEV_GID_INDEX)
//   verbs.ack_timeout  the queue pairs' local ACK timeout, as the IB exponent: 4.096 us * 2^n
//                    (RDMADEV_ACK_TIMEOUT)
// Unset (empty / 0 / -1 here) means "choose": the first device with an ACTIVE port, on
// Ethernet (RoCE) the first RoCE v2 GID that holds an IPv4 address (see verbs_device.h), and
// the ACK timeout kQpTimeout (verbs_qp.h).
#pragma once

#include <string>
#include <vector>

#include "../fabric.h"

namespace rdmadev {

struct VerbsOptions {
  std::string device;
  int port = 0;
  int gid_index = -1;
  int ack_timeout = 0;

  // Ports are numbered from 1; a device has at most 255 (ibv_device_attr.phys_port_cnt is a
  // u8).
  static constexpr int kMaxPort = 255;
  // GID table indexes are 16-bit in the kernel's sysfs layout; real tables hold 16-256
  // entries, and an index beyond the port's table is refused when the device is opened,
  // naming it.
  static constexpr int kMaxGidIndex = 65535;
  // The ACK timeout: 0 would mean "wait forever" (IB spec), never wanted: a peer that stopped
  // acknowledging must fail its transfers. At most 18 (1.07 s): a write then lands or fails
  // within (1 + kQpRetryCount) * 1.07 s = 7.5 s, inside the 10 s a released ring stays
  // registered for late writes (kLateWriteGraceS, region.h) and an attach waits for its read.
  static constexpr int kMaxAckTimeout = 18;

  // The "verbs.<key>" keys it reads (ParseFabricOptions refuses any other).
  static std::vector<std::string> Keys() { return {"device", "port", "gid_index", "ack_timeout"}; }
  // Sets `key` from `text`; throws kConfig naming "verbs.<key>" when it is malformed or out
  // of range.
  void Set(const std::string& key, const std::string& text) {
    if (key == "device") device = text;
    if (key == "port") port = OptionInt("verbs", "port", text, 1, kMaxPort);
    if (key == "gid_index") gid_index = OptionInt("verbs", "gid_index", text, 0, kMaxGidIndex);
    if (key == "ack_timeout") {
      ack_timeout = OptionInt("verbs", "ack_timeout", text, 1, kMaxAckTimeout);
    }
  }
};

}  // namespace rdmadev
