// What one of TF's _Send/_Recv nodes says about its pair: the task of a device, whether the
// pair crosses tasks, which half it is, and its rendezvous key (the same on both halves).
// The passes (pass.cc, branch_exits.cc) read partition graphs through these.
#pragma once

#include <string>

#include "tensorflow/core/framework/node_def_util.h"
#include "tensorflow/core/graph/graph.h"

namespace rdmadev_tf {

// The task part of a TF device name (`/job:ps/replica:0/task:0`).
inline std::string TaskOf(const std::string& device) {
  size_t d = device.find("/device:");
  return d == std::string::npos ? device : device.substr(0, d);
}

// Whether `n` is a _Send/_Recv whose pair joins two tasks (not the client's feeds and fetches).
inline bool IsCrossTaskPair(const tensorflow::Node* n) {
  const std::string& op = n->type_string();
  if (op != "_Send" && op != "_Recv" && op != "_HostSend" && op != "_HostRecv") return false;
  std::string from, to;
  bool client = false;
  if (!tensorflow::TryGetNodeAttr(n->attrs(), "send_device", &from) ||
      !tensorflow::TryGetNodeAttr(n->attrs(), "recv_device", &to))
    return false;
  tensorflow::TryGetNodeAttr(n->attrs(), "client_terminated", &client);
  return !client && TaskOf(from) != TaskOf(to);
}

inline bool IsSendOp(const tensorflow::Node* n) {
  return n->type_string() == "_Send" || n->type_string() == "_HostSend";
}
inline bool IsRecvOp(const tensorflow::Node* n) {
  return n->type_string() == "_Recv" || n->type_string() == "_HostRecv";
}

// The pair's rendezvous key: tensor name, sending and receiving device.
inline std::string RendezvousKey(const tensorflow::Node* n) {
  std::string name, from, to;
  tensorflow::TryGetNodeAttr(n->attrs(), "tensor_name", &name);
  tensorflow::TryGetNodeAttr(n->attrs(), "send_device", &from);
  tensorflow::TryGetNodeAttr(n->attrs(), "recv_device", &to);
  return name + "|" + from + "|" + to;
}

}  // namespace rdmadev_tf
