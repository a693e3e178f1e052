// verbs fabric: RDMA over InfiniBand, RoCE or iWARP NICs, and Soft-RoCE (rdma_rxe), through
// libibverbs loaded at run time (ibv_lib.h).
//
// Each region is registered once when allocated (verbs_memory.h); its descriptor carries
// the registration's address and rkey. An endpoint is one reliable-connected (RC) queue
// pair; a write is RDMA WRITEs from the registered source (or, copied, from the endpoint's
// registered staging) followed by the signal, posted without waiting for completion; a read is
// RDMA READs. Two tasks connect over a TCP side channel
// that first authenticates both ends with the cluster secret (handshake.h, as the tcp
// fabric does) and then swaps queue-pair numbers, GIDs and PSNs; it stays open afterwards,
// so a peer process that dies is noticed at once. reach = "<side-channel host:port>/<GID>".
//
// Access control: only authenticated peers get a queue pair, and a peer needs a region's
// descriptor (its rkey) to touch it; per-peer grants (Region::Grant) are enforced by the
// tcp fabric only, the NIC checks the rkey.
#pragma once

#include <memory>
#include <string>

#include "../completion.h"
#include "../fabric.h"
#include "verbs_options.h"

namespace rdmadev {

// The verbs fabric in the registry (fabric.h: FabricFactoryOf).
struct VerbsBackend {
  static constexpr char kName[] = "verbs";
  // Between shm and tcp: across hosts an RDMA NIC moves bytes without either CPU copying
  // them; on one host shm's single memcpy is still cheaper than a trip through the NIC.
  static constexpr int kPriority = 200;
  using Options = VerbsOptions;
  // "" when libibverbs loads and the device `opts` choose opens, else why not
  // (verbs_device.cc).
  static std::string UnviableReason(const VerbsOptions& opts);
  // The side channel listens on the host of ctx.listen ("host:port"), any free port.
  static std::unique_ptr<Fabric> Make(const FabricContext& ctx, const VerbsOptions& opts);
};

}  // namespace rdmadev
