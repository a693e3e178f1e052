// The call from the partition pass (pass.cc) into the planner: rdmadev.tf.bridge.rewrites,
// in this process's Python, returns one Rewrite per half of every pair to swap.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace rdmadev_tf {

// One tensor of a bundle's half: its node, dtype, shape and offset in the slot's payload.
struct BundleMember {
  std::string node;
  int dtype = 0;
  std::vector<int64_t> shape;
  int64_t offset = 0;
};

// One half of a swapped pair, or of a bundle of them (`members`), as the planner gave it
// (rdmadev/tf/bridge.py builds the tuple).
struct Rewrite {
  std::string kind;    // "send" or "recv"
  std::string device;  // partition key
  std::string node;    // the _Send/_Recv node's name; "" for a bundle
  std::string channel;
  int dtype = 0;
  std::vector<int64_t> shape;  // -1: a dim the sender's shape block carries
  bool unknown_rank = false;   // the whole shape travels in the shape block
  bool zero_copy = false;  // decided by the planner (graph_pass.zero_copy)
  long long zero_copy_min_bytes = 0;  // the plan's threshold, applied to each tensor
  double timeout_s = 0;    // the plan's deadline_s, always given by the bridge
  long long max_bytes = 0;  // RDMADEV_MAX_TENSOR_BYTES for dynamic channels (0: no limit)
  bool owned = false;  // a half pair's op: its kernel holds the half while it lives
  bool dead = false;   // its tensor may be dead (a branch, a loop): TF's node, labelled (ApplyLabelled)
  bool loop = false;   // in a while loop's frame: the frame runs in order (RunIterationsInOrder)
  std::vector<BundleMember> members;  // a bundle's tensors, in its order (ApplyBundle); else empty
};

// Calls rdmadev.tf.bridge.rewrites({device: GraphDef bytes}, function, [marked names]) with
// the GIL held. False with `*error` set when there is no interpreter, the call raised, or it
// returned something other than a list of rewrites.
bool CallPlanner(const std::map<std::string, std::string>& parts, const std::string& function,
                 const std::vector<std::string>& marked, std::vector<Rewrite>* out,
                 std::string* error);

}  // namespace rdmadev_tf
