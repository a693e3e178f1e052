// MarkBranchExitsPass: marks, in the whole graph before TF partitions it, every value that
// leaves a conditional's branch for another task, so that both halves of its pair know they
// are in a branch (the comment above the pass says how, and why).
#include <map>
#include <set>
#include <string>
#include <tuple>
#include <unordered_set>
#include <utility>
#include <vector>

#include "tensorflow/core/common_runtime/optimization_registry.h"
#include "tensorflow/core/graph/algorithm.h"
#include "tensorflow/core/graph/graph.h"
#include "tensorflow/core/graph/node_builder.h"

#include "opt_in.h"
#include "pairs.h"

namespace rdmadev_tf {
namespace {

using tensorflow::Graph;
using tensorflow::Node;

// The nodes reachable from `starts` past more `opens` than `closes` nodes, following data and
// control edges (each start counts as one open; nested regions count). graph_pass's
// find_transfers._between walks partition graphs alike, for the pairs whose two halves it
// plans together (also graphs this pass never saw: `rdmadev plan`'s run metadata); the halves
// planned alone it tells by kBranchMark (rules.h, read through the bindings). No test
// compares the two walks directly: tests/e2e/test_e2e.py and tests/test_between_graph.py run
// branches across tasks through both.
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
// edge through a node named `<src>` + kBranchMark (rules.h) on the source's device (an Identity for a
// tensor, a NoOp for a control edge), which the partitioner then names both halves after, and
// the planner tells both halves they are `in_cond`. It first moves control-flow nodes as the
// partitioner will (ColocateControlFlowAsPartitioned).
// Switches and Merges of while loops are not conditionals (their pairs are in_loop's).
class MarkBranchExitsPass : public tensorflow::GraphOptimizationPass {
 public:
  absl::Status Run(const tensorflow::GraphOptimizationPassOptions& options) override {
    int mode = PassMode();
    if (mode == kRewriteNone || !options.graph || !*options.graph) return absl::OkStatus();
    Graph* g = options.graph->get();
    std::vector<const Node*> enters, switches;
    for (const Node* n : g->op_nodes()) {
      if (n->IsEnter()) enters.push_back(n);
      if (n->IsSwitch()) switches.push_back(n);
    }
    if (switches.empty()) return absl::OkStatus();  // the common case
    if (mode == kRewriteMarked && !OptedIn(options.debug_filename_prefix)) return absl::OkStatus();
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

}  // namespace

REGISTER_OPTIMIZATION(tensorflow::OptimizationPassRegistry::POST_REWRITE_FOR_EXEC, 77,
                      MarkBranchExitsPass);

}  // namespace rdmadev_tf
