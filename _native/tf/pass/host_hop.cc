// HostHops (host_hop.h): the transfers between a half's device and its task's CPU.
#include "host_hop.h"

#include "tensorflow/core/common_runtime/device.h"
#include "tensorflow/core/framework/node_def_util.h"
#include "tensorflow/core/graph/node_builder.h"

#include "pairs.h"

namespace rdmadev_tf {

using tensorflow::Graph;
using tensorflow::Node;

Graph* HostHops::Partition(const std::string& host) {
  auto it = parts_->find(host);
  if (it != parts_->end()) return it->second.get();
  const Graph* any = parts_->begin()->second.get();
  auto made = std::make_unique<Graph>(any->flib_def());
  made->set_versions(any->versions());
  Graph* g = made.get();
  parts_->emplace(host, std::move(made));
  return g;
}

absl::Status HostHops::Incarnation(const std::string& host, int64_t* incarnation) {
  // The function's device set names it (a coordinator's, a worker's); else a pair it sends.
  if (devices_) {
    if (tensorflow::Device* d = devices_->FindDeviceByName(host)) {
      *incarnation = static_cast<int64_t>(d->attributes().incarnation());
      return absl::OkStatus();
    }
  }
  for (auto& [device, g] : *parts_) {
    for (Node* n : g->op_nodes()) {
      std::string from;
      if ((IsSendOp(n) || IsRecvOp(n)) && tensorflow::TryGetNodeAttr(n->attrs(), "send_device", &from) &&
          from == host &&
          tensorflow::TryGetNodeAttr(n->attrs(), "send_device_incarnation", incarnation)) {
        return absl::OkStatus();
      }
    }
  }
  // A pair within a task meets in its local rendezvous, which does not check the key's
  // incarnation (TF's base_rendezvous_mgr.cc, SameWorkerRecvDone): both ends write the same.
  *incarnation = 0;
  return absl::OkStatus();
}

namespace {

// A _Send/_Recv node of a hop on `device`: the rendezvous attrs of the pair from `from`
// (incarnation `incarnation`) to `to`, under `tensor_name`.
tensorflow::NodeBuilder Hop(const std::string& name, const char* op, const std::string& device,
                            const std::string& tensor_name, const std::string& from, int64_t incarnation,
                            const std::string& to) {
  tensorflow::NodeBuilder b(name, op);
  b.Attr("tensor_name", tensor_name).Attr("send_device", from).Attr("send_device_incarnation", incarnation)
      .Attr("recv_device", to).Attr("client_terminated", false).Device(device);
  return b;
}

std::string Attr(const Node* n, const char* name) {
  std::string value;
  tensorflow::TryGetNodeAttr(n->attrs(), name, &value);
  return value;
}

}  // namespace

absl::Status HostHops::ToHost(Node* send, const std::string& host, Node** taken) {
  const std::string key = Attr(send, "tensor_name") + kHostHopSuffix;
  tensorflow::DataType dtype;
  int64_t incarnation = 0;
  TF_RETURN_IF_ERROR(tensorflow::GetNodeAttr(send->attrs(), "T", &dtype));
  TF_RETURN_IF_ERROR(tensorflow::GetNodeAttr(send->attrs(), "send_device_incarnation", &incarnation));
  // A _HostSend's tensor is in host memory already: its device's _HostSend hands it over as is.
  const char* op = send->type_string() == "_HostSend" ? "_HostRecv" : "_Recv";
  Node* recv = nullptr;
  TF_RETURN_IF_ERROR(Hop(send->name() + kHostHopSuffix, op, host, key, Attr(send, "send_device"), incarnation, host)
                         .Attr("tensor_type", dtype).Finalize(Partition(host), &recv));
  recv->set_assigned_device_name(host);
  send->AddAttr("recv_device", host);
  send->AddAttr("tensor_name", key);
  *taken = recv;
  return absl::OkStatus();
}

absl::Status HostHops::FromHost(Node* recv, const std::string& host, Node* value, int output) {
  const std::string key = Attr(recv, "tensor_name") + kHostHopSuffix;
  int64_t incarnation = 0;
  TF_RETURN_IF_ERROR(Incarnation(host, &incarnation));
  const char* op = recv->type_string() == "_HostRecv" ? "_HostSend" : "_Send";
  Node* send = nullptr;
  TF_RETURN_IF_ERROR(Hop(recv->name() + kHostHopSuffix, op, host, key, host, incarnation, recv->assigned_device_name())
                         .Input(value, output).Finalize(Partition(host), &send));
  send->set_assigned_device_name(host);
  recv->AddAttr("send_device", host);
  recv->AddAttr("send_device_incarnation", incarnation);
  recv->AddAttr("tensor_name", key);
  return absl::OkStatus();
}

}  // namespace rdmadev_tf
