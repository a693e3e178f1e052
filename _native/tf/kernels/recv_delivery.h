// RecvOp's delivery modes (recv_op.h): how a transfer's slot becomes the kernel's output. The
// kernel builds its modes once, from its attributes, when TF builds it (Deliveries); an
// execution uses the one for the layout of the channel half it found (a static channel's
// slots, or a dynamic one's, with a shape block), and calls it through one method
// (Delivery::Deliver). Each mode is a small class with its own state (recv_delivery.cc):
//   StaticDelivery      a static channel: the planned shape, the tensor in one slot
//   ShapeBlockDelivery  a dynamic channel: the shape the sender wrote in the slot's shape
//                       block, checked; then the tensor in that slot, read from the sender's
//                       stage (StagedRead), or gathered from several slots (Chunks)
//   BundleDelivery      RdmadevRecvBundle: each tensor of the slot copied into its own output
// and, for a tensor that came in one slot, how it becomes the output (recv_output.h):
//   CopiedOutput        copied out, into a warm buffer where TF's allocator is malloc (warm.h)
//   AliasedOutput       the slot itself (zero-copy) where the plan says so and a slot stays
//                       free, else copied
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <utility>

#include "tensorflow/core/framework/op_kernel.h"

#include "kernel_support.h"
#include "recv_output.h"

namespace rdmadev_tf {

// The rest of a tensor that arrives in several slots, after its first (ShapeBlockDelivery):
// its output buffer, the bytes received and the bytes due. One execution's.
class Chunks {
 public:
  Chunks(std::string channel, char* dst, uint64_t filled, uint64_t total)
      : channel_(std::move(channel)), dst_(dst), filled_(filled), total_(total) {}
  // The transfer's next slot, taken from `r`: exactly the next bytes of the tensor. Releases
  // the slot; an error ends the tensor.
  absl::Status Add(const rdmadev::Slot& slot, const rdmadev::ChannelRegistry::Receiver& r,
                   Outlet& out);
  bool done() const { return filled_ == total_; }
  uint64_t total() const { return total_; }

 private:
  const std::string channel_;
  char* const dst_;
  uint64_t filled_, total_;
};

// One delivery mode: what the wait (recv_op.cc) calls once it took a transfer's slot.
class Delivery {
 public:
  virtual ~Delivery() = default;
  // Makes `slot` the kernel's output: the first (or only) slot of a live transfer of this
  // execution's step, taken from `r`. Releases the slot unless the output aliases it. When
  // the tensor goes on in later slots, *rest gets what gathers them (else it stays empty).
  virtual absl::Status Deliver(const rdmadev::Slot& slot,
                               const rdmadev::ChannelRegistry::Receiver& r, Outlet& out,
                               std::unique_ptr<Chunks>* rest) const = 0;
};

// A kernel's delivery modes, built once from its attributes.
class Deliveries {
 public:
  // From the attributes of the node `c` builds a kernel for: an RdmadevRecv, one of TF's
  // _Recv/_HostRecv labelled by the pass (labelled.h), or an RdmadevRecvBundle. An error
  // names the channel and what does not fit.
  static absl::Status Build(tensorflow::OpKernelConstruction* c, const std::string& channel,
                            std::unique_ptr<const Deliveries>* out);
  // The mode for a channel half of `layout`: a bundle's; else the shape block's on a dynamic
  // channel, the static one's on a static channel.
  const Delivery& For(const rdmadev::RingLayout& layout) const;

 private:
  std::unique_ptr<const Delivery> bundle_, static_, shape_block_;
};

}  // namespace rdmadev_tf
