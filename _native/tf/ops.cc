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

rdmadev::Liveness AliveOf(const std::shared_ptr<rdmadev::Endpoint>& ep) {
  return [ep](std::string* why) { return ep->Alive(why); };
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
    auto send = [ctx, x, s, deadline, done]() {
      try {
        auto bytes = x.tensor_data();
        s.ring->Send(bytes.data(), bytes.size(), deadline);
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
          need.first, need.second, deadline, AliveOf(s.ring->endpoint()),
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
    uint64_t n = 0;
    try {
      r = rdmadev::ChannelRegistry::Global().FindReceiver(channel_, deadline);
    } catch (const rdmadev::Error& e) {
      ctx->SetStatus(ToStatus(e));
      done();
      return;
    }
    auto cancel = std::make_shared<WaitCancel>(ctx->cancellation_manager(), r.domain);
    if (!cancel->Arm()) {  // before reserving a slot, which would then never be taken
      ctx->SetStatus(tensorflow::errors::Cancelled("step cancelled before channel ", channel_, " received"));
      done();
      return;
    }
    try {
      n = r.ring->Reserve();
    } catch (const rdmadev::Error& e) {
      cancel->Disarm();
      ctx->SetStatus(ToStatus(e));
      done();
      return;
    }
    const uint64_t want = shape_.num_elements() * tensorflow::DataTypeSize(dtype_);
    auto finish = [this, ctx, r, n, want, done, cancel](const rdmadev::Status& st, uint64_t) {
      cancel->Disarm();
      if (!st.ok) {
        ctx->SetStatus(ToStatus(st));
        done();
        return;
      }
      try {
        rdmadev::Slot slot = r.ring->Take(n);
        if (slot.length != want) {
          r.ring->Release(n, rdmadev::Deadline::After(60));
          ctx->SetStatus(tensorflow::errors::InvalidArgument(
              "rdmadev channel ", channel_, " delivered ", slot.length, " bytes where ",
              shape_.DebugString(), " ", tensorflow::DataTypeString(dtype_), " needs ", want,
              ": the sender's tensor does not match the plan"));
          done();
          return;
        }
        // Aliasing is the planner's decision (zero_copy, which already applies the plan's
        // zero_copy_min_bytes): credits return in order, so a received tensor that stays
        // alive (returned, stored, forwarded into a variable) stops the sender K transfers
        // later, and only the planner can tell that every consumer is done with it within
        // the step. The one run-time guard: alias only while a slot stays free.
        bool alias = zero_copy_ && r.ring->held() < r.ring->layout().slots;
        if (alias) {
          auto* buf = new SlotBuffer(slot, r.ring);
          Tensor out(dtype_, shape_, buf);
          buf->Unref();
          ctx->set_output(0, out);
        } else {
          Tensor* out = nullptr;
          auto s = ctx->allocate_output(0, shape_, &out);
          if (s.ok() && want) std::memcpy(const_cast<char*>(out->tensor_data().data()), slot.data, want);
          r.ring->Release(n, rdmadev::Deadline::After(60));
          if (!s.ok()) ctx->SetStatus(s);
        }
      } catch (const rdmadev::Error& e) {
        ctx->SetStatus(ToStatus(e));
      }
      done();
    };
    uint64_t ticket = 0;
    try {
      ticket = r.domain->progress().Submit(r.ring->WordFor(n), n, deadline,
                                           AliveOf(r.ring->endpoint()), finish, nullptr,
                                           "transfer " + std::to_string(n) + " on channel " + channel_);
    } catch (const rdmadev::Error& e) {
      cancel->Disarm();
      ctx->SetStatus(ToStatus(e));
      done();
      return;
    }
    cancel->Submitted(ticket);
  }

 private:
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
