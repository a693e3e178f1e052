// Options of the shm fabric: none today (NoFabricOptions: a "shm.<key>" is refused, naming it).
#pragma once

#include "../fabric.h"

namespace rdmadev {

struct ShmOptions : NoFabricOptions {};

}  // namespace rdmadev
