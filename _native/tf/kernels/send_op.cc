// The RdmadevSend kernel (and TF's own _Send/_HostSend of a pair the pass labelled, and
// RdmadevSendBundle, whose tensors it copies into one buffer first): writes a tensor into the
// peer's slot with a one-sided write, staged or in chunks when a dynamic channel's tensor is
// larger than a slot (its modes: send_write.h), waiting for credits on the domain's progress
// thread. ops.cc says which kernels own their channels and why.
#include <atomic>
#include <memory>
#include <string>

#include "tensorflow/core/framework/cancellation.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/tensor.h"

#include "kernel_support.h"
#include "send_write.h"
#include "tf_path.h"
#include "trace.h"

namespace rdmadev_tf {

using tensorflow::AsyncOpKernel;
using tensorflow::OpKernelConstruction;
using tensorflow::OpKernelContext;
using tensorflow::Tensor;
using tensorflow::TensorShape;

namespace {

// Ends a pending progress wait when TF cancels the step (a failed peer kernel, a closed
// session): the wait completes with kClosed, which becomes a Cancelled status. The callback is
// registered before the wait is submitted, and nothing touches the CancellationManager after
// Submit: the wait may complete, and the step free its manager, before Submit returns.
class WaitCancel : public std::enable_shared_from_this<WaitCancel> {
 public:
  WaitCancel(tensorflow::CancellationManager* cm, std::shared_ptr<rdmadev::Domain> domain)
      : cm_(cm), domain_(std::move(domain)) {}

  // Registers with TF. False when the step is cancelled already: do not submit the wait.
  bool Arm() {
    if (!cm_) return true;
    token_ = cm_->get_cancellation_token();
    auto self = shared_from_this();
    armed_ = cm_->RegisterCallback(token_, [self] {
      self->cancelled_.store(true);
      uint64_t ticket = self->ticket_.load();
      if (ticket) self->domain_->progress().Cancel(ticket);
    });
    return armed_;
  }

  // After Submit returned `ticket` (tickets start at 1); a cancellation that came first
  // cancels it now. Touches only this object and the domain.
  void Submitted(uint64_t ticket) {
    ticket_.store(ticket);
    if (cancelled_.load()) domain_->progress().Cancel(ticket);
  }

  // In the wait's completion, before done(): the manager is still alive there.
  void Disarm() {
    if (armed_) cm_->TryDeregisterCallback(token_);
  }

 private:
  tensorflow::CancellationManager* cm_;
  std::shared_ptr<rdmadev::Domain> domain_;
  tensorflow::CancellationToken token_ = tensorflow::CancellationManager::kInvalidToken;
  bool armed_ = false;
  std::atomic<bool> cancelled_{false};
  std::atomic<uint64_t> ticket_{0};
};

class SendOp : public AsyncOpKernel {
 public:
  explicit SendOp(OpKernelConstruction* c) : AsyncOpKernel(c), tf_path_(c) {
    OP_REQUIRES_OK(c, c->GetAttr(Setting(c, "channel"), &channel_));
    OP_REQUIRES_OK(c, c->GetAttr(Setting(c, "timeout_s"), &timeout_s_));
    OP_REQUIRES_OK(c, c->GetAttr(Setting(c, "max_bytes"), &max_bytes_));
    OP_REQUIRES_OK(c, c->GetAttr(Setting(c, "owned"), &owned_));
    OP_REQUIRES_OK(c, Payload::Build(c, channel_, &payload_));
    if (owned_) rdmadev::ChannelRegistry::Global().Hold(channel_, rdmadev::ChannelRegistry::kSend);
  }
  ~SendOp() override {
    if (owned_) rdmadev::ChannelRegistry::Global().LetGo(channel_, rdmadev::ChannelRegistry::kSend);
  }

