// The POST_PARTITIONING pass: finds every cross-task _Send/_Recv pair TensorFlow made for a
// function, asks the planner (graph_pass, through rdmadev.tf.bridge in this process's Python)
// which pairs to swap and for what channels, and replaces each planned _Send by RdmadevSend
// and each planned _Recv by RdmadevRecv (the pairs of a bundle: all of its _Send nodes by one
// RdmadevSendBundle, its _Recv nodes by one RdmadevRecvBundle; ApplyBundle), or, for a pair whose tensor may be dead (in a branch
// of a conditional, in a while loop), labels TF's own nodes for the same kernels
// (ApplyLabelled) and runs the loops around such nodes one iteration at a time
// (RunIterationsInOrder). Everything else is left as TF made it. The passes before it decide
// which functions it rewrites (opt_in.cc) and mark the pairs that leave a conditional's
// branch (branch_exits.cc); the pairs' shapes and bounds come from shapes.cc, and the planner
// is called through planner_call.cc.
#include <map>
#include <set>
#include <string>
#include <vector>

#include "tensorflow/core/common_runtime/optimization_registry.h"
#include "tensorflow/core/framework/graph.pb.h"
#include "tensorflow/core/framework/node_def_util.h"
#include "tensorflow/core/graph/algorithm.h"
#include "tensorflow/core/graph/control_flow.h"
#include "tensorflow/core/graph/graph.h"
#include "tensorflow/core/graph/node_builder.h"

#include "common.h"
#include "host_hop.h"
#include "labelled.h"
#include "opt_in.h"
#include "pairs.h"
#include "planner_call.h"
#include "shapes.h"

