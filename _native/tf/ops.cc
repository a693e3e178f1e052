// rdmadev's TensorFlow ops: RdmadevSend (one-sided write of a tensor into the peer's slot)
// and RdmadevRecv (waits for the slot's sequence word; its output may alias the slot).
// Both are AsyncOpKernels completed by the domain's progress thread, so a waiting op never
// holds an inter-op thread (TF's pool has only as many threads as cores here).
//
// Kernels do not own their channels: TF destroys and re-creates the kernels of a function it
// still runs (measured: on every task when a ParameterServerStrategy worker fails and the
// coordinator resets the cluster), so a channel unbound with its last kernel broke the next
// step. Channels are released by the process that planned them once TF dropped the function
// (rdmadev.cluster.instances), when their peer task dies, or with their task. Kernels keep
// no reference to a channel between executions, so an unbound channel is freed at once.
#include <atomic>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>

#include "tensorflow/core/framework/cancellation.h"
#include "tensorflow/core/framework/common_shape_fns.h"
#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/shape_inference.h"
#include "tensorflow/core/framework/tensor.h"

#include "registry.h"
#include "tf_status.h"

namespace rdmadev_tf {

using tensorflow::AsyncOpKernel;
using tensorflow::DataType;
using tensorflow::OpKernelConstruction;
using tensorflow::OpKernelContext;
using tensorflow::Tensor;
using tensorflow::TensorShape;

REGISTER_OP("RdmadevSend")
    .Input("x: T")
    .Attr("T: type")
    .Attr("channel: string")
    .Attr("timeout_s: float")
    .SetIsStateful()
    .SetShapeFn(tensorflow::shape_inference::NoOutputs)
    .Doc("Writes x into the next slot of rdmadev channel `channel` (one-sided).");

REGISTER_OP("RdmadevRecv")
    .Output("y: dtype")
    .Attr("dtype: type")
    .Attr("shape: shape")
    .Attr("channel: string")
    .Attr("timeout_s: float")
    .Attr("zero_copy: bool = false")
    .SetIsStateful()
    .SetShapeFn([](tensorflow::shape_inference::InferenceContext* c) {
      tensorflow::PartialTensorShape shape;
      TF_RETURN_IF_ERROR(c->GetAttr("shape", &shape));
      tensorflow::shape_inference::ShapeHandle out;
      TF_RETURN_IF_ERROR(c->MakeShapeFromPartialTensorShape(shape, &out));
      c->set_output(0, out);
      return absl::OkStatus();
    })
    .Doc("Waits for the next transfer on rdmadev channel `channel` and outputs it.");

namespace {

// Whether the peer task `peer` of a wait is still there; the reason names it.
rdmadev::Liveness AliveOf(const std::shared_ptr<rdmadev::Endpoint>& ep, const std::string& peer) {
  return [ep, peer](std::string* why) {
    if (ep->Alive(why)) return true;
    if (!peer.empty()) *why = "task " + peer + ": " + *why;
    return false;
  };
}

// The step tag of this execution (channel.h): from TF's step id, which the tasks of one
// multi-task step share.
uint32_t StepTagOf(OpKernelContext* ctx) {
  return rdmadev::StepTag(static_cast<uint64_t>(ctx->step_id()));
}

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
  explicit SendOp(OpKernelConstruction* c) : AsyncOpKernel(c) {
    OP_REQUIRES_OK(c, c->GetAttr("channel", &channel_));
    OP_REQUIRES_OK(c, c->GetAttr("timeout_s", &timeout_s_));
  }

  void ComputeAsync(OpKernelContext* ctx, DoneCallback done) override {
    const Tensor x = ctx->input(0);  // holds a reference until the write is done
    OP_REQUIRES_ASYNC(ctx, tensorflow::DataTypeCanUseMemcpy(x.dtype()),
                      tensorflow::errors::InvalidArgument(
                          "rdmadev channel ", channel_, " cannot carry ",
                          tensorflow::DataTypeString(x.dtype()), " (not a plain-bytes dtype)"),
                      done);
    rdmadev::Deadline deadline = rdmadev::Deadline::After(timeout_s_);
    rdmadev::ChannelRegistry::Sender s;
    try {
      s = rdmadev::ChannelRegistry::Global().FindSender(channel_, deadline);
    } catch (const rdmadev::Error& e) {
      ctx->SetStatus(ToStatus(e));
      done();
      return;
    }
    const uint32_t tag = StepTagOf(ctx);
    auto send = [ctx, x, s, deadline, done, tag]() {
      try {
        auto bytes = x.tensor_data();
        s.ring->Send(bytes.data(), bytes.size(), deadline, tag);
      } catch (const rdmadev::Error& e) {
        ctx->SetStatus(ToStatus(e));
      }
      done();
    };
    auto need = s.ring->CreditNeeded();
    if (need.second == 0 || need.first->load(std::memory_order_acquire) >= need.second) {
      send();
      return;
    }
    auto cancel = std::make_shared<WaitCancel>(ctx->cancellation_manager(), s.domain);
    if (!cancel->Arm()) {
      ctx->SetStatus(tensorflow::errors::Cancelled("step cancelled before channel ", channel_, " sent"));
      done();
      return;
    }
    try {
      uint64_t ticket = s.domain->progress().Submit(
          need.first, need.second, deadline, AliveOf(s.ring->endpoint(), s.peer),
          [ctx, send, done, cancel](const rdmadev::Status& st, uint64_t) {
            cancel->Disarm();
            if (!st.ok) {
              ctx->SetStatus(ToStatus(st));
              done();
              return;
            }
            send();
          },
          nullptr, "a free slot (credit) on channel " + channel_ +
                       " (the receiver still holds every slot: a zero-copy tensor kept alive?)");
      cancel->Submitted(ticket);
    } catch (const rdmadev::Error& e) {
      cancel->Disarm();
      ctx->SetStatus(ToStatus(e));
      done();
    }
  }

