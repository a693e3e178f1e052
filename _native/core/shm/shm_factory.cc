// The shm fabric's registry entry (fabric.h: FabricFactoryOf; shm.h: ShmBackend).
#include "shm.h"

namespace rdmadev {
namespace {

const FabricRegistration kRegistration(FabricFactoryOf<ShmBackend>());

}  // namespace
}  // namespace rdmadev
