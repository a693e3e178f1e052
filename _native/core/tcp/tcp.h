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

std::string TcpUnviableReason();
std::unique_ptr<Fabric> MakeTcpFabric(const FabricContext& ctx, const TcpOptions& options);

// Runs the receiving side's frame loop over `bytes` as if they had arrived from an
// authenticated peer called `peer`: the entry point for fuzzing the parser.
struct ServeResult;
ServeResult FeedFrames(Domain* domain, const std::string& peer, const std::string& bytes);

}  // namespace rdmadev
