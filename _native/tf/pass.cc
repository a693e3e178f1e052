// The POST_PARTITIONING pass: finds every cross-task _Send/_Recv pair TensorFlow made for a
// function, asks the planner (graph_pass, through rdmadev.tf.bridge in this process's Python)
// which pairs to swap and for what channels, and replaces each planned _Send by RdmadevSend
// and each planned _Recv by RdmadevRecv, or, for a pair whose tensor may be dead (in a branch
// of a conditional, in a while loop), labels TF's own nodes for the same kernels
// (ApplyLabelled) and runs the loops around such nodes one iteration at a time
// (RunIterationsInOrder). Everything else is left as TF made it.
#include <Python.h>

#include <atomic>
#include <cctype>
#include <map>
#include <mutex>
#include <set>
#include <tuple>
#include <unordered_set>
#include <string>
#include <vector>

#include "tensorflow/core/common_runtime/optimization_registry.h"
#include "tensorflow/core/common_runtime/shape_refiner.h"
#include "tensorflow/core/framework/shape_inference.h"
#include "tensorflow/core/graph/algorithm.h"
#include "tensorflow/core/framework/graph.pb.h"
#include "tensorflow/core/framework/node_def_util.h"
#include "tensorflow/core/graph/control_flow.h"
#include "tensorflow/core/graph/graph.h"
#include "tensorflow/core/graph/node_builder.h"

#include "common.h"
#include "labelled.h"

