// The shapes and bounds of each pair's tensor (shapes.h), for the partition pass and, through
// rdmadev_annotate_partitions, for `rdmadev plan`.
#include "shapes.h"

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "tensorflow/core/common_runtime/graph_constructor.h"
#include "tensorflow/core/common_runtime/shape_refiner.h"
#include "tensorflow/core/framework/function.h"
#include "tensorflow/core/framework/graph.pb.h"
#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/shape_inference.h"
#include "tensorflow/core/graph/algorithm.h"

#include "pairs.h"

namespace rdmadev_tf {
namespace {

using tensorflow::Graph;
using tensorflow::Node;
using tensorflow::shape_inference::InferenceContext;
using tensorflow::shape_inference::ShapeHandle;
using Dims = std::vector<int64_t>;
using Shapes = std::map<std::string, Dims>;  // rendezvous key -> every dim known
using Partitions = std::unordered_map<std::string, std::unique_ptr<Graph>>;

// Rounds of cross-partition propagation: a shape crosses one task boundary per round; a
// step crosses at most a few (ps -> worker -> ps), and a round costs one shape pass.
constexpr int kShapeRounds = 4;

bool FullDims(InferenceContext* c, ShapeHandle h, Dims* dims) {
  if (!c->FullyDefined(h)) return false;
  dims->clear();
  for (int i = 0; i < c->Rank(h); ++i) dims->push_back(c->Value(c->Dim(h, i)));
  return true;
}

// The elements of a tensor of `dims` in `n`; false when that passes int64 (no bound then).
bool Elements(const Dims& dims, int64_t* n) {
  *n = 1;
  for (int64_t d : dims) {
    if (__builtin_mul_overflow(*n, d, n)) return false;
  }
  return true;
}

// Bounds of the outputs of the ops whose output size depends on their inputs' values (TF's
// shape functions leave that dim unknown), from the fully known shape `x` of input 0 (and,
// for DynamicPartition, of input 1): true with `dims` set for the outputs each bounds. Each
// holds for every value: unique ids, the indices of true elements, a partition's rows and the
// elements of a set difference are at most their input's.
using BoundFn = bool (*)(InferenceContext* c, int index, const Dims& x, Dims* dims);

bool BoundOfUnique(InferenceContext*, int index, const Dims& x, Dims* dims) {
  // y of a 1-D x (UniqueWithCounts: output 2, count, too): at most x's length. idx (output 1)
  // has x's shape, which TF's function already says.
  if (x.size() != 1 || index == 1) return false;
  *dims = x;
  return true;
}

bool BoundOfListDiff(InferenceContext*, int index, const Dims& x, Dims* dims) {
  if (x.size() != 1 || index > 1) return false;  // out and idx: at most x's elements
  *dims = x;
  return true;
}

bool BoundOfUniqueV2(InferenceContext*, int index, const Dims& x, Dims* dims) {
  // y: x with the unique axis at most as long as x's; count: at most x's longest dim.
  if (index == 0) *dims = x;
  else if (index == 2 && !x.empty()) *dims = {*std::max_element(x.begin(), x.end())};
  else return false;
  return true;
}

bool BoundOfWhere(InferenceContext*, int, const Dims& x, Dims* dims) {
  int64_t rows = 0;  // one row of coordinates per true element
  if (!Elements(x, &rows)) return false;
  *dims = {rows, static_cast<int64_t>(x.size())};
  return true;
}

bool BoundOfDynamicPartition(InferenceContext* c, int, const Dims& x, Dims* dims) {
  Dims partitions;  // each part: at most every row of data
  int64_t rows = 0;
  if (c->num_inputs() < 2 || !FullDims(c, c->input(1), &partitions) || partitions.size() > x.size() ||
      !Elements(partitions, &rows))
    return false;
  *dims = {rows};
  dims->insert(dims->end(), x.begin() + partitions.size(), x.end());
  return true;
}

// The value-sized ops this file bounds: where a function has none, no pair of it can get a
// bound.
const std::map<std::string, BoundFn>& ValueSizedOps() {
  static const std::map<std::string, BoundFn> ops{
      {"Unique", BoundOfUnique}, {"UniqueWithCounts", BoundOfUnique}, {"ListDiff", BoundOfListDiff},
      {"UniqueV2", BoundOfUniqueV2}, {"UniqueWithCountsV2", BoundOfUniqueV2}, {"Where", BoundOfWhere},
      {"DynamicPartition", BoundOfDynamicPartition}};
  return ops;
}

bool ValueSized(const Node* n) { return ValueSizedOps().count(n->type_string()) > 0; }

// A bound on output `index` of `n` from its inputs' shapes; false for every op ValueSizedOps
// does not list, and for the outputs it does not bound.
bool BoundOfValueSizedOutput(const Node* n, InferenceContext* c, int index, Dims* dims) {
  auto it = ValueSizedOps().find(n->type_string());
  Dims x;
  return it != ValueSizedOps().end() && c->num_inputs() > 0 && FullDims(c, c->input(0), &x) &&
         it->second(c, index, x, dims);
}

// One run of TF's shape functions over `g`: each _Recv takes the shape `fed` has for its pair
// and, with `bounded`, each value-sized output its bound. Adds to `sent` the fully known shape
// of each _Send's tensor.
void Refine(Graph* g, const Shapes& fed, bool bounded, Shapes* sent) {
  tensorflow::ShapeRefiner refiner(g->versions(), g->op_registry());
  std::vector<Node*> order;
  tensorflow::GetReversePostOrder(*g, &order);
  for (Node* n : order) {
    if (!refiner.AddNode(n).ok()) continue;  // an input without a shape: skip it
    InferenceContext* c = refiner.GetContext(n);
    if (!c) continue;
    if (IsSendOp(n)) {
      const tensorflow::Edge* e = nullptr;
      if (!n->input_edge(0, &e).ok() || !e || !TrustedOutput(e->src()->type_string(), e->src_output())) continue;
      InferenceContext* src = refiner.GetContext(e->src());
      Dims dims;
      if (src && FullDims(src, src->output(e->src_output()), &dims)) sent->emplace(RendezvousKey(n), dims);
      continue;
    }
    for (int i = 0; i < c->num_outputs(); ++i) {
      Dims dims;
      if (IsRecvOp(n)) {
        auto it = fed.find(RendezvousKey(n));
        if (it == fed.end()) break;
        dims = it->second;
      } else if (!bounded || c->FullyDefined(c->output(i)) || !BoundOfValueSizedOutput(n, c, i, &dims)) {
        continue;
      }
      ShapeHandle h;
      if (c->MakeShapeFromPartialTensorShape(tensorflow::PartialTensorShape(dims), &h).ok())
        refiner.SetShape(n, i, h).IgnoreError();  // merged with what TF knew; a conflict is skipped
    }
  }
}

// Refine over every partition, round after round until no pair's shape is learned; starts
// from `known` (what is known stays).
Shapes Propagate(Partitions* parts, Shapes known, bool bounded) {
  for (int round = 0; round < kShapeRounds; ++round) {
    size_t before = known.size();
    for (auto& kv : *parts) {
      Shapes sent;
      Refine(kv.second.get(), known, bounded, &sent);
      known.insert(sent.begin(), sent.end());
    }
    if (known.size() == before) break;
  }
  return known;
}

void SetShapeAttr(Node* n, const char* attr, const Dims& dims) {
  n->AddAttr(attr, std::vector<tensorflow::PartialTensorShape>{tensorflow::PartialTensorShape(dims)});
}

// The shapes TF proves for the pairs of `parts` and, for the others, their bounds.
void PairShapes(Partitions* parts, Shapes* exact, Shapes* bounds) {
  *exact = Propagate(parts, {}, false);
  // Bounds cost a second propagation: only when a pair needs one and an op can give one (a
  // CNN's unknown shapes are oneDNN's untrusted outputs, which nothing bounds).
  bool unknown = false, seeded = false;
  for (auto& kv : *parts) {
    for (Node* n : kv.second->op_nodes()) {
      if ((IsSendOp(n) || IsRecvOp(n)) && !exact->count(RendezvousKey(n))) unknown = true;
      seeded = seeded || ValueSized(n);
    }
  }
  *bounds = unknown && seeded ? Propagate(parts, *exact, true) : Shapes{};
  for (const auto& kv : *exact) bounds->erase(kv.first);
}

}  // namespace

void AnnotatePairShapes(Partitions* parts) {
  Shapes exact, bounds;
  PairShapes(parts, &exact, &bounds);
  // Both halves get them: a TF1 task plans only its own half, and sizes the pair from it.
  for (auto& kv : *parts) {
    for (Node* n : kv.second->op_nodes()) {
      if (!IsSendOp(n) && !IsRecvOp(n)) continue;
      std::string key = RendezvousKey(n);
      if (auto it = exact.find(key); it != exact.end()) SetShapeAttr(n, "_output_shapes", it->second);
      else if (auto b = bounds.find(key); b != bounds.end()) SetShapeAttr(n, kBoundAttr, b->second);
    }
  }
}

// The same shapes and bounds for the partitions of one function, read from `in`: the
// serialized GraphDefs, each preceded by its byte length as a little-endian u64. Returns 0 and
// sets `out` to one line per pair, "<tensor_name>|<send_device>|<recv_device>\t<attr>\t<dims,
// comma-separated>", with the attr a pass would write on both its halves; a partition TF
// cannot build into a graph here (an op not registered in this process) adds nothing, its
// pairs still get what the others say. On bad input returns 1 and sets `out` to the reason.
int AnnotatePartitions(const char* in, uint64_t in_len, std::string* out) {
  Partitions parts;
  const char* at = in;
  const char* end = in + in_len;
  for (int index = 0; at < end; ++index) {
    uint64_t len = 0;
    if (end - at < static_cast<ptrdiff_t>(sizeof len)) return *out = "the input ends inside a length", 1;
    std::memcpy(&len, at, sizeof len);
    at += sizeof len;
    tensorflow::GraphDef gd;
    if (static_cast<uint64_t>(end - at) < len || len > INT32_MAX ||
        !gd.ParseFromArray(at, static_cast<int>(len)))
      return *out = "partition " + std::to_string(index) + " is not a serialized GraphDef", 1;
    at += len;
    tensorflow::FunctionLibraryDefinition flib(tensorflow::OpRegistry::Global(), gd.library());
    auto g = std::make_unique<Graph>(flib);
    tensorflow::GraphConstructorOptions opts;
    opts.allow_internal_ops = true;  // _Send, _Recv, _Arg
    if (tensorflow::ConvertGraphDefToGraph(opts, std::move(gd), g.get()).ok())
      parts.emplace(std::to_string(index), std::move(g));
  }
  Shapes exact, bounds;
  PairShapes(&parts, &exact, &bounds);
  out->clear();
  for (const auto& [attr, shapes] : {std::pair<const char*, const Shapes*>{"_output_shapes", &exact},
                                     {kBoundAttr, &bounds}}) {
    for (const auto& [key, dims] : *shapes) {
      *out += key + "\t" + attr + "\t";
      for (size_t i = 0; i < dims.size(); ++i) *out += (i ? "," : "") + std::to_string(dims[i]);
      *out += "\n";
    }
  }
  return 0;
}

}  // namespace rdmadev_tf

// For `rdmadev plan` (rdmadev/tools/tf_shapes.py): AnnotatePartitions, its text in *out, which is
// malloc'd (free it with rdmadev_free); nonzero when `in` was refused (or memory ran out: then
// *out is null).
extern "C" int rdmadev_annotate_partitions(const char* in, uint64_t in_len, char** out) {
  std::string text;
  int rc = rdmadev_tf::AnnotatePartitions(in, in_len, &text);
  *out = static_cast<char*>(std::malloc(text.size() + 1));
  if (!*out) return 1;
  std::memcpy(*out, text.c_str(), text.size() + 1);
  return rc;
}

extern "C" void rdmadev_free(char* p) { std::free(p); }
