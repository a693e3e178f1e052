// One verbs endpoint: a reliable-connected queue pair to one peer, with its completion
// queue, a registered bounce buffer and the side-channel socket that tells when the peer
// process is gone. Writes are RDMA WRITE chains followed by the two signal words, reads are
// RDMA READs; completions are polled with the domain's wait policy.
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
// Send work requests a queue pair may have outstanding. A write posts its payload and
// signal as one chain (1 WR per message of at most the port's max_msg_sz, + 2 for the
// signal) and waits for the last; 64 covers a 64-message chain before it waits midway.
constexpr int kVerbsSendDepth = 64;

// Takes ownership of `qp` and of the side-channel socket `fd` (closed by Close).
std::shared_ptr<Endpoint> MakeVerbsEndpoint(std::shared_ptr<VerbsMemory> mem,
                                            std::unique_ptr<RcQp> qp, int fd, std::string reach,
                                            WaitPolicy policy);
#endif

}  // namespace rdmadev
