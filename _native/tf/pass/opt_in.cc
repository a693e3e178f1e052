// FindOptInPass and the opt-in it records for the partition passes (opt_in.h).
#include <atomic>
#include <cctype>
#include <cstring>
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "tensorflow/core/common_runtime/optimization_registry.h"
#include "tensorflow/core/framework/function.h"
#include "tensorflow/core/graph/graph.h"

#include "opt_in.h"

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

namespace {

std::atomic<int> g_mode{kRewriteNone};  // PassMode()

using tensorflow::Graph;
using tensorflow::Node;

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
// name scope `<name>__rdmadev_<token>` (optimized.py: a nested tf.function cannot merge_call, and
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
    if (PassMode() != kRewriteMarked || !options.function_def || !options.graph ||
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

}  // namespace

// Sets the mode named `name` ("off", "all", "marked"; opt_in.h); -1 for another name.
extern "C" int rdmadev_set_pass_mode(const char* name) {
  static constexpr std::pair<const char*, int> kModes[] = {
      {"off", kRewriteNone}, {"all", kRewriteAll}, {"marked", kRewriteMarked}};
  for (const auto& [known, mode] : kModes) {
    if (std::strcmp(name, known) == 0) {
      g_mode.store(mode);
      return 0;
    }
  }
  return -1;
}

int PassMode() { return g_mode.load(std::memory_order_relaxed); }

bool OptedIn(const std::string& function) {
  std::lock_guard<std::mutex> lock(g_opted_mu);
  return g_opted.count(function) > 0;
}

std::vector<std::string> TakeOptIn(const std::string& function) {
  std::lock_guard<std::mutex> lock(g_opted_mu);
  auto it = g_opted.find(function);
  if (it == g_opted.end()) return {};
  std::vector<std::string> marked = it->second.first;
  if (--it->second.second == 0) g_opted.erase(it);
  return marked;
}

REGISTER_OPTIMIZATION(tensorflow::OptimizationPassRegistry::PRE_PLACEMENT, 0, FindOptInPass);

}  // namespace rdmadev_tf
