// How the tensor of one slot becomes RecvOp's output 0 (recv_delivery.h's modes use these):
// copied out (CopiedOutput), or the slot itself (AliasedOutput); and Outlet, what every
// delivery mode writes to in one execution.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <utility>

#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/tensor_shape.h"

#include "kernel_support.h"
#include "trace.h"
#include "warm.h"

namespace rdmadev_tf {

// What a delivery mode writes to in one execution: the kernel's outputs, and the trace of
// the execution with the bytes and slots it delivered.
class Outlet {
 public:
  Outlet(tensorflow::OpKernelContext* ctx, uint32_t tag, rdmadev::Deadline deadline)
      : ctx_(ctx), tag_(tag), deadline_(deadline) {}

  tensorflow::OpKernelContext* ctx() const { return ctx_; }
  uint32_t tag() const { return tag_; }  // the execution's step tag (0: not compared)
  const rdmadev::Deadline& deadline() const { return deadline_; }
  TransferTrace& trace() { return trace_; }

  // Copies a slot's payload into the output, timed for the trace.
  void CopyOut(char* dst, const uint8_t* src, uint64_t n);
  // For the trace: a slot's bytes (or a staged tensor's) delivered into the output.
  void Count(uint64_t bytes) {
    received_ += bytes;
    ++chunks_;
  }
  uint64_t received() const { return received_; }
  uint64_t chunks() const { return chunks_; }

 private:
  tensorflow::OpKernelContext* ctx_;
  const uint32_t tag_;
  const rdmadev::Deadline deadline_;
  TransferTrace trace_;
  uint64_t received_ = 0, chunks_ = 0;
};

// Gives a delivered (or refused) slot of `r` back to the sender.
inline void ReleaseSlot(const rdmadev::ChannelRegistry::Receiver& r, uint64_t seq) {
  r.ring->Release(seq, rdmadev::Deadline::After(60));
}

// How the tensor of one slot becomes output 0, once its shape and size are known.
class SlotOutput {
 public:
  virtual ~SlotOutput() = default;
  // Outputs the slot's payload, `bytes` (all of it), as a tensor of `shape`; releases the
  // slot unless the output aliases it.
  virtual absl::Status Put(const rdmadev::Slot& slot, const tensorflow::TensorShape& shape,
                           uint64_t bytes, const rdmadev::ChannelRegistry::Receiver& r,
                           Outlet& out) const = 0;
};

// Copied out of the slot, into a warm buffer (warm.h) from kWarmMinBytes on where the kernel
// keeps them (TF's allocator is malloc), else into TF's memory.
class CopiedOutput : public SlotOutput {
 public:
  CopiedOutput(tensorflow::OpKernelConstruction* c, tensorflow::DataType dtype,
               std::string channel);
  absl::Status Put(const rdmadev::Slot& slot, const tensorflow::TensorShape& shape,
                   uint64_t bytes, const rdmadev::ChannelRegistry::Receiver& r,
                   Outlet& out) const override;
  // Output 0 of `shape`, `bytes` at *dst, for the caller to fill.
  absl::Status Allocate(const tensorflow::TensorShape& shape, uint64_t bytes, Outlet& out,
                        char** dst) const;

 private:
  const tensorflow::DataType dtype_;
  const std::string channel_;
  std::shared_ptr<WarmPool> warm_;  // large copied outputs, where TF's allocator is malloc
};

// The slot itself as the output (zero-copy), for a channel the plan marked zero_copy.
//
// Aliasing is the planner's decision: credits return in order, so a received tensor that
// stays alive (returned, stored, forwarded into a variable) stops the sender K transfers
// later, and only the planner can tell that every consumer is done with it within the step.
// Its size threshold (the plan's zero_copy_min_bytes) applies here, where a dynamic
// channel's size is known, and one run-time guard: alias only while another slot stays
// free. A ring of one slot (a static channel, one tensor per step) aliases anyway: its
// sender writes the next step's tensor only after TF has freed this one, which happens
// within this step. Below the threshold, or without a free slot, the tensor is copied.
class AliasedOutput : public SlotOutput {
 public:
  AliasedOutput(tensorflow::DataType dtype, int64_t min_bytes,
                std::shared_ptr<const CopiedOutput> copied)
      : dtype_(dtype), min_bytes_(min_bytes), copied_(std::move(copied)) {}
  absl::Status Put(const rdmadev::Slot& slot, const tensorflow::TensorShape& shape,
                   uint64_t bytes, const rdmadev::ChannelRegistry::Receiver& r,
                   Outlet& out) const override;

 private:
  const tensorflow::DataType dtype_;
  const int64_t min_bytes_;
  const std::shared_ptr<const CopiedOutput> copied_;
};

}  // namespace rdmadev_tf