 private:
  std::string channel_;
  float timeout_s_ = 0;  // always set from the attr (the plan's deadline)
};

// A received tensor that aliases its slot; the slot goes back to the sender (credit) when
// TensorFlow drops the last reference.
class SlotBuffer : public tensorflow::TensorBuffer {
 public:
  SlotBuffer(const rdmadev::Slot& slot, std::shared_ptr<rdmadev::RingReceiver> ring)
      : TensorBuffer(const_cast<uint8_t*>(slot.data)), size_(slot.length), seq_(slot.seq),
        ring_(std::move(ring)) {}
  ~SlotBuffer() override {
    try {
      ring_->Release(seq_, rdmadev::Deadline::After(60));
    } catch (const std::exception& e) {
      rdmadev::LogEvent(std::string("failed to release a received slot: ") + e.what());
    }
  }
  size_t size() const override { return size_; }
  TensorBuffer* root_buffer() override { return this; }
  void FillAllocationDescription(tensorflow::AllocationDescription* d) const override {
    d->set_requested_bytes(size_);
    d->set_allocator_name("rdmadev_slot");
  }
  bool OwnsMemory() const override { return false; }

 private:
  size_t size_;
  uint64_t seq_;
  std::shared_ptr<rdmadev::RingReceiver> ring_;
};

class RecvOp : public AsyncOpKernel {
 public:
  explicit RecvOp(OpKernelConstruction* c) : AsyncOpKernel(c) {
    OP_REQUIRES_OK(c, c->GetAttr("channel", &channel_));
    OP_REQUIRES_OK(c, c->GetAttr("dtype", &dtype_));
    OP_REQUIRES_OK(c, c->GetAttr("timeout_s", &timeout_s_));
    OP_REQUIRES_OK(c, c->GetAttr("zero_copy", &zero_copy_));
    tensorflow::PartialTensorShape shape;
    OP_REQUIRES_OK(c, c->GetAttr("shape", &shape));
    OP_REQUIRES(c, shape.AsTensorShape(&shape_),
                tensorflow::errors::InvalidArgument("rdmadev channel ", channel_,
                                                    " needs a static shape, got ",
                                                    shape.DebugString()));
    OP_REQUIRES(c, tensorflow::DataTypeCanUseMemcpy(dtype_),
                tensorflow::errors::InvalidArgument("rdmadev channel ", channel_,
                                                    " cannot carry ",
                                                    tensorflow::DataTypeString(dtype_)));
  }

  void ComputeAsync(OpKernelContext* ctx, DoneCallback done) override {
    rdmadev::Deadline deadline = rdmadev::Deadline::After(timeout_s_);
    rdmadev::ChannelRegistry::Receiver r;
    try {
      r = rdmadev::ChannelRegistry::Global().FindReceiver(channel_, deadline);
    } catch (const rdmadev::Error& e) {
      ctx->SetStatus(ToStatus(e));
      done();
      return;
    }
    // Step tags are compared on channels the control plane set up for an instantiation
    // (they name their peer), whose two halves always run in the same multi-task step; a
    // channel bound by hand may pair halves of different steps (eager ops run as functions
    // of their own), so it never discards.
    const uint32_t tag = r.peer.empty() ? 0 : StepTagOf(ctx);
    std::make_shared<Receive>(this, ctx, std::move(done), std::move(r), tag, deadline)->Start();
  }

 private:
  // One execution: waits for the next transfer of this step, discarding any that a failed
  // earlier step left behind (their step tag differs), and gives its sequence number back
  // if it ends without a transfer (cancelled, timed out), so that later steps stay in step.
  class Receive : public std::enable_shared_from_this<Receive> {
   public:
    Receive(const RecvOp* op, OpKernelContext* ctx, DoneCallback done,
            rdmadev::ChannelRegistry::Receiver r, uint32_t tag, rdmadev::Deadline deadline)
        : op_(op), ctx_(ctx), done_(std::move(done)), r_(std::move(r)), tag_(tag),
          deadline_(deadline), cm_(ctx->cancellation_manager()) {}

    void Start() {
      if (cm_) {
        token_ = cm_->get_cancellation_token();
        auto self = shared_from_this();
        if (!cm_->RegisterCallback(token_, [self] { self->Cancel(); })) {
          cm_ = nullptr;  // nothing registered
          Finish(tensorflow::errors::Cancelled("rdmadev channel ", op_->channel_,
                                               ": the step was cancelled"));
          return;
        }
      }
      Wait();
    }

