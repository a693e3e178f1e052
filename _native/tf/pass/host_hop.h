// A pair's half on a device other than its task's CPU (a GPU, a PluggableDevice, an XLA device)
// has no rdmadev kernel there (rules.h, KernelDevice). rdmadev's node for it then runs on the
// task's CPU, the "host", and the half's own node stays on its device as one end of TF's
// transfer between the device and the host: the device's copy engine moves the tensor, as
// TF's verbs staged a GPU tensor through host memory. HostHops makes those transfers: each
// hop is a _Send/_Recv pair within the task, keyed by the cross-task pair's tensor name with
// kHostHopSuffix, so it never meets the pair it replaces.
#pragma once

#include <memory>
#include <string>
#include <unordered_map>

#include "absl/status/status.h"
#include "tensorflow/core/common_runtime/device_set.h"
#include "tensorflow/core/graph/graph.h"

namespace rdmadev_tf {

inline constexpr char kHostHopSuffix[] = "/rdmadev_via_host";

class HostHops {
 public:
  using Partitions = std::unordered_map<std::string, std::unique_ptr<tensorflow::Graph>>;

  // `devices` (may be null) gives the host's incarnation for the keys of hops from it; without
  // it, a pair already in the partitions that the host sends does, else 0 (host_hop.cc).
  HostHops(Partitions* parts, const tensorflow::DeviceSet* devices) : parts_(parts), devices_(devices) {}

  // The partition of `host`, made (empty, with the function's library) when the function has
  // none on it yet: TF runs every partition it is given, one per device.
  tensorflow::Graph* Partition(const std::string& host);

  // Sending half `send` (a _Send or _HostSend on its device): it now sends to `host`, where
  // `*taken` is set to the new _Recv that takes its tensor, the input of rdmadev's node.
  absl::Status ToHost(tensorflow::Node* send, const std::string& host, tensorflow::Node** taken);

  // Receiving half `recv` (a _Recv or _HostRecv on its device): it now takes its tensor from
  // `host`, where a new _Send gives it output `output` of `value` (rdmadev's node).
  absl::Status FromHost(tensorflow::Node* recv, const std::string& host, tensorflow::Node* value,
                        int output);

 private:
  absl::Status Incarnation(const std::string& host, int64_t* incarnation);

  Partitions* parts_;
  const tensorflow::DeviceSet* devices_;
};

}  // namespace rdmadev_tf
