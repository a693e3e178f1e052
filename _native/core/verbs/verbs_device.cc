#include "verbs_device.h"

#include <arpa/inet.h>

#include <algorithm>

#include <cstdlib>
#include <cstring>
#include <fstream>

#include "../common.h"
#include "verbs.h"
#include "verbs_qp.h"

namespace rdmadev {

std::string GidText(const uint8_t gid[16]) {
  char buf[INET6_ADDRSTRLEN] = "?";
  inet_ntop(AF_INET6, gid, buf, sizeof buf);
  return buf;
}

#if RDMADEV_HAVE_VERBS
namespace {

const char* PortStateName(ibv_port_state s) {
  switch (s) {
    case IBV_PORT_DOWN: return "DOWN";
    case IBV_PORT_INIT: return "INIT";
    case IBV_PORT_ARMED: return "ARMED";
    case IBV_PORT_ACTIVE: return "ACTIVE";
    case IBV_PORT_ACTIVE_DEFER: return "ACTIVE_DEFER";
    default: return "NOP";
  }
}

// The kernel's "RoCE v2" / "IB/RoCE v1" for a GID, from sysfs ("" when unreadable).
std::string GidType(const std::string& dev, int port, int index) {
  std::ifstream f("/sys/class/infiniband/" + dev + "/ports/" + std::to_string(port) +
                  "/gid_attrs/types/" + std::to_string(index));
  std::string t;
  std::getline(f, t);
  return t;
}

bool IsZero(const ibv_gid& g) {
  static const uint8_t zero[16] = {};
  return std::memcmp(g.raw, zero, 16) == 0;
}

bool IsIpv4Mapped(const ibv_gid& g) {
  static const uint8_t prefix[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};
  return std::memcmp(g.raw, prefix, 12) == 0;
}

int GidScore(const ibv_gid& g, const std::string& type) {
  if (IsZero(g)) return 0;
  bool v2 = type == "RoCE v2";
  if (v2 && IsIpv4Mapped(g)) return 4;
  if (v2) return 3;
  if (IsIpv4Mapped(g)) return 2;
  return 1;
}

// Picks the GID on an opened Ethernet port; throws kFabric when there is none usable.
void ChooseGid(VerbsDevice* d, const ibv_port_attr& pa, const VerbsOptions& opts) {
  const IbvLib& lib = *d->lib;
  if (opts.gid_index >= 0) {
    if (opts.gid_index >= pa.gid_tbl_len ||
        lib.query_gid(d->ctx, d->port, opts.gid_index, &d->gid) != 0 || IsZero(d->gid)) {
      throw Error(ErrorKind::kFabric,
                  "Failed to use GID index " + std::to_string(opts.gid_index) + " of " + d->name +
                      " port " + std::to_string(d->port) + ": it is empty or beyond the table of " +
                      std::to_string(pa.gid_tbl_len),
                  EINVAL,
                  "unset RDMADEV_GID_INDEX to choose automatically, or pick a valid one from "
                  "`rdmadev doctor` (prefer a RoCE v2 GID holding an IPv4 address)");
    }
    d->gid_index = opts.gid_index;
    d->gid_type = GidType(d->name, d->port, d->gid_index);
    return;
  }
  int best = 0;
  for (int i = 0; i < pa.gid_tbl_len && i < 1024; ++i) {
    ibv_gid g;
    if (lib.query_gid(d->ctx, d->port, i, &g) != 0) continue;
    std::string type = GidType(d->name, d->port, i);
    int score = GidScore(g, type);
    if (score > best) {
      best = score;
      d->gid = g;
      d->gid_index = i;
      d->gid_type = type;
    }
  }
  if (best == 0) {
    throw Error(ErrorKind::kFabric,
                "Failed to find a GID on " + d->name + " port " + std::to_string(d->port) +
                    ": every entry is empty",
                ENOENT,
                "give the RoCE netdev an IP address (ip addr add ...), or set RDMADEV_GID_INDEX");
  }
}

// Tries one device: throws kFabric unless a port (and GID) is usable.
std::unique_ptr<VerbsDevice> TryDevice(const IbvLib& lib, ibv_device* dev,
                                       const VerbsOptions& opts) {
  auto d = std::make_unique<VerbsDevice>();
  d->lib = &lib;
  d->name = lib.get_device_name(dev);
  d->ctx = lib.open_device(dev);
  if (!d->ctx) {
    ThrowErrno(ErrorKind::kFabric, "Failed to open RDMA device " + d->name, errno,
               errno == EACCES || errno == EPERM
                   ? "this user cannot open /dev/infiniband/uverbs*: add it to the rdma group"
                   : "check `ibv_devinfo -d " + d->name + "`");
  }
  ibv_device_attr da{};
  if (lib.query_device(d->ctx, &da) != 0) {
    ThrowErrno(ErrorKind::kFabric, "Failed to query RDMA device " + d->name, errno);
  }
  // 16 outstanding reads is what perftest uses on most NICs; more only costs responder state.
  d->max_rd_atom = std::max(1, std::min(16, da.max_qp_init_rd_atom));
  d->max_dest_rd_atom = std::max(1, std::min(16, da.max_qp_rd_atom));
  d->ack_timeout = static_cast<uint8_t>(opts.ack_timeout > 0 ? opts.ack_timeout : kQpTimeout);
  std::string states;
  int first = opts.port > 0 ? opts.port : 1;
  int last = opts.port > 0 ? opts.port : da.phys_port_cnt;
  if (opts.port > da.phys_port_cnt) {
    throw Error(ErrorKind::kFabric, "Failed to use port " + std::to_string(opts.port) + " of " +
                                        d->name + ": it has " + std::to_string(da.phys_port_cnt),
                EINVAL, "set RDMADEV_PORT to a port of the device (1-based), or unset it");
  }
  for (int p = first; p <= last; ++p) {
    ibv_port_attr pa{};
    if (lib.query_port(d->ctx, static_cast<uint8_t>(p), &pa) != 0) continue;
    states += (states.empty() ? "" : ", ") + std::string("port ") + std::to_string(p) + " " +
              PortStateName(pa.state);
    if (pa.state != IBV_PORT_ACTIVE) continue;
    d->port = p;
    d->ethernet = pa.link_layer == IBV_LINK_LAYER_ETHERNET;
    d->lid = pa.lid;
    d->mtu = pa.active_mtu;
    d->max_msg = pa.max_msg_sz;
    if (d->ethernet) {
      ChooseGid(d.get(), pa, opts);
    } else {
      d->gid_index = 0;
      lib.query_gid(d->ctx, static_cast<uint8_t>(p), 0, &d->gid);
      d->gid_type = "IB";
    }
    return d;
  }
  throw Error(ErrorKind::kFabric, "Failed to find an ACTIVE port on " + d->name + " (" +
                                      (states.empty() ? "no port answered" : states) + ")",
              ENETDOWN,
              "bring the link up (cable, subnet manager for InfiniBand, `ip link set <netdev> up` "
              "for RoCE), or choose another device with RDMADEV_DEVICE");
}

}  // namespace

VerbsDevice::~VerbsDevice() {
  if (ctx) lib->close_device(ctx);
}

std::unique_ptr<VerbsDevice> OpenVerbsDevice(const IbvLib& lib, const VerbsOptions& opts) {
  int n = 0;
  ibv_device** list = lib.get_device_list(&n);
  if (!list) {
    int err = errno;
    ThrowErrno(ErrorKind::kFabric,
               err == ENOSYS ? "Failed to list RDMA devices: this kernel has no RDMA support "
                               "(no /sys/class/infiniband)"
                             : "Failed to list RDMA devices",
               err,
               "load the RDMA modules (modprobe ib_uverbs, and the NIC's driver or rdma_rxe), "
               "or use another fabric");
  }
  std::string names, why;
  std::unique_ptr<VerbsDevice> chosen;
  for (int i = 0; i < n && !chosen; ++i) {
    std::string name = lib.get_device_name(list[i]);
    names += (names.empty() ? "" : ", ") + name;
    if (!opts.device.empty() && name != opts.device) continue;
    try {
      chosen = TryDevice(lib, list[i], opts);
    } catch (const Error& e) {
      why += (why.empty() ? "" : "; ") + std::string(e.what());
      if (!opts.device.empty()) {
        lib.free_device_list(list);
        throw;
      }
    }
  }
  lib.free_device_list(list);
  if (chosen) return chosen;
  if (n == 0) {
    throw Error(ErrorKind::kFabric, "no RDMA device found", ENODEV,
                "load the NIC's RDMA driver, or create a Soft-RoCE device: "
                "`rdma link add rxe0 type rxe netdev <netdev>`");
  }
  if (!opts.device.empty()) {
    throw Error(ErrorKind::kFabric, "RDMADEV_DEVICE=" + opts.device + " is not an RDMA device (found: " +
                                        names + ")",
                ENODEV, "set RDMADEV_DEVICE to one of the devices found, or unset it");
  }
  throw Error(ErrorKind::kFabric, "no usable RDMA device: " + why, ENODEV,
              "see `rdmadev doctor` for every device, port and GID");
}

std::string VerbsBackend::UnviableReason(const VerbsOptions& opts) {
  std::string why;
  const IbvLib* lib = LoadIbv(&why);
  if (!lib) return why;
  try {
    OpenVerbsDevice(*lib, opts);
  } catch (const Error& e) {
    return std::string(e.what()) + (e.hint().empty() ? "" : " (" + e.hint() + ")");
  }
  return "";
}

#else

std::string VerbsBackend::UnviableReason(const VerbsOptions&) {
  std::string why;
  LoadIbv(&why);
  return why;
}

#endif

}  // namespace rdmadev
