// Options of the tcp fabric: none today (NoFabricOptions: a "tcp.<key>" is refused, naming
// it). Where it listens is the domain's tcp_listen, shared with the verbs side channel.
#pragma once

#include "../fabric.h"

namespace rdmadev {

struct TcpOptions : NoFabricOptions {};

}  // namespace rdmadev
