// The call from the partition pass (pass.cc) into the planner: rdmadev.tf.bridge.rewrites, in
// this process's Python, returns a graph_pass.pass_view.PassView of the plan it made, which
// ReadPassView reads into the records below attribute by attribute, by name. The Python
// classes of the same names (graph_pass/pass_view.py) define the fields; these mirror them
// for the pass, and a field missing or of another type there is an error naming it here.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

// CPython's object type (Python.h), declared here so that the pass need not include it.
typedef struct _object PyObject;

namespace rdmadev_tf {

// What TF's graph says of one half (graph_pass HalfFacts).
struct HalfFacts {
  std::string node;    // the _Send/_Recv node's name
  std::string device;  // its partition
  int dtype = 0;       // tensorflow::DataType, parsed from the plan's name ("DT_FLOAT")
  std::vector<int64_t> shape;  // -1: a dim the sender's shape block carries
  bool unknown_rank = false;   // the whole shape travels in the shape block
};

// What the planner decided for one half (graph_pass HalfDecision).
struct HalfDecision {
  std::string channel;
  bool zero_copy = false;  // the receive may alias its slot
  bool owned = false;  // a half pair's op: its kernel holds the half while it lives
  bool dead = false;   // its tensor may be dead (a branch, a loop): TF's node, labelled (ApplyLabelled)
  bool loop = false;   // in a while loop's frame: the frame runs in order (RunIterationsInOrder)
  std::string host;    // "" or the task's CPU the half crosses through from its device (host_hop.h)
};

// The bounds every node of a view gets (graph_pass Limits).
struct Limits {
  double timeout_s = 0;             // the plan's deadline_s
  int64_t zero_copy_min_bytes = 0;  // the plan's threshold, applied to each tensor
  int64_t max_bytes = 0;            // RDMADEV_MAX_TENSOR_BYTES for dynamic channels (0: no limit)
};

// One half of a swapped pair with a channel of its own (graph_pass SwappedHalf).
struct SwappedHalf {
  bool send = false;  // side "send", else "recv"
  HalfFacts facts;
  HalfDecision decision;
  Limits limits;
};

// One tensor of a bundle's side (graph_pass BundleMember).
struct BundleMember {
  HalfFacts facts;
  int64_t offset = 0;  // where its bytes start in the slot's payload
};

// One side of a bundle: one node replaces its members' (graph_pass BundleHalf).
struct BundleHalf {
  bool send = false;
  std::string device;
  std::string host;  // "" or the task's CPU every member crosses through (host_hop.h)
  std::string channel;
  std::vector<BundleMember> members;  // in the order of their bytes in the slot
  Limits limits;
};

// What the pass applies (graph_pass PassView).
struct PassView {
  std::vector<SwappedHalf> halves;
  std::vector<BundleHalf> bundles;
};

// Reads the Python PassView `view` into `*out` (the GIL held). False with `*error` naming the
// field (e.g. "halves[2].decision.zero_copy is str, expected bool") when one is missing or of
// another type; never raises into Python.
bool ReadPassView(PyObject* view, PassView* out, std::string* error);

// Calls rdmadev.tf.bridge.rewrites({device: GraphDef bytes}, function, [marked names], task)
// with the GIL held and reads the view it returns; `task` is the task that partitions ("" when
// unknown: the process's runtime plans). False with `*error` set when there is no interpreter,
// the call raised, or it returned something ReadPassView refuses.
bool CallPlanner(const std::map<std::string, std::string>& parts, const std::string& function,
                 const std::vector<std::string>& marked, const std::string& task, PassView* out,
                 std::string* error);

}  // namespace rdmadev_tf
