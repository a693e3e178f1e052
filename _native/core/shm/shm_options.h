// Options of the shm fabric: none today. The parser still runs, so that a misspelt
// "shm.<key>" is an error naming it rather than silently ignored.
#pragma once

#include "../fabric.h"

namespace rdmadev {

struct ShmOptions {};

// From the "shm.*" entries of the domain's fabric options; throws kConfig naming a bad key.
ShmOptions ParseShmOptions(const FabricOptions& options);

}  // namespace rdmadev
