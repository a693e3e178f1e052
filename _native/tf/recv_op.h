// RecvOp: the RdmadevRecv kernel (and TF's own _Recv/_HostRecv of a pair the pass labelled,
// and RdmadevRecvBundle, which outputs each tensor of a bundle's slot).
// It waits for the next transfer of its step on a channel and outputs it, aliasing the slot
// (zero-copy) or copied out of it, read from the sender's stage, or gathered from chunks;
// transfers a failed step left behind are discarded. ops.cc says which kernels own their
// channels and why. Defined in two parts: recv_op.cc, the kernel and the wait for its step's
// transfer; recv_deliver.cc, the transfer made into the output.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "tensorflow/core/framework/cancellation.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/tensor.h"
#include "tensorflow/core/framework/tensor_shape.h"

#include "kernel_support.h"
#include "trace.h"
#include "warm.h"

namespace rdmadev_tf {

using tensorflow::AsyncOpKernel;
using tensorflow::DataType;
using tensorflow::OpKernelConstruction;
using tensorflow::OpKernelContext;
using tensorflow::Tensor;
using tensorflow::TensorShape;

class RecvOp : public AsyncOpKernel {
 public:
  explicit RecvOp(OpKernelConstruction* c);
  ~RecvOp() override;
  void ComputeAsync(OpKernelContext* ctx, DoneCallback done) override;

 private:
  // One execution: waits for the next transfer of this step, discarding any that a failed
  // earlier step left behind (their step tag differs), and gives its sequence number back
  // if it ends without a transfer (cancelled, timed out), so that later steps stay in step.
  class Receive : public std::enable_shared_from_this<Receive> {
   public:
    Receive(const RecvOp* op, OpKernelContext* ctx, DoneCallback done,
            rdmadev::ChannelRegistry::Receiver r, uint32_t tag, rdmadev::Deadline deadline);
    void Start();

   private:
    // Waiting for this step's transfer (recv_op.cc).
    void Cancel();
    void Wait();
    absl::Status Park(uint64_t gen, const std::atomic<uint64_t>* word, uint64_t target,
                      rdmadev::Deadline until, rdmadev::Liveness alive,
                      std::function<void(const rdmadev::Status&)> then, std::string what);
    void WaitForASlot(uint64_t gen, uint64_t let_go, const rdmadev::Error& e);
    void LeaveForItsStep(uint32_t tag);
    bool Placed(uint32_t tag) const;
    absl::Status Superseded() const;
    absl::Status AllSlotsHeld(const rdmadev::Error& e) const;
    bool Took(const rdmadev::Status& st);
    void Finish(const tensorflow::Status& s);

    // Making it the output (recv_deliver.cc).
    tensorflow::Status ShapeOf(const rdmadev::Slot& slot, TensorShape* shape, uint64_t* bytes);
    tensorflow::Status DeliverDynamic(const rdmadev::Slot& slot);
    tensorflow::Status DeliverStaged(const rdmadev::Slot& slot);
    tensorflow::Status Gather(const rdmadev::Slot& slot);
    tensorflow::Status Deliver(const rdmadev::Slot& slot, const TensorShape& shape);
    tensorflow::Status DeliverBundle(const rdmadev::Slot& slot);
    tensorflow::Status Output(const TensorShape& shape, uint64_t bytes, char** dst);
    void CopyOut(char* dst, const uint8_t* src, uint64_t n);
    void Count(uint64_t bytes);

    const RecvOp* op_;
    OpKernelContext* ctx_;
    DoneCallback done_;
    rdmadev::ChannelRegistry::Receiver r_;
    const uint32_t tag_;
    const rdmadev::Deadline deadline_;
    tensorflow::CancellationManager* cm_;
    tensorflow::CancellationToken token_ = tensorflow::CancellationManager::kInvalidToken;
    std::mutex mu_;
    bool cancelled_ = false;
    uint64_t gen_ = 0, ticket_ = 0;
    rdmadev::RingReceiver::Reservation res_;  // the reservation being waited for
    // When the grace ends for a slot to be let go (every slot found held), and for another
    // step's transfer to be claimed by that step (LeaveForItsStep); Never(): not waiting.
    rdmadev::Deadline slot_grace_, foreign_grace_;
    // A dynamic tensor arriving in chunks: its output buffer, bytes received and due.
    bool gathering_ = false;
    char* dst_ = nullptr;
    uint64_t filled_ = 0, total_ = 0;
    TransferTrace trace_;
    int64_t wait_since_ = 0;  // when the current wait began (trace on)
    uint64_t received_ = 0, chunks_ = 0;
  };

  // One tensor of a bundle (RdmadevRecvBundle): output i, `bytes` at `offset` in the payload.
  struct BundleMember {
    DataType dtype;
    TensorShape shape;
    uint64_t offset, bytes;
  };
  absl::Status ReadBundle(OpKernelConstruction* c);

  std::string channel_;
  std::vector<BundleMember> bundle_;  // a bundle's tensors, in output order; else empty
  DataType dtype_;  // a bundle's: uint8, its payload
  tensorflow::PartialTensorShape shape_;  // what the plan knows; a dynamic channel carries the rest
  TensorShape static_shape_;              // shape_ when fully defined
  bool fully_defined_ = false;
  float timeout_s_ = 0;  // always set from the attr (the plan's deadline)
  bool zero_copy_ = false;
  int64_t zero_copy_min_bytes_ = 0;  // alias only tensors of at least this many bytes
  int64_t max_bytes_ = 0;  // the most a dynamic tensor may carry (0: no limit)
  bool owned_ = false;  // a half pair's kernel: holds its half while it lives
  const bool transfer_node_;  // TF's _Recv, labelled: may output a dead tensor
  std::shared_ptr<WarmPool> warm_;  // large copied outputs, where TF's allocator is malloc
};

}  // namespace rdmadev_tf