namespace rdmadev_tf {

// rdmadev.optimize names the functions it wraps `<name>__rdmadev_<token>`. TF keeps that name
// in every FunctionDef it traces from them and sends it to the task that instantiates the
// function (under ParameterServerStrategy the worker running the step), and a caller's library
// lists it when the function is called from another one. So the opt-in travels with the
// function itself; tf.function refuses FunctionDef attributes outside its allowlist. One
// called while another function is traced is traced inline instead, and the name scope of its
// nodes carries the same mark (AddMarkedScope).
constexpr char kOptInMarker[] = "__rdmadev_";
extern "C" const char* rdmadev_opt_in_marker() { return kOptInMarker; }

// 0: never rewrite; 1: rewrite every function (RDMADEV_AUTO); 2: rewrite a function that is,
// or calls, one marked by rdmadev.optimize.
std::atomic<int> g_mode{0};

extern "C" void rdmadev_set_pass_mode(int mode) { g_mode.store(mode); }

namespace {

using tensorflow::Graph;
using tensorflow::Node;

struct Rewrite {
  std::string kind;    // "send" or "recv"
  std::string device;  // partition key
  std::string node;    // the _Send/_Recv node's name
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
};

std::string TaskOf(const std::string& device) {
  size_t d = device.find("/device:");
  return d == std::string::npos ? device : device.substr(0, d);
}

bool IsCrossTaskPair(const Node* n) {
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

bool IsSendOp(const Node* n) { return n->type_string() == "_Send" || n->type_string() == "_HostSend"; }
bool IsRecvOp(const Node* n) { return n->type_string() == "_Recv" || n->type_string() == "_HostRecv"; }

std::string RendezvousKey(const Node* n) {
  std::string name, from, to;
  tensorflow::TryGetNodeAttr(n->attrs(), "tensor_name", &name);
  tensorflow::TryGetNodeAttr(n->attrs(), "send_device", &from);
  tensorflow::TryGetNodeAttr(n->attrs(), "recv_device", &to);
  return name + "|" + from + "|" + to;
}

// Rounds of cross-partition propagation: a shape crosses one task boundary per round; a
// step crosses at most a few (ps -> worker -> ps), and a round costs one shape pass.
constexpr int kShapeRounds = 4;

// oneDNN's fused ops register shape functions that are wrong past output 0 (e.g.
// _MklNativeConv2DBackpropFilterWithBias gives the bias gradient the conv's input channels):
// those shapes stay unknown, and the planner gives the pair a dynamic channel. Outputs 1 and 2
// of oneDNN's batch norms are the exception: the batch statistics and the scale and offset
// gradients, [C] in TF's FusedBatchNorm(Grad) shape functions, which these ops register, and
// in their kernels. graph_pass/shapes.py, trusted_output, is the same rule.
bool TrustedOutput(const Node* n, int index) {
  const std::string& op = n->type_string();
  if (index == 0 || op.rfind("_Mkl", 0) != 0) return true;
  return (index == 1 || index == 2) && op.find("FusedBatchNorm") != std::string::npos;
}

// TF's partition graphs no longer carry shapes. Runs TF's own shape functions over every
// partition, feeding each _Recv the shape its _Send's input got on the other side, until
// nothing new is learned; then records each fully known shape as `_output_shapes` on the
// _Recv and on the _Send, which the planner takes as authoritative.
void AnnotateRecvShapes(std::unordered_map<std::string, std::unique_ptr<Graph>>* parts) {
  std::map<std::string, tensorflow::PartialTensorShape> known;
  for (int round = 0; round < kShapeRounds; ++round) {
    size_t before = known.size();
    for (auto& kv : *parts) {
      Graph* g = kv.second.get();
      tensorflow::ShapeRefiner refiner(g->versions(), g->op_registry());
      std::vector<Node*> order;
      tensorflow::GetReversePostOrder(*g, &order);
      for (Node* n : order) {
        if (!refiner.AddNode(n).ok()) continue;  // an input without a shape: skip it
        if (IsRecvOp(n)) {
          auto it = known.find(RendezvousKey(n));
          if (it == known.end()) continue;
          tensorflow::shape_inference::ShapeHandle h;
          auto* c = refiner.GetContext(n);
          if (c && c->MakeShapeFromPartialTensorShape(it->second, &h).ok()) {
            refiner.SetShape(n, 0, h).IgnoreError();
          }
        } else if (IsSendOp(n)) {
          const tensorflow::Edge* e = nullptr;
          if (!n->input_edge(0, &e).ok() || !e) continue;
          if (!TrustedOutput(e->src(), e->src_output())) continue;
          auto* c = refiner.GetContext(e->src());
          if (!c) continue;
          auto h = c->output(e->src_output());
          if (!c->FullyDefined(h)) continue;
          std::vector<int64_t> dims;
          for (int i = 0; i < c->Rank(h); ++i) dims.push_back(c->Value(c->Dim(h, i)));
          known[RendezvousKey(n)] = tensorflow::PartialTensorShape(dims);
        }
      }
    }
    if (known.size() == before) break;
  }
  // A _Send gets the shape too: when its _Recv is in no partition here (a TF1 task plans
  // only its own half), it is all the planner can know.
  for (auto& kv : *parts) {
    for (Node* n : kv.second->op_nodes()) {
      if (!IsRecvOp(n) && !IsSendOp(n)) continue;
      auto it = known.find(RendezvousKey(n));
      if (it != known.end()) {
        n->AddAttr("_output_shapes", std::vector<tensorflow::PartialTensorShape>{it->second});
      }
    }
  }
}

std::string PyErrorText() {
  PyObject *type, *value, *tb;
  PyErr_Fetch(&type, &value, &tb);
  std::string text = "unknown Python error";
  if (value) {
    PyObject* s = PyObject_Str(value);
    if (s) {
      const char* c = PyUnicode_AsUTF8(s);
      if (c) text = c;
      Py_DECREF(s);
    }
  }
  Py_XDECREF(type);
  Py_XDECREF(value);
  Py_XDECREF(tb);
  PyErr_Clear();
  return text;
}

// Calls rdmadev.tf.bridge.rewrites({device: GraphDef bytes}, function, [marked names]) with
// the GIL held.
bool CallPlanner(const std::map<std::string, std::string>& parts, const std::string& function,
                 const std::vector<std::string>& marked, std::vector<Rewrite>* out,
                 std::string* error) {
  if (!Py_IsInitialized()) {
    *error = "no Python interpreter in this process";
    return false;
  }
  PyGILState_STATE gil = PyGILState_Ensure();
  bool ok = false;
  PyObject* mod = PyImport_ImportModule("rdmadev.tf.bridge");
  PyObject* arg = PyDict_New();
  PyObject* names = PyList_New(0);
  PyObject* res = nullptr;
  if (mod && arg && names) {
    for (const auto& name : marked) {
      PyObject* v = PyUnicode_FromString(name.c_str());
      PyList_Append(names, v);
      Py_XDECREF(v);
    }
    for (const auto& kv : parts) {
      PyObject* v = PyBytes_FromStringAndSize(kv.second.data(), kv.second.size());
      PyDict_SetItemString(arg, kv.first.c_str(), v);
      Py_XDECREF(v);
    }
    res = PyObject_CallMethod(mod, "rewrites", "OsO", arg, function.c_str(), names);
  }
  if (res && PyList_Check(res)) {
    ok = true;
    for (Py_ssize_t i = 0; i < PyList_Size(res) && ok; ++i) {
      PyObject* t = PyList_GetItem(res, i);
      const char *kind, *device, *node, *channel;
      int dtype, zero_copy, owned, dead, loop;
      double timeout_s;
      PyObject* shape;
      long long max_bytes, zero_copy_min_bytes;
      if (!PyArg_ParseTuple(t, "ssssiOpLdLppp", &kind, &device, &node, &channel, &dtype, &shape,
                            &zero_copy, &zero_copy_min_bytes, &timeout_s, &max_bytes, &owned,
                            &dead, &loop)) {
        ok = false;
        break;
      }
      Rewrite r{kind, device, node, channel, dtype, {}, shape == Py_None, zero_copy != 0,
                zero_copy_min_bytes, timeout_s, max_bytes, owned != 0, dead != 0, loop != 0};
      for (Py_ssize_t j = 0; !r.unknown_rank && j < PySequence_Size(shape); ++j) {
        PyObject* d = PySequence_GetItem(shape, j);
        r.shape.push_back(PyLong_AsLongLong(d));
        Py_XDECREF(d);
      }
      out->push_back(std::move(r));
    }
  }
  if (!ok) *error = PyErr_Occurred() ? PyErrorText() : "rdmadev.tf.bridge.rewrites returned no list";
  Py_XDECREF(res);
  Py_XDECREF(names);
  Py_XDECREF(arg);
  Py_XDECREF(mod);
  PyGILState_Release(gil);
  return ok;
}

std::string Sanitized(const std::string& s) {
  std::string safe;
  for (char c : s) safe += (isalnum(static_cast<unsigned char>(c)) ? c : '_');
  return safe;
}

// Node names must be unique across every graph a TF1 worker registers (it caches stateful
// kernels by node name, per session): derive them from the channel key. A half pair's key is
// the same in every graph of a session that has that pair; its replaced node's name (unique
// in the session) keeps each graph's kernel its own.
std::string NodeName(const Rewrite& r) {
  std::string name = "rdmadev_" + r.kind + "_" + Sanitized(r.channel);
  return r.owned ? name + "_" + Sanitized(r.node) : name;
}

// The receiving half's planned shape: unknown rank unless the plan knows it.
absl::Status PlannedShape(const Rewrite& r, tensorflow::PartialTensorShape* shape) {
  if (r.unknown_rank) return absl::OkStatus();
  return tensorflow::PartialTensorShape::BuildPartialTensorShape(r.shape, shape);
}

// Writes the settings rdmadev's kernels read (send_op.cc, recv_op.cc) with `set(name, value)`: the same for an
// RdmadevSend/RdmadevRecv node and, under kSettingPrefix, for a labelled one.
template <typename Set>
absl::Status WriteSettings(const Rewrite& r, Set set) {
  if (r.kind == "recv") {
    tensorflow::PartialTensorShape shape;
    TF_RETURN_IF_ERROR(PlannedShape(r, &shape));
    set("shape", shape);
    set("zero_copy", r.zero_copy);
    set("zero_copy_min_bytes", static_cast<int64_t>(r.zero_copy ? r.zero_copy_min_bytes : 0));
  }
  set("channel", r.channel);
  set("timeout_s", static_cast<float>(r.timeout_s));
  set("max_bytes", static_cast<int64_t>(r.max_bytes));
  set("owned", r.owned);
  return absl::OkStatus();
}

// A half whose tensor may be dead keeps TF's own _Send/_Recv node, labelled for rdmadev's
// kernels (labelled.h; kernel_support.h: TF's executor runs a transfer node on a dead input and lets a
// receiving one output a dead tensor, as no custom op may). It is renamed as Apply names its
// nodes.
absl::Status ApplyLabelled(Node* n, const Rewrite& r) {
  TF_RETURN_IF_ERROR(WriteSettings(r, [n](const std::string& name, const auto& value) {
    n->AddAttr(kSettingPrefix + name, value);
  }));
  n->AddAttr("_kernel", std::string(kTransferLabel));
  n->set_name(NodeName(r));
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

absl::Status Apply(Graph* g, Node* old, const Rewrite& r) {
  if (r.dead) return ApplyLabelled(old, r);
  Node* fresh = nullptr;
  tensorflow::NodeBuilder b(NodeName(r), r.kind == "send" ? "RdmadevSend" : "RdmadevRecv");
  std::vector<const tensorflow::Edge*> in(old->in_edges().begin(), old->in_edges().end());
  std::vector<const tensorflow::Edge*> outs(old->out_edges().begin(), old->out_edges().end());
  if (r.kind == "send") {
    const tensorflow::Edge* data = nullptr;
    for (const auto* e : in) if (!e->IsControlEdge()) data = e;
    if (!data) return absl::InternalError("_Send " + old->name() + " has no data input");
    b.Input(data->src(), data->src_output());
    b.Attr("T", static_cast<tensorflow::DataType>(r.dtype));
  } else {
    b.Attr("dtype", static_cast<tensorflow::DataType>(r.dtype));
  }
  TF_RETURN_IF_ERROR(WriteSettings(r, [&b](const std::string& name, const auto& value) {
    b.Attr(name, value);
  }));
  b.Device(old->requested_device());
  TF_RETURN_IF_ERROR(b.Finalize(g, &fresh));
  fresh->set_assigned_device_name(old->assigned_device_name());
  for (const auto* e : in) if (e->IsControlEdge()) g->AddControlEdge(e->src(), fresh);
  for (const auto* e : outs) {
    if (e->IsControlEdge()) g->AddControlEdge(fresh, e->dst());
    else g->AddEdge(fresh, 0, e->dst(), e->dst_input());
  }
  g->RemoveNode(old);
  return absl::OkStatus();
}

// Function names a node calls: its op when that is a function, and every function attr
// (PartitionedCall's `f`, a While's `body`, ...).
void CalledFunctions(const std::string& op, const tensorflow::AttrSlice& attrs,
                     const tensorflow::FunctionLibraryDefinition& lib, std::vector<std::string>* out) {
  if (lib.Find(op)) out->push_back(op);
  for (const auto& kv : attrs) {
    const tensorflow::AttrValue& v = kv.second;
    if (v.has_func()) out->push_back(v.func().name());
    for (const auto& f : v.list().func()) out->push_back(f.name());
  }
}

// An optimized function called while another one is traced is traced inline, under the
// name scope `<name>__rdmadev_<token>` (api.py: a nested tf.function cannot merge_call, and
// Keras calls train_step inside its own train function): adds that scope, as it was named,
// without the `_<n>` TF appends when the scope is entered again, for a node named under it.
void AddMarkedScope(const std::string& node, std::set<std::string>* scopes) {
  size_t at = node.find(kOptInMarker);
  if (at == std::string::npos) return;
  size_t begin = node.rfind('/', at);
  begin = begin == std::string::npos ? 0 : begin + 1;
  size_t end = at + sizeof(kOptInMarker) - 1;
  while (end < node.size() && std::isxdigit(static_cast<unsigned char>(node[end]))) ++end;
  scopes->insert(node.substr(begin, end - begin));
}

// The functions rdmadev.optimize marked among `self` and every function its graph calls,
// directly or through other functions, and the marked scopes of functions traced inline.
std::vector<std::string> MarkedFunctions(const std::string& self, const Graph& graph,
                                         const tensorflow::FunctionLibraryDefinition& lib) {
  std::vector<std::string> todo, marked;
  std::set<std::string> seen{self}, scopes;
  if (self.find(kOptInMarker) != std::string::npos) marked.push_back(self);
  for (const Node* n : graph.op_nodes()) {
    CalledFunctions(n->type_string(), n->attrs(), lib, &todo);
    AddMarkedScope(n->name(), &scopes);
  }
  while (!todo.empty()) {
    std::string name = todo.back();
    todo.pop_back();
    if (!seen.insert(name).second) continue;
    if (name.find(kOptInMarker) != std::string::npos) marked.push_back(name);
    const tensorflow::FunctionDef* fdef = lib.Find(name);
    if (!fdef) continue;
    for (const auto& nd : fdef->node_def()) {
      CalledFunctions(nd.op(), tensorflow::AttrSlice(nd), lib, &todo);
      AddMarkedScope(nd.name(), &scopes);
    }
  }
  marked.insert(marked.end(), scopes.begin(), scopes.end());
  return marked;
}

// Instantiations found opted in before placement (when calls are not inlined yet), by function
// name, each with its marked functions and how many instantiations of it are under way.
std::mutex g_opted_mu;
std::map<std::string, std::pair<std::vector<std::string>, int>> g_opted;

// PRE_PLACEMENT, phase 0 (before TF lowers and inlines calls at phase 10): records a function
// that is, or calls, a marked function; the partition pass then rewrites it.
class FindOptInPass : public tensorflow::GraphOptimizationPass {
 public:
  absl::Status Run(const tensorflow::GraphOptimizationPassOptions& options) override {
    if (g_mode.load(std::memory_order_relaxed) != 2 || !options.function_def || !options.graph ||
        !options.flib_def)
      return absl::OkStatus();
    const std::string& name = options.function_def->signature().name();
    std::vector<std::string> marked = MarkedFunctions(name, **options.graph, *options.flib_def);
    if (marked.empty()) return absl::OkStatus();
    std::lock_guard<std::mutex> lock(g_opted_mu);
    auto& entry = g_opted[name];
    entry.first = std::move(marked);
    entry.second += 1;
    return absl::OkStatus();
  }
};

// Whether FindOptInPass found an instantiation of `function` opted in (leaves the record).
bool OptedIn(const std::string& function) {
  std::lock_guard<std::mutex> lock(g_opted_mu);
  return g_opted.count(function) > 0;
}

// The marked functions FindOptInPass recorded for an instantiation of `function` (none: not
// opted in); consumes the record.
std::vector<std::string> TakeOptIn(const std::string& function) {
  std::lock_guard<std::mutex> lock(g_opted_mu);
  auto it = g_opted.find(function);
  if (it == g_opted.end()) return {};
  std::vector<std::string> marked = it->second.first;
  if (--it->second.second == 0) g_opted.erase(it);
  return marked;
}

// Names the node MarkBranchExitsPass puts between a branch's value and the task it crosses to:
// the partitioner names both halves of that pair after it (`_src`, and `tensor_name`
// edge_<id>_<src>), so each half tells it is in a branch from its own partition.
// graph_pass/find_transfers.py, BRANCH_MARK, reads the same text.
constexpr char kBranchMark[] = "/rdmadev_in_branch";

// The nodes reachable from `starts` past more `opens` than `closes` nodes, following data and
// control edges (each start counts as one open; nested regions count). graph_pass's
// find_transfers._between is the same walk over partition graphs.
template <typename Opens, typename Closes>
std::unordered_set<const Node*> Between(const std::vector<const Node*>& starts, Opens opens,
                                        Closes closes) {
  std::vector<std::pair<const Node*, int>> todo;
  std::set<std::pair<int, int>> seen;
  std::unordered_set<const Node*> inside;
  for (const Node* n : starts) {
    todo.push_back({n, 1});
    seen.insert({n->id(), 1});
    inside.insert(n);
  }
  while (!todo.empty()) {
    auto [n, depth] = todo.back();
    todo.pop_back();
    for (const tensorflow::Edge* e : n->out_edges()) {
      const Node* next = e->dst();
      if (!next->IsOp()) continue;
      int d = depth + (opens(next) ? 1 : 0) - (closes(next) ? 1 : 0);
      if (d >= 1 && seen.insert({next->id(), d}).second) {
        todo.push_back({next, d});
        inside.insert(next);
      }
    }
  }
  return inside;
}

// TF's partitioner moves control-flow nodes before it splits the graph
// (graph_partition.cc, OptimizeControlFlowColocation, in AddControlFlow): a Switch to its data
// input's device, an Exit to its input's, an Enter (not of a reference) or a NextIteration to
// its first data consumer's, visiting in depth-first order. A Switch placed on the worker
// that tests a ps variable's state ends up on ps, and the edges that cross tasks are those
// after the move. Makes the same moves now, so that the marks go where the pairs will be (the
// partitioner's own pass then finds every node where it would have put it).
void ColocateControlFlowAsPartitioned(Graph* g) {
  auto move = [](Node* n) {
    const tensorflow::Edge* to = nullptr;
    if (n->IsSwitch()) {
      for (const tensorflow::Edge* e : n->in_edges()) if (e->dst_input() == 0) { to = e; break; }
      if (to) n->set_assigned_device_name(to->src()->assigned_device_name());
    } else if (n->IsExit()) {
      for (const tensorflow::Edge* e : n->in_edges()) if (!e->IsControlEdge()) { to = e; break; }
      if (to) n->set_assigned_device_name(to->src()->assigned_device_name());
    } else if ((n->IsEnter() && !tensorflow::IsRefType(n->input_type(0))) || n->IsNextIteration()) {
      for (const tensorflow::Edge* e : n->out_edges()) if (!e->IsControlEdge()) { to = e; break; }
      if (to) n->set_assigned_device_name(to->dst()->assigned_device_name());
    }
  };
  tensorflow::DFS(*g, move, {});
}

// POST_REWRITE_FOR_EXEC: the placed graph just before TF partitions it, whole, in the process
// that partitions it (the coordinator, the worker running a step, a TF1 master).
//
// A conditional (tf.cond, tf.case, lowered to Switch ... Merge) leaves the branch not taken
// dead, and the executor runs no custom op on a dead input, so an RdmadevSend there would
// never write and its receive would wait: such a pair keeps TF's _Send/_Recv, labelled for
// rdmadev's kernels (ApplyLabelled), which TF runs on a dead input too. When both halves of a
// pair are planned together the planner sees the branch (find_transfers._in_conds); a TF1 task
// plans only its own half, after its master partitioned the graph. So this pass marks, while
// the graph is still whole, every value that leaves a branch for another task: it routes the
// edge through a node named `<src>/rdmadev_in_branch` on the source's device (an Identity for a
// tensor, a NoOp for a control edge), which the partitioner then names both halves after, and
// the planner tells both halves they are `in_cond`. It first moves control-flow nodes as the
// partitioner will (ColocateControlFlowAsPartitioned).
// Switches and Merges of while loops are not conditionals (their pairs are in_loop's).
class MarkBranchExitsPass : public tensorflow::GraphOptimizationPass {
 public:
  absl::Status Run(const tensorflow::GraphOptimizationPassOptions& options) override {
    int mode = g_mode.load(std::memory_order_relaxed);
    if (mode == 0 || !options.graph || !*options.graph) return absl::OkStatus();
    Graph* g = options.graph->get();
    std::vector<const Node*> enters, switches;
    for (const Node* n : g->op_nodes()) {
      if (n->IsEnter()) enters.push_back(n);
      if (n->IsSwitch()) switches.push_back(n);
    }
    if (switches.empty()) return absl::OkStatus();  // the common case
    if (mode == 2 && !OptedIn(options.debug_filename_prefix)) return absl::OkStatus();
    ColocateControlFlowAsPartitioned(g);
    auto in_loops = Between(enters, [](const Node* n) { return n->IsEnter(); },
                            [](const Node* n) { return n->IsExit(); });
    std::vector<const Node*> conds;
    for (const Node* n : switches) if (!in_loops.count(n)) conds.push_back(n);
    auto branch = [&](const Node* n) { return !in_loops.count(n); };
    auto in_branches = Between(
        conds, [&](const Node* n) { return n->IsSwitch() && branch(n); },
        [&](const Node* n) { return n->IsMerge() && branch(n); });
    // Keyed by node id, so that the marks are named alike whatever the set's order.
    std::map<std::tuple<int, int, std::string>, std::vector<const tensorflow::Edge*>> exits;
    for (const Node* n : in_branches) {
      for (const tensorflow::Edge* e : n->out_edges()) {
        Node* dst = e->dst();
        if (!dst->IsOp() || TaskOf(dst->assigned_device_name()) == TaskOf(n->assigned_device_name()))
          continue;
        exits[{n->id(), e->src_output(), dst->assigned_device_name()}].push_back(e);
      }
    }
    for (const auto& [key, edges] : exits) {
      auto [id, output, device] = key;
      Node* src = g->FindNodeId(id);
      std::string name = g->NewName(src->name() + kBranchMark);
      Node* mark = nullptr;
      if (output == tensorflow::Graph::kControlSlot) {
        TF_RETURN_IF_ERROR(tensorflow::NodeBuilder(name, "NoOp").Finalize(g, &mark));
        g->AddControlEdge(src, mark);
      } else {
        TF_RETURN_IF_ERROR(tensorflow::NodeBuilder(name, "Identity")
                               .Input(src, output)
                               .Attr("T", tensorflow::BaseType(src->output_type(output)))
                               .Finalize(g, &mark));
      }
      mark->set_assigned_device_name(src->assigned_device_name());
      mark->set_requested_device(src->requested_device());
      for (const tensorflow::Edge* e : std::vector<const tensorflow::Edge*>(edges)) {
        Node* dst = e->dst();
        int input = e->dst_input();
        g->RemoveEdge(e);
        if (input == tensorflow::Graph::kControlSlot) g->AddControlEdge(mark, dst);
        else g->AddEdge(mark, 0, dst, input);
      }
    }
    return absl::OkStatus();
  }
};

class RdmadevPass : public tensorflow::GraphOptimizationPass {
 public:
  absl::Status Run(const tensorflow::GraphOptimizationPassOptions& options) override {
    int mode = g_mode.load(std::memory_order_relaxed);
    if (mode == 0 || !options.partition_graphs) return absl::OkStatus();
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
    if (mode == 2 && marked.empty()) return absl::OkStatus();  // not opted in
    AnnotateRecvShapes(parts);
    std::map<std::string, std::string> serialized;
    for (auto& kv : *parts) {
      tensorflow::GraphDef gd;
      kv.second->ToGraphDef(&gd);
      serialized[kv.first] = gd.SerializeAsString();
    }
    std::vector<Rewrite> rewrites;
    std::string error;
    if (!CallPlanner(serialized, options.debug_filename_prefix, marked, &rewrites, &error)) {
      // rdmadev was asked for: falling back to gRPC silently would hide the problem (a
      // wrong secret, a task started without rdmadev). Fail the instantiation with the cause.
      rdmadev::LogEvent("pass: planning failed: " + error);
      return absl::FailedPreconditionError("rdmadev could not plan this function: " + error);
    }
    std::map<Graph*, std::vector<const Node*>> in_loops;  // labelled nodes in a loop, by partition
    for (const auto& r : rewrites) {
      auto it = parts->find(r.device);
      if (it == parts->end()) return absl::InternalError("rdmadev plan names unknown partition " + r.device);
      Graph* g = it->second.get();
      Node* old = nullptr;
      for (Node* n : g->op_nodes()) if (n->name() == r.node) { old = n; break; }
      if (!old) return absl::InternalError("rdmadev plan names unknown node " + r.node + " on " + r.device);
      TF_RETURN_IF_ERROR(Apply(g, old, r));
      if (r.loop) in_loops[g].push_back(old);  // labelled in place: `old` is still the node
    }
    for (const auto& [g, nodes] : in_loops) TF_RETURN_IF_ERROR(RunIterationsInOrder(g, nodes));
    return absl::OkStatus();
  }
};

}  // namespace

REGISTER_OPTIMIZATION(tensorflow::OptimizationPassRegistry::PRE_PLACEMENT, 0, FindOptInPass);
REGISTER_OPTIMIZATION(tensorflow::OptimizationPassRegistry::POST_REWRITE_FOR_EXEC, 77,
                      MarkBranchExitsPass);
// Phase 77: after the oneDNN layout passes (POST_PARTITIONING phases 1 and 2).
REGISTER_OPTIMIZATION(tensorflow::OptimizationPassRegistry::POST_PARTITIONING, 77, RdmadevPass);

}  // namespace rdmadev_tf
