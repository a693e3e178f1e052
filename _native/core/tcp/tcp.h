// tcp fabric: software one-sided writes and reads for hosts without RDMA (the idea of
// Soft-iWARP). Each process listens; a peer connects, both prove knowledge of the cluster
// secret (HMAC-SHA256 challenge-response, both directions), then the connection carries
// frames (see frame.h). A receiver thread per connection checks every frame against the
// regions granted to that peer and receives payloads straight into the region.
#pragma once

#include <memory>
#include <string>

#include "../fabric.h"
#include "tcp_options.h"

namespace rdmadev {

class Domain;

// The tcp fabric in the registry (fabric.h: FabricFactoryOf).
struct TcpBackend {
  static constexpr char kName[] = "tcp";
  // Lowest: tcp reaches any host, but every byte crosses the kernel's TCP stack and a
  // receiver thread (loopback 2.7-3.2 GB/s here, 32 us blocking round trip): the fallback
  // when neither shm nor verbs connects the two tasks.
  static constexpr int kPriority = 100;
  using Options = TcpOptions;
  // "" when a TCP socket can be created, else why not.
  static std::string UnviableReason(const TcpOptions& options);
  // Listens on ctx.listen; throws kConfig without a cluster secret (peers authenticate).
  static std::unique_ptr<Fabric> Make(const FabricContext& ctx, const TcpOptions& options);
};

// Runs the receiving side's frame loop over `bytes` as if they had arrived from an
// authenticated peer called `peer`: the entry point for fuzzing the parser.
struct ServeResult;
ServeResult FeedFrames(Domain* domain, const std::string& peer, const std::string& bytes);

}  // namespace rdmadev
