// Choosing and opening the RDMA device, port and GID the verbs fabric uses.
//
// Order (each overridable, see VerbsOptions): the named device or else every device in
// ibv_get_device_list order; its named port or else its first ACTIVE port; on Ethernet
// (RoCE) the named GID index or else the best GID of the port: RoCE v2 holding an IPv4
// address (::ffff:a.b.c.d, routable over UDP/IP, what rdma_cm picks for IPv4 peers) >
// other RoCE v2 > RoCE v1 with IPv4 > any other non-zero GID. RoCE v1 and link-local GIDs
// are what earlier runtimes picked by default (index 0) and what failed across subnets.
// On InfiniBand the port's LID addresses the peer and GID 0 is used.
#pragma once

#include <memory>
#include <string>

#include "ibv_lib.h"
#include "verbs_options.h"

namespace rdmadev {

#if RDMADEV_HAVE_VERBS
struct VerbsDevice {
  const IbvLib* lib = nullptr;
  ibv_context* ctx = nullptr;
  std::string name;
  int port = 0;
  int gid_index = 0;
  ibv_gid gid{};
  std::string gid_type;       // "RoCE v2", "IB/RoCE v1", or "" when sysfs does not say
  bool ethernet = false;      // RoCE: addressed by GID (GRH needed), not by LID
  uint16_t lid = 0;
  ibv_mtu mtu = IBV_MTU_1024; // the port's active MTU
  uint32_t max_msg = 0;       // largest single message the port accepts
  int max_rd_atom = 1;        // outstanding RDMA READs a QP may have (as initiator / target)
  int max_dest_rd_atom = 1;
  uint8_t ack_timeout = 0;    // every QP's local ACK timeout (exponent; verbs_qp.h)

  ~VerbsDevice();
};

// Opens the chosen device; throws kFabric saying what was found and how to fix it.
std::unique_ptr<VerbsDevice> OpenVerbsDevice(const IbvLib& lib, const VerbsOptions& opts);
#endif

// "fe80::...", "::ffff:10.9.9.1" for messages.
std::string GidText(const uint8_t gid[16]);

}  // namespace rdmadev