  void ComputeAsync(OpKernelContext* ctx, DoneCallback done) override {
    Tensor x;
    OP_REQUIRES_OK_ASYNC(ctx, payload_->Take(ctx, &x), done);
    // Only a transfer node runs with a dead input (kTransferLabel): it sends the deadness.
    const bool dead = ctx->is_input_dead();
    OP_REQUIRES_ASYNC(ctx, dead || tensorflow::DataTypeCanUseMemcpy(x.dtype()),
                      tensorflow::errors::InvalidArgument(
                          "rdmadev channel ", channel_, " cannot carry ",
                          tensorflow::DataTypeString(x.dtype()), " (not a plain-bytes dtype)"),
                      done);
    rdmadev::Deadline deadline = rdmadev::Deadline::After(timeout_s_);
    rdmadev::ChannelRegistry::Sender s, moving_from;
    try {
      s = rdmadev::ChannelRegistry::Global().FindSender(channel_, deadline, &moving_from,
                                                        StepCancelled(ctx));
    } catch (const rdmadev::Error& e) {
      FailedSteps::Global().Add(StepTagOf(ctx));
      ctx->SetStatus(ToStatus(e));
      done();
      return;
    }
    if (!s.ring) {  // a half pair kept on TF's path (registry.h KeepOnTf)
      tf_path_.Send(ctx);
      done();
      return;
    }
    std::unique_ptr<TensorWrite> write;  // holds the tensor until it is written
    if (!dead) {
      OP_REQUIRES_OK_ASYNC(ctx, TensorWrite::For(x, s.ring->layout(), max_bytes_, channel_, &write),
                           done);
    }
    // What the trace says moved: the tensors' bytes (a bundle's without the gaps between them).
    uint64_t carried = 0;
    for (int i = 0; i < ctx->num_inputs(); ++i) carried += ctx->input(i).tensor_data().size();
    std::make_shared<Sending>(ctx, std::move(write), std::move(s), std::move(moving_from),
                              deadline, std::move(done), StepTagOf(ctx), channel_, carried)
        ->Next();
  }

 private:
  // One execution: writes the tensor as its write mode says (send_write.h), slot by slot,
  // each as soon as the receiver has given a slot back, or a dead transfer when the input is
  // dead. Credits are waited for on the progress thread. When the channel moves to a larger
  // ring (growth), the marker goes on the old ring first.
  class Sending : public std::enable_shared_from_this<Sending> {
   public:
    // `write` is null for a dead input.
    Sending(OpKernelContext* ctx, std::unique_ptr<TensorWrite> write,
            rdmadev::ChannelRegistry::Sender s, rdmadev::ChannelRegistry::Sender moving_from,
            rdmadev::Deadline deadline, DoneCallback done, uint32_t tag,
            const std::string& channel, uint64_t carried)
        : ctx_(ctx), write_(std::move(write)), s_(std::move(s)), from_(std::move(moving_from)),
          deadline_(deadline), done_(std::move(done)), tag_(tag), channel_(channel),
          carried_(carried) {
      trace_.Begin();
    }

    void Next() {
      for (;;) {
        const auto& half = from_.ring ? from_ : s_;  // the marker's ring first
        const auto& ring = half.ring;
        auto need = ring->CreditNeeded();
        if (need.second != 0 && need.first->load(std::memory_order_acquire) < need.second) {
          WaitForCredit(ring, need.first, need.second);
          return;
        }
        // A stage is free once the credit covers the transfer that named it (the receiver
        // reads it before releasing that slot): before it is written again, and before the
        // marker lets the old half, and with it its stage, go.
        if ((from_.ring || (write_ && write_->Staging(s_))) && half.stage) {
          const uint64_t busy = half.stage->busy();
          if (need.first->load(std::memory_order_acquire) < busy) {
            WaitForCredit(ring, need.first, busy);
            return;
          }
        }
        try {
          if (from_.ring) {
            from_.ring->SendMoved(deadline_);
            from_ = {};
            rdmadev::ChannelRegistry::Global().Moved(channel_);  // the old sending half goes
            continue;
          }
          if (!write_) {  // the input is dead: the transfer says so, and carries nothing
            s_.ring->SendDead(deadline_, tag_);
            Done();
            return;
          }
          if (write_->Next(s_, deadline_, tag_, trace_, &chunks_)) {
            Done();
            return;
          }
        } catch (const rdmadev::Error& e) {
          ctx_->SetStatus(SendStatus(e));
          Done();
          return;
        }
      }
    }