namespace rdmadev_tf {
namespace {

using tensorflow::Graph;
using tensorflow::Node;

std::string Sanitized(const std::string& s) {
  std::string safe;
  for (char c : s) safe += (isalnum(static_cast<unsigned char>(c)) ? c : '_');
  return safe;
}

const char* Side(bool send) { return send ? "send" : "recv"; }

// Node names must be unique across every graph a TF1 worker registers (it caches stateful
// kernels by node name, per session): derive them from the channel key. A half pair's key is
// the same in every graph of a session that has that pair; its replaced node's name (unique
// in the session) keeps each graph's kernel its own.
std::string NodeName(const SwappedHalf& h) {
  std::string name = std::string("rdmadev_") + Side(h.send) + "_" + Sanitized(h.decision.channel);
  return h.decision.owned ? name + "_" + Sanitized(h.facts.node) : name;
}

// A half's planned shape: unknown rank unless the plan knows it.
absl::Status PlannedShape(const HalfFacts& f, tensorflow::PartialTensorShape* shape) {
  if (f.unknown_rank) return absl::OkStatus();
  return tensorflow::PartialTensorShape::BuildPartialTensorShape(f.shape, shape);
}

// Writes the settings rdmadev's kernels read (send_op.cc, recv_op.cc) with `set(name, value)`: the same for an
// RdmadevSend/RdmadevRecv node and, under kSettingPrefix, for a labelled one.
template <typename Set>
absl::Status WriteSettings(const SwappedHalf& h, Set set) {
  const HalfDecision& d = h.decision;
  if (!h.send) {
    tensorflow::PartialTensorShape shape;
    TF_RETURN_IF_ERROR(PlannedShape(h.facts, &shape));
    set("shape", shape);
    set("zero_copy", d.zero_copy);
    set("zero_copy_min_bytes", static_cast<int64_t>(d.zero_copy ? h.limits.zero_copy_min_bytes : 0));
  }
  set("channel", d.channel);
  set("timeout_s", static_cast<float>(h.limits.timeout_s));
  set("max_bytes", static_cast<int64_t>(h.limits.max_bytes));
  set("owned", d.owned);
  return absl::OkStatus();
}

// A half whose tensor may be dead keeps TF's own _Send/_Recv node, labelled for rdmadev's
// kernels (labelled.h; kernel_support.h: TF's executor runs a transfer node on a dead input and lets a
// receiving one output a dead tensor, as no custom op may). It is renamed as Apply names its
// nodes.
absl::Status ApplyLabelled(Node* n, const SwappedHalf& h) {
  TF_RETURN_IF_ERROR(WriteSettings(h, [n](const std::string& name, const auto& value) {
    n->AddAttr(kSettingPrefix + name, value);
  }));
  n->AddAttr("_kernel", std::string(kTransferLabel));
  n->set_name(NodeName(h));
  return absl::OkStatus();
}

// A channel carries its transfers in order, one per execution of each half; TF's rendezvous
// instead keys a pair's tensor by frame and iteration, and a loop's iterations may run ahead
// of each other (parallel_iterations, 10 by default). So every loop around a labelled node in
// a loop (nested ones too) runs one iteration at a time in this partition: the executor starts
// iteration i + 1 of a frame only once every op of iteration i is done, so each half runs once
// per iteration in iteration order, the exit iteration's (with a dead tensor) last. Both
// halves' partitions do this, and both loops stop after the same iteration (TF sends the
// predicate). Sets parallel_iterations to 1 on every Enter of those frames (the executor
// requires one value per frame).
absl::Status RunIterationsInOrder(Graph* g, const std::vector<const Node*>& nodes) {
  std::vector<tensorflow::ControlFlowInfo> info;
  TF_RETURN_IF_ERROR(tensorflow::BuildControlFlowInfo(g, &info));
  std::set<std::string> frames;
  for (const Node* n : nodes) {
    // A node's frame is its innermost loop, whose parent_frame is an Enter of the enclosing
    // loop (of its own frame, as for any Enter), or the source node outside every loop.
    for (const Node* at = n; at && !at->IsSource() && !info[at->id()].frame_name.empty();
         at = info[at->id()].parent_frame) {
      frames.insert(info[at->id()].frame_name);
    }
  }
  for (Node* n : g->op_nodes()) {
    std::string frame;
    if (n->IsEnter() && tensorflow::TryGetNodeAttr(n->attrs(), "frame_name", &frame) &&
        frames.count(frame)) {
      n->AddAttr("parallel_iterations", 1);
    }
  }
  return absl::OkStatus();
}

// The data input of _Send `send`.
absl::Status DataInput(const Node* send, tensorflow::NodeBuilder::NodeOut* out) {
  for (const auto* e : send->in_edges()) {
    if (!e->IsControlEdge()) {
      *out = tensorflow::NodeBuilder::NodeOut(e->src(), e->src_output());
      return absl::OkStatus();
    }
  }
  return absl::InternalError("_Send " + send->name() + " has no data input");
}

// rdmadev's node for half `h` in `g`, on `device` (as requested: `requested`): an RdmadevSend
// of `input`, or an RdmadevRecv.
// The RdmadevSend/RdmadevRecv node of `h`, replacing TF's `old`; a half pair's keeps `old`'s
// rendezvous attrs (labelled.h kRendezvousAttrs).
absl::Status NewNode(Graph* g, const SwappedHalf& h, const Node* old, const std::string& requested,
                     const std::string& device, const tensorflow::NodeBuilder::NodeOut& input,
                     Node** fresh) {
  const auto dtype = static_cast<tensorflow::DataType>(h.facts.dtype);
  tensorflow::NodeBuilder b(NodeName(h), h.send ? "RdmadevSend" : "RdmadevRecv");
  if (h.send) {
    b.Input(input);
    b.Attr("T", dtype);
  } else {
    b.Attr("dtype", dtype);
  }
  TF_RETURN_IF_ERROR(WriteSettings(h, [&b](const std::string& name, const auto& value) {
    b.Attr(name, value);
  }));
  if (h.decision.owned) {
    for (const char* name : kRendezvousAttrs) {
      const tensorflow::AttrValue* value = old->attrs().Find(name);
      if (value == nullptr) return absl::InternalError(old->name() + " has no attr " + name);
      b.Attr(kRendezvousPrefix + std::string(name), *value);
    }
  }
  b.Device(requested);
  TF_RETURN_IF_ERROR(b.Finalize(g, fresh));
  (*fresh)->set_assigned_device_name(device);
  return absl::OkStatus();
}

// A half on a device with no rdmadev kernel (h.decision.host names its task's CPU): rdmadev's
// node, or a labelled copy of TF's for a tensor that may be dead, runs on the host, and the
// half's own node stays on its device, now TF's transfer to or from the host (host_hop.h).
absl::Status ApplyViaHost(Node* old, const SwappedHalf& h, HostHops& hops) {
  const std::string& host = h.decision.host;
  if (h.decision.loop) return absl::InternalError("rdmadev plan moves " + h.facts.node + " in a loop to " + host);
  Graph* g = hops.Partition(host);
  Node* fresh = nullptr;
  if (h.decision.dead) {
    tensorflow::NodeDef def = old->def();
    def.clear_input();
    def.set_device(host);
    absl::Status added;
    fresh = g->AddNode(std::move(def), &added);
    TF_RETURN_IF_ERROR(added);
    fresh->set_assigned_device_name(host);
    TF_RETURN_IF_ERROR(ApplyLabelled(fresh, h));
  }
  if (h.send) {
    Node* taken = nullptr;
    TF_RETURN_IF_ERROR(hops.ToHost(old, host, &taken));
    if (fresh) {
      g->AddEdge(taken, 0, fresh, 0);
      return absl::OkStatus();
    }
    return NewNode(g, h, old, host, host, tensorflow::NodeBuilder::NodeOut(taken, 0), &fresh);
  }
  if (!fresh) TF_RETURN_IF_ERROR(NewNode(g, h, old, host, host, {}, &fresh));
  return hops.FromHost(old, host, fresh, 0);
}

absl::Status Apply(Graph* g, Node* old, const SwappedHalf& h, HostHops& hops) {
  if (!h.decision.host.empty()) return ApplyViaHost(old, h, hops);
  if (h.decision.dead) return ApplyLabelled(old, h);
  tensorflow::NodeBuilder::NodeOut data;
  if (h.send) TF_RETURN_IF_ERROR(DataInput(old, &data));
  Node* fresh = nullptr;
  TF_RETURN_IF_ERROR(
      NewNode(g, h, old, old->requested_device(), old->assigned_device_name(), data, &fresh));
  std::vector<const tensorflow::Edge*> in(old->in_edges().begin(), old->in_edges().end());
  std::vector<const tensorflow::Edge*> outs(old->out_edges().begin(), old->out_edges().end());
  for (const auto* e : in) if (e->IsControlEdge()) g->AddControlEdge(e->src(), fresh);
  for (const auto* e : outs) {
    if (e->IsControlEdge()) g->AddControlEdge(fresh, e->dst());
    else g->AddEdge(fresh, 0, e->dst(), e->dst_input());
  }
  g->RemoveNode(old);
  return absl::OkStatus();
}

// Replaces the _Send (or _Recv) nodes of a bundle's members in `g` by one RdmadevSendBundle
// (RdmadevRecvBundle) whose input (output) i is member i's: it takes every edge of theirs,
// their control edges once each. The planner made sure no member waits for another's
// arrival (graph_pass.bundles), so the merged node closes no cycle.
absl::Status ApplyBundle(Graph* g, const std::map<std::string, Node*>& nodes, const BundleHalf& r,
                         HostHops& hops) {
  const bool send = r.send;
  const bool via_host = !r.host.empty();
  std::vector<Node*> olds;
  for (const auto& m : r.members) {
    auto it = nodes.find(m.facts.node);
    if (it == nodes.end()) return absl::InternalError("rdmadev bundle names unknown node " + m.facts.node + " on " + r.device);
    olds.push_back(it->second);
  }
  tensorflow::NodeBuilder b(std::string("rdmadev_") + Side(send) + "_bundle_" + Sanitized(r.channel),
                            send ? "RdmadevSendBundle" : "RdmadevRecvBundle");
  std::vector<int64_t> offsets;
  std::vector<tensorflow::DataType> dtypes;
  std::vector<tensorflow::PartialTensorShape> shapes;
  std::vector<tensorflow::NodeBuilder::NodeOut> inputs;
  for (size_t i = 0; i < olds.size(); ++i) {
    const BundleMember& m = r.members[i];
    offsets.push_back(m.offset);
    dtypes.push_back(static_cast<tensorflow::DataType>(m.facts.dtype));
    tensorflow::PartialTensorShape shape;
    TF_RETURN_IF_ERROR(PlannedShape(m.facts, &shape));
    shapes.push_back(shape);
    if (!send) continue;
    inputs.emplace_back();
    if (!via_host) {
      TF_RETURN_IF_ERROR(DataInput(olds[i], &inputs.back()));
      continue;
    }
    Node* taken = nullptr;
    TF_RETURN_IF_ERROR(hops.ToHost(olds[i], r.host, &taken));
    inputs.back() = tensorflow::NodeBuilder::NodeOut(taken, 0);
  }
  if (send) {
    b.Input(inputs);
  } else {
    b.Attr("dtypes", dtypes);
    b.Attr("shapes", shapes);
  }
  b.Attr("offsets", offsets);
  b.Attr("channel", r.channel);
  b.Attr("timeout_s", static_cast<float>(r.limits.timeout_s));
  b.Device(via_host ? r.host : olds[0]->requested_device());
  Node* fresh = nullptr;
  TF_RETURN_IF_ERROR(b.Finalize(via_host ? hops.Partition(r.host) : g, &fresh));
  fresh->set_assigned_device_name(via_host ? r.host : olds[0]->assigned_device_name());
  if (via_host) {  // the members' nodes stay, each now a hop to or from the host
    if (!send) {
      for (size_t i = 0; i < olds.size(); ++i) {
        TF_RETURN_IF_ERROR(hops.FromHost(olds[i], r.host, fresh, static_cast<int>(i)));
      }
    }
    return absl::OkStatus();
  }
  std::set<Node*> before, after;
  for (size_t i = 0; i < olds.size(); ++i) {
    std::vector<const tensorflow::Edge*> in(olds[i]->in_edges().begin(), olds[i]->in_edges().end());
    std::vector<const tensorflow::Edge*> outs(olds[i]->out_edges().begin(), olds[i]->out_edges().end());
    for (const auto* e : in) if (e->IsControlEdge()) before.insert(e->src());
    for (const auto* e : outs) {
      if (e->IsControlEdge()) after.insert(e->dst());
      else g->AddEdge(fresh, static_cast<int>(i), e->dst(), e->dst_input());
    }
  }
  for (Node* n : before) g->AddControlEdge(n, fresh);
  for (Node* n : after) g->AddControlEdge(fresh, n);
  for (Node* old : olds) g->RemoveNode(old);
  return absl::OkStatus();
}

// The task that partitions, "/job:worker/replica:0/task:1", when the partitions say: a TF1
// GraphMgr partitions its own task's graph alone. A process may run several tasks (an
// in-process cluster), and the planner then sets channels up through that task's runtime.
// A function's partitions span tasks, and TF 2.21 gives a POST_PARTITIONING pass no device
// set to tell its own from (measured: options.device_set and default_function_device are
// null there), so "": the process's coordinator runtime plans (rdmadev/cluster/runtime.py).
std::string PartitioningTask(const tensorflow::GraphOptimizationPassOptions& options) {
  std::string task;
  for (const auto& kv : *options.partition_graphs) {
    if (!task.empty() && TaskOf(kv.first) != task) return "";
    task = TaskOf(kv.first);
  }
  return task;
}

class RdmadevPass : public tensorflow::GraphOptimizationPass {
 public:
  absl::Status Run(const tensorflow::GraphOptimizationPassOptions& options) override {
    int mode = PassMode();
    if (mode == kRewriteNone || !options.partition_graphs) return absl::OkStatus();
    auto* parts = options.partition_graphs;
    bool any = false;
    for (auto& kv : *parts) {
      for (Node* n : kv.second->op_nodes()) {
        if (IsCrossTaskPair(n)) { any = true; break; }
      }
      if (any) break;
    }
    if (!any) return absl::OkStatus();  // the common case: one task, nothing to do
    // TF's partitioner names the function being instantiated as the debug prefix.
    std::vector<std::string> marked = TakeOptIn(options.debug_filename_prefix);
    if (mode == kRewriteMarked && marked.empty()) return absl::OkStatus();  // not opted in
    AnnotatePairShapes(parts);
    std::map<std::string, std::string> serialized;
    for (auto& kv : *parts) {
      tensorflow::GraphDef gd;
      kv.second->ToGraphDef(&gd);
      serialized[kv.first] = gd.SerializeAsString();
    }
    PassView view;
    std::string error;
    if (!CallPlanner(serialized, options.debug_filename_prefix, marked, PartitioningTask(options),
                     &view, &error)) {
      // rdmadev was asked for: falling back to gRPC silently would hide the problem (a
      // wrong secret, a task started without rdmadev). Fail the instantiation with the cause.
      rdmadev::LogEvent("pass: planning failed: " + error);
      return absl::FailedPreconditionError("rdmadev could not plan this function: " + error);
    }
    auto partition = [parts](const std::string& device) -> Graph* {
      auto it = parts->find(device);
      return it == parts->end() ? nullptr : it->second.get();
    };
    HostHops hops(parts, options.device_set);
    std::map<Graph*, std::vector<const Node*>> in_loops;  // labelled nodes in a loop, by partition
    for (const SwappedHalf& h : view.halves) {
      Graph* g = partition(h.facts.device);
      if (!g) return absl::InternalError("rdmadev plan names unknown partition " + h.facts.device);
      Node* old = nullptr;
      for (Node* n : g->op_nodes()) if (n->name() == h.facts.node) { old = n; break; }
      if (!old) return absl::InternalError("rdmadev plan names unknown node " + h.facts.node + " on " + h.facts.device);
      TF_RETURN_IF_ERROR(Apply(g, old, h, hops));
      if (h.decision.loop) in_loops[g].push_back(old);  // labelled in place: `old` is still the node
    }
    for (const BundleHalf& b : view.bundles) {
      Graph* g = partition(b.device);
      if (!g) return absl::InternalError("rdmadev plan names unknown partition " + b.device);
      std::map<std::string, Node*> nodes;
      for (Node* n : g->op_nodes()) nodes[n->name()] = n;
      TF_RETURN_IF_ERROR(ApplyBundle(g, nodes, b, hops));
    }
    for (const auto& [g, nodes] : in_loops) TF_RETURN_IF_ERROR(RunIterationsInOrder(g, nodes));
    return absl::OkStatus();
  }
};

}  // namespace

// Phase 77: after the oneDNN layout passes (POST_PARTITIONING phases 1 and 2).
REGISTER_OPTIMIZATION(tensorflow::OptimizationPassRegistry::POST_PARTITIONING, 77, RdmadevPass);

}  // namespace rdmadev_tf
