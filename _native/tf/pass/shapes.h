// What TF's own shape functions say about the tensor of each _Send/_Recv pair of a function's
// partitions, written on both halves for the planner (graph_pass/shapes.py reads them):
//
//   _output_shapes   the shape TF proves, when every dim is known: the exact size of a static
//                    channel;
//   kBoundAttr       for a tensor TF knows only at run time, a bound on every dim, when one
//                    follows from the shapes of the values it is computed from: the slots its
//                    dynamic channel starts with where it is below RDMADEV_DYNAMIC_CAPACITY
//                    (graph_pass/policy.py).
//
// Bounds start at the ops whose output size depends on their inputs' values, sized by their
// inputs (tf.unique's ids by its input's length, tf.where's indices by its input's elements,
// tf.dynamic_partition's parts by its data, tf.setdiff1d's by its x: ValueSizedOps
// in shapes.cc) and go on through every other op with TF's own shape functions, as the exact
// shapes do, across partitions too (ids bounded on a worker bound the rows gathered on the
// ps). A bound sizes slots only: a larger tensor still moves (staged or in chunks) and the
// channel grows, so a bound is never a limit on what a step may send. That matters, as TF's
// shape arithmetic is not monotone: a size computed by subtracting a bounded one
// (4096 - tf.size(ids)) comes out too small.
#pragma once

#include <memory>
#include <string>
#include <unordered_map>

#include "tensorflow/core/graph/graph.h"

#include "rules.h"  // kBoundAttr: the attr a pair's halves get for a bound

namespace rdmadev_tf {

// Annotates every _Send and _Recv of `parts` (the partitions of one function, by device) with
// `_output_shapes` and `_rdmadev_bound` as above.
void AnnotatePairShapes(std::unordered_map<std::string, std::unique_ptr<tensorflow::Graph>>* parts);

}  // namespace rdmadev_tf