   private:
    void Done() {
      trace_.End("rdmadev.send", channel_, s_.peer, carried_, chunks_);
      if (!ctx_->status().ok()) FailedSteps::Global().Add(tag_);
      done_();
    }

    void WaitForCredit(const std::shared_ptr<rdmadev::RingSender>& ring,
                       const std::atomic<uint64_t>* word, uint64_t target) {
      auto cancel = std::make_shared<WaitCancel>(ctx_->cancellation_manager(), s_.domain);
      if (!cancel->Arm()) {
        ctx_->SetStatus(tensorflow::errors::Cancelled("step cancelled before channel ", channel_, " sent"));
        Done();
        return;
      }
      auto self = shared_from_this();
      credit_since_ = trace_.Mark();
      try {
        uint64_t ticket = s_.domain->progress().Submit(
            word, target, deadline_, AliveOf(ring, s_.peer),
            [self, cancel, ring](const rdmadev::Status& st, uint64_t) {
              cancel->Disarm();
              self->trace_.Phase("rdmadev.wait_credit", self->credit_since_);
              if (!st.ok) {
                self->ctx_->SetStatus(WaitStatus(st, *ring, self->channel_));
                self->Done();
                return;
              }
              self->Next();
            },
            nullptr, "a free slot (credit) on channel " + channel_ +
                         " (the receiver still holds every slot: a zero-copy tensor kept alive, or two "
                         "calls of this function overlapping?)");
        cancel->Submitted(ticket);
      } catch (const rdmadev::Error& e) {
        cancel->Disarm();
        ctx_->SetStatus(SendStatus(e));
        Done();
      }
    }

    // The status of a failed write: one whose receiving task went or whose connection to it
    // broke names that task (the fabric knows only its address) and what happens next.
    absl::Status SendStatus(const rdmadev::Error& e) const {
      if (e.kind() != rdmadev::ErrorKind::kPeerLost || s_.peer.empty()) return ToStatus(e);
      return ToStatus(e.kind(), "rdmadev channel " + channel_ + " to task " + s_.peer + ": " +
                                    e.what() + ". Fix: the task died, or the connection to it "
                                    "broke: if it still runs, the channels between the two "
                                    "tasks are set up again and the next steps run on them");
    }

    OpKernelContext* ctx_;
    const std::unique_ptr<TensorWrite> write_;  // null: the input is dead
    rdmadev::ChannelRegistry::Sender s_;
    rdmadev::ChannelRegistry::Sender from_;  // the ring to write the marker on (growth), else empty
    const rdmadev::Deadline deadline_;
    DoneCallback done_;
    const uint32_t tag_;
    const std::string channel_;
    const uint64_t carried_;  // the tensors' bytes, for the trace
    TransferTrace trace_;
    int64_t credit_since_ = 0;  // when the current credit wait began (trace on)
    uint64_t chunks_ = 0;
  };

  std::string channel_;
  float timeout_s_ = 0;  // always set from the attr (the plan's deadline)
  int64_t max_bytes_ = 0;
  bool owned_ = false;  // a half pair's kernel: holds its half while it lives
  std::unique_ptr<const Payload> payload_;  // its input, or a bundle's inputs in one buffer
  TfPath tf_path_;  // a half pair kept on TF's path sends through the step's rendezvous
};

REGISTER_KERNEL_BUILDER(Name("RdmadevSendBundle").Device(tensorflow::DEVICE_CPU), SendOp);
REGISTER_KERNEL_BUILDER(Name("RdmadevSend").Device(tensorflow::DEVICE_CPU), SendOp);
REGISTER_KERNEL_BUILDER(Name("_Send").Device(tensorflow::DEVICE_CPU).Label(kTransferLabel), SendOp);
REGISTER_KERNEL_BUILDER(Name("_HostSend").Device(tensorflow::DEVICE_CPU).Label(kTransferLabel), SendOp);

}  // namespace
}  // namespace rdmadev_tf
