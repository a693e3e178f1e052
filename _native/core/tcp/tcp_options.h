// Options of the tcp fabric: none today (where it listens is the domain's tcp_listen,
// shared with the verbs side channel). The parser still runs, so that a misspelt
// "tcp.<key>" is an error naming it rather than silently ignored.
#pragma once

#include "../fabric.h"

namespace rdmadev {

struct TcpOptions {};

// From the "tcp.*" entries of the domain's fabric options; throws kConfig naming a bad key.
TcpOptions ParseTcpOptions(const FabricOptions& options);

}  // namespace rdmadev
