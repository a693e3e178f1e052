// SendOp's modes (send_op.cc): what one execution sends, and how it goes onto the channel.
// One small class each, chosen once: the payload when TF builds the kernel (from its op),
// the write when an execution found its channel half (from the half's layout):
//   TensorPayload  RdmadevSend (and a labelled _Send): its one input
//   BundlePayload  RdmadevSendBundle: its inputs copied at their offsets into one buffer
//   WholeWrite     a static channel: the tensor in one slot
//   ShapedWrite    a dynamic channel: the tensor's shape in the first slot's shape block,
//                  and a tensor larger than a slot staged (stage.h) or sent in chunks
// SendOp's execution (Sending) waits for each slot's credit, and for the stage to be free,
// before it asks the write for the next slot.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/tensor.h"

#include "kernel_support.h"
#include "trace.h"

namespace rdmadev_tf {

// What one execution sends: the tensor made of the kernel's inputs.
class Payload {
 public:
  virtual ~Payload() = default;
  // From the attributes of the node `c` builds a kernel for (an RdmadevSendBundle's offsets);
  // an error names the channel and what does not fit.
  static absl::Status Build(tensorflow::OpKernelConstruction* c, const std::string& channel,
                            std::unique_ptr<const Payload>* out);
  // The tensor to send, made of ctx's inputs.
  virtual absl::Status Take(tensorflow::OpKernelContext* ctx, tensorflow::Tensor* x) const = 0;
};

// How one execution's tensor goes onto a channel half, one slot at a time. Holds the tensor
// until it is written.
class TensorWrite {
 public:
  virtual ~TensorWrite() = default;
  // The write of `x` on a channel half of `layout`: ShapedWrite on a dynamic channel (an
  // error, naming the channel, when x does not fit it or exceeds `max_bytes`, 0: no limit),
  // else WholeWrite.
  static absl::Status For(const tensorflow::Tensor& x, const rdmadev::RingLayout& layout,
                          int64_t max_bytes, const std::string& channel,
                          std::unique_ptr<TensorWrite>* out);
  // Whether the next slot goes staged: the half's stage must be free first.
  virtual bool Staging(const rdmadev::ChannelRegistry::Sender& s) const = 0;
  // Writes the next slot on `s` (its credit is there) for step `tag`; true when the tensor
  // is all written. Counts the slots it wrote in *chunks. Throws rdmadev::Error.
  virtual bool Next(const rdmadev::ChannelRegistry::Sender& s, const rdmadev::Deadline& deadline,
                    uint32_t tag, TransferTrace& trace, uint64_t* chunks) = 0;
};

}  // namespace rdmadev_tf
