// One verbs endpoint: a reliable-connected queue pair to one peer, whose send side (work
// requests, registered staging, completions: verbs_send_queue.h) it owns, and the
// side-channel socket that tells when the peer process is gone. Writes are RDMA WRITEs
// followed by the two signal words, posted without waiting for their completion (several in
// flight, only some signaled); reads are RDMA READs; completions are polled with the
// domain's wait policy.
#pragma once

#include <memory>
#include <string>

#include "../completion.h"
#include "../fabric.h"
#include "ibv_lib.h"
#include "verbs_memory.h"
#include "verbs_qp.h"
#include "verbs_send_queue.h"

namespace rdmadev {

#if RDMADEV_HAVE_VERBS
// Takes ownership of `qp` and of the side-channel socket `fd` (closed by Close).
std::shared_ptr<Endpoint> MakeVerbsEndpoint(std::shared_ptr<VerbsMemory> mem,
                                            std::unique_ptr<RcQp> qp, int fd, std::string reach,
                                            WaitPolicy policy);
#endif

}  // namespace rdmadev
