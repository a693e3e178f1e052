// The tcp fabric's registry entry (fabric.h: FabricFactoryOf; tcp.h: TcpBackend).
#include "tcp.h"

namespace rdmadev {
namespace {

const FabricRegistration kRegistration(FabricFactoryOf<TcpBackend>());

}  // namespace
}  // namespace rdmadev
