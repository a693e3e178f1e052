// The tcp fabric's registry entry.
#include "tcp.h"
#include "tcp_options.h"

namespace rdmadev {

TcpOptions ParseTcpOptions(const FabricOptions& options) {
  OptionsOf("tcp", options, {});
  return TcpOptions{};
}

namespace {

// Lowest: tcp reaches any host, but every byte crosses the kernel's TCP stack and a
// receiver thread (loopback 2.7-3.2 GB/s here, 32 us blocking round trip): the fallback
// when neither shm nor verbs connects the two tasks.
constexpr int kTcpPriority = 100;

const FabricRegistration kRegistration({
    "tcp", kTcpPriority,
    [](const FabricOptions& options) { ParseTcpOptions(options); },
    [](const FabricOptions& options) {
      ParseTcpOptions(options);
      return TcpUnviableReason();
    },
    [](const FabricContext& ctx, const FabricOptions& options) {
      return MakeTcpFabric(ctx, ParseTcpOptions(options));
    },
});

}  // namespace
}  // namespace rdmadev