   private:
    void Cancel() {
      uint64_t ticket;
      {
        std::lock_guard<std::mutex> lock(mu_);
        cancelled_ = true;
        ticket = ticket_;
      }
      if (ticket) r_.domain->progress().Cancel(ticket);
    }

    void Wait() {
      uint64_t gen;
      {
        std::lock_guard<std::mutex> lock(mu_);
        if (cancelled_) {
          Finish(tensorflow::errors::Cancelled("rdmadev channel ", op_->channel_,
                                               ": the step was cancelled"));
          return;
        }
        gen = ++gen_;
        ticket_ = 0;
      }
      uint64_t ticket = 0;
      try {
        n_ = r_.ring->Reserve();
      } catch (const rdmadev::Error& e) {
        Finish(ToStatus(e));
        return;
      }
      auto self = shared_from_this();
      try {
        ticket = r_.domain->progress().Submit(
            r_.ring->WordFor(n_), n_, deadline_, AliveOf(r_.ring->endpoint(), r_.peer),
            [self](const rdmadev::Status& st, uint64_t) { self->OnWait(st); }, nullptr,
            "transfer " + std::to_string(n_) + " on channel " + op_->channel_);
      } catch (const rdmadev::Error& e) {
        r_.ring->Abandon(n_);
        Finish(ToStatus(e));
        return;
      }
      bool cancelled;
      {
        std::lock_guard<std::mutex> lock(mu_);
        if (gen == gen_) ticket_ = ticket;  // else the wait already completed and moved on
        cancelled = cancelled_;
      }
      if (cancelled) r_.domain->progress().Cancel(ticket);
    }

    void OnWait(const rdmadev::Status& st) {
      if (!st.ok) {
        if (!r_.ring->Abandon(n_)) {
          rdmadev::LogEvent("channel " + op_->channel_ + ": transfer " + std::to_string(n_) +
                            " was given up while a later one was reserved (overlapping steps); "
                            "the channel is out of step");
        }
        Finish(ToStatus(st));
        return;
      }
      try {
        rdmadev::Slot slot = r_.ring->Take(n_);
        if (tag_ && slot.tag && slot.tag != tag_) {
          r_.ring->Discard(n_, rdmadev::Deadline::After(60));
          Wait();
          return;
        }
        Finish(Deliver(slot));
      } catch (const rdmadev::Error& e) {
        Finish(ToStatus(e));
      }
    }

    // Outputs the slot's tensor: aliased or copied, and the slot released when it can be.
    tensorflow::Status Deliver(const rdmadev::Slot& slot) {
      const RecvOp& op = *op_;
      const uint64_t want = op.shape_.num_elements() * tensorflow::DataTypeSize(op.dtype_);
      if (slot.length != want) {
        r_.ring->Release(slot.seq, rdmadev::Deadline::After(60));
        return tensorflow::errors::InvalidArgument(
            "rdmadev channel ", op.channel_, " delivered ", slot.length, " bytes where ",
            op.shape_.DebugString(), " ", tensorflow::DataTypeString(op.dtype_), " needs ", want,
            ": the sender's tensor does not match the plan");
      }
      // Aliasing is the planner's decision (zero_copy, which already applies the plan's
      // zero_copy_min_bytes): credits return in order, so a received tensor that stays
      // alive (returned, stored, forwarded into a variable) stops the sender K transfers
      // later, and only the planner can tell that every consumer is done with it within
      // the step. The one run-time guard: alias only while a slot stays free.
      if (op.zero_copy_ && r_.ring->held() < r_.ring->layout().slots) {
        auto* buf = new SlotBuffer(slot, r_.ring);
        Tensor out(op.dtype_, op.shape_, buf);
        buf->Unref();
        ctx_->set_output(0, out);
        return absl::OkStatus();
      }
      Tensor* out = nullptr;
      auto s = ctx_->allocate_output(0, op.shape_, &out);
      if (s.ok() && want) std::memcpy(const_cast<char*>(out->tensor_data().data()), slot.data, want);
      r_.ring->Release(slot.seq, rdmadev::Deadline::After(60));
      return s;
    }

    void Finish(const tensorflow::Status& s) {
      if (cm_) cm_->TryDeregisterCallback(token_);  // drops the callback's reference to this
      if (!s.ok()) ctx_->SetStatus(s);
      done_();
    }

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
    uint64_t n_ = 0;  // the reservation being waited for
  };

  std::string channel_;
  DataType dtype_;
  TensorShape shape_;
  float timeout_s_ = 0;  // always set from the attr (the plan's deadline)
  bool zero_copy_ = false;
};

REGISTER_KERNEL_BUILDER(Name("RdmadevSend").Device(tensorflow::DEVICE_CPU), SendOp);
REGISTER_KERNEL_BUILDER(Name("RdmadevRecv").Device(tensorflow::DEVICE_CPU), RecvOp);

}  // namespace
}  // namespace rdmadev_tf
