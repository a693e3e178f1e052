// What one of TF's _Send/_Recv nodes says about its pair: the task of a device, whether the
// pair crosses tasks, which half it is, and its rendezvous key (the same on both halves).
// The passes (pass.cc, branch_exits.cc, shapes.cc) read partition graphs through these; the
// rules themselves, which the planner asks too, are rules.h's.
#pragma once

#include <string>

#include "tensorflow/core/framework/node_def_util.h"
#include "tensorflow/core/graph/graph.h"

#include "rules.h"

namespace rdmadev_tf {

inline bool IsSendOp(const tensorflow::Node* n) { return IsSendOpName(n->type_string()); }
inline bool IsRecvOp(const tensorflow::Node* n) { return IsRecvOpName(n->type_string()); }

// Whether `n` is a _Send/_Recv whose pair joins two tasks (not the client's feeds and fetches).
inline bool IsCrossTaskPair(const tensorflow::Node* n) {
  if (!IsSendOp(n) && !IsRecvOp(n)) return false;
  std::string from, to;
  bool client = false;
  if (!tensorflow::TryGetNodeAttr(n->attrs(), "send_device", &from) ||
      !tensorflow::TryGetNodeAttr(n->attrs(), "recv_device", &to))
    return false;
  tensorflow::TryGetNodeAttr(n->attrs(), "client_terminated", &client);
  return !client && CrossesTasks(from, to);
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
