// RecvOp: the RdmadevRecv kernel (and TF's own _Recv/_HostRecv of a pair the pass labelled,
// and RdmadevRecvBundle, which outputs each tensor of a bundle's slot).
// It waits for the next transfer of its step on a channel and makes it the output through
// one of its delivery modes (recv_delivery.h: the slot aliased or copied out, read from the
// sender's stage, gathered from chunks, or a bundle's tensors), built once from the kernel's
// attributes; transfers a failed step left behind are discarded. ops.cc says which kernels
// own their channels and why. recv_op.cc defines the kernel and the wait.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>

#include "tensorflow/core/framework/cancellation.h"
#include "tensorflow/core/framework/op_kernel.h"

#include "kernel_support.h"
#include "recv_delivery.h"
#include "tf_path.h"

namespace rdmadev_tf {

using tensorflow::AsyncOpKernel;
using tensorflow::OpKernelConstruction;
using tensorflow::OpKernelContext;

class RecvOp : public AsyncOpKernel {
 public:
  explicit RecvOp(OpKernelConstruction* c);
  ~RecvOp() override;
  void ComputeAsync(OpKernelContext* ctx, DoneCallback done) override;

 private:
  // One execution: waits for the next transfer of this step, discarding any that a failed
  // earlier step left behind (their step tag differs), and gives its sequence number back
  // if it ends without a transfer (cancelled, timed out), so that later steps stay in step.
  // The transfer it takes goes to the kernel's delivery mode for the channel half it found.
  class Receive : public std::enable_shared_from_this<Receive> {
   public:
    Receive(const RecvOp* op, OpKernelContext* ctx, DoneCallback done,
            rdmadev::ChannelRegistry::Receiver r, uint32_t tag, rdmadev::Deadline deadline);
    void Start();

   private:
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

    const RecvOp* op_;
    OpKernelContext* ctx_;
    DoneCallback done_;
    rdmadev::ChannelRegistry::Receiver r_;
    const Delivery* delivery_;  // the kernel's mode for r_'s layout
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
    Outlet out_;                     // the output, the trace and what it counts
    std::unique_ptr<Chunks> chunks_;  // a tensor arriving in chunks: the rest of it
    int64_t wait_since_ = 0;          // when the current wait began (trace on)
  };

  std::string channel_;
  float timeout_s_ = 0;  // always set from the attr (the plan's deadline)
  bool owned_ = false;  // a half pair's kernel: holds its half while it lives
  const bool transfer_node_;  // TF's _Recv, labelled: may output a dead tensor
  TfPath tf_path_;  // a half pair kept on TF's path receives through the step's rendezvous
  std::unique_ptr<const Deliveries> deliveries_;  // built once from the attributes
};

}  // namespace rdmadev_tf
