// The verbs fabric's registry entry (fabric.h: FabricFactoryOf; verbs.h: VerbsBackend).
#include "verbs.h"

namespace rdmadev {
namespace {

const FabricRegistration kRegistration(FabricFactoryOf<VerbsBackend>());

}  // namespace
}  // namespace rdmadev
