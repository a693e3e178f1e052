// One verbs endpoint: a reliable-connected queue pair to one peer, with its completion
// queue, registered staging memory and the side-channel socket that tells when the peer
// process is gone. Writes are RDMA WRITEs followed by the two signal words, posted without
// waiting for their completion (several in flight, only some signaled); reads are RDMA
// READs; completions are polled with the domain's wait policy.
#pragma once

#include <memory>
#include <string>

#include "../completion.h"
#include "../fabric.h"
#include "ibv_lib.h"
#include "verbs_memory.h"
#include "verbs_qp.h"

namespace rdmadev {

#if RDMADEV_HAVE_VERBS
// Send work requests a queue pair may have outstanding. A staged write takes 1 per 1 MiB
// piece + 2 for the signal, so 64 keeps every piece the staging holds (4) and the writes of
// dozens of small tensors on the wire at once; a poster waits for completions beyond it.
constexpr int kVerbsSendDepth = 64;

// Takes ownership of `qp` and of the side-channel socket `fd` (closed by Close).
std::shared_ptr<Endpoint> MakeVerbsEndpoint(std::shared_ptr<VerbsMemory> mem,
                                            std::unique_ptr<RcQp> qp, int fd, std::string reach,
                                            WaitPolicy policy);
#endif

}  // namespace rdmadev
