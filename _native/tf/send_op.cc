// The RdmadevSend kernel (and TF's own _Send/_HostSend of a pair the pass labelled, and
// RdmadevSendBundle, whose tensors it copies into one buffer first): writes a
// tensor into the peer's slot with a one-sided write, staged or in chunks when a dynamic
// channel's tensor is larger than a slot, waiting for credits on the domain's progress
// thread. ops.cc says which kernels own their channels and why.
#include <algorithm>
#include <atomic>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "tensorflow/core/framework/cancellation.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/tensor.h"

#include "kernel_support.h"
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

// A dynamic channel's shape block for `shape` (channel.h): u64 rank, then u64 dims.
std::vector<uint64_t> ShapeBlock(const TensorShape& shape) {
  std::vector<uint64_t> block{static_cast<uint64_t>(shape.dims())};
  for (int i = 0; i < shape.dims(); ++i) block.push_back(static_cast<uint64_t>(shape.dim_size(i)));
  return block;
}

class SendOp : public AsyncOpKernel {
 public:
  explicit SendOp(OpKernelConstruction* c) : AsyncOpKernel(c) {
    OP_REQUIRES_OK(c, c->GetAttr(Setting(c, "channel"), &channel_));
    OP_REQUIRES_OK(c, c->GetAttr(Setting(c, "timeout_s"), &timeout_s_));
    OP_REQUIRES_OK(c, c->GetAttr(Setting(c, "max_bytes"), &max_bytes_));
    OP_REQUIRES_OK(c, c->GetAttr(Setting(c, "owned"), &owned_));
    if (c->def().op() == "RdmadevSendBundle") {
      OP_REQUIRES_OK(c, c->GetAttr("offsets", &offsets_));
      OP_REQUIRES(c, static_cast<int>(offsets_.size()) == c->num_inputs() && !offsets_.empty(),
                  tensorflow::errors::InvalidArgument("rdmadev bundle ", channel_, " has ", offsets_.size(),
                                                      " offsets for ", c->num_inputs(), " tensors"));
    }
    if (owned_) rdmadev::ChannelRegistry::Global().Hold(channel_, rdmadev::ChannelRegistry::kSend);
  }
  ~SendOp() override {
    if (owned_) rdmadev::ChannelRegistry::Global().LetGo(channel_, rdmadev::ChannelRegistry::kSend);
  }

  void ComputeAsync(OpKernelContext* ctx, DoneCallback done) override {
    Tensor x;  // holds a reference until the write is done
    if (offsets_.empty()) {
      x = ctx->input(0);
    } else {
      OP_REQUIRES_OK_ASYNC(ctx, Bundled(ctx, &x), done);
    }
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
    std::vector<uint64_t> block;
    const rdmadev::RingLayout& lay = s.ring->layout();
    if (lay.shape_bytes() && !dead) {  // a dynamic channel: the shape travels, large tensors staged
      const uint64_t bytes = x.tensor_data().size();
      OP_REQUIRES_ASYNC(ctx, max_bytes_ <= 0 || bytes <= static_cast<uint64_t>(max_bytes_),
                        tensorflow::errors::ResourceExhausted(
                            "rdmadev channel ", channel_, ": a ", x.shape().DebugString(), " ",
                            tensorflow::DataTypeString(x.dtype()), " tensor of ", bytes,
                            " bytes exceeds ", kMaxTensorSetting, "=", max_bytes_,
                            " (the most one tensor of a dynamic shape may carry); raise it on "
                            "every task"),
                        done);
      OP_REQUIRES_ASYNC(ctx, static_cast<uint64_t>(x.dims()) <= lay.rank_capacity(),
                        tensorflow::errors::InvalidArgument(
                            "rdmadev channel ", channel_, ": a tensor of rank ", x.dims(),
                            " does not fit the channel's shape block (", lay.rank_capacity(),
                            " dims): the plan does not match the graph"),
                        done);
      OP_REQUIRES_ASYNC(ctx, lay.capacity > 0 || bytes == 0,
                        tensorflow::errors::InvalidArgument(
                            "rdmadev channel ", channel_, " has slots of 0 bytes and cannot carry ",
                            bytes, " bytes: give it a capacity (capacity_hints)"),
                        done);
      block = ShapeBlock(x.shape());
    }
    // What the trace says moved: the tensors' bytes (a bundle's without the gaps between them).
    uint64_t carried = 0;
    for (int i = 0; i < ctx->num_inputs(); ++i) carried += ctx->input(i).tensor_data().size();
    std::make_shared<Sending>(ctx, x, dead, std::move(s), std::move(moving_from), deadline,
                              std::move(done), StepTagOf(ctx), std::move(block), channel_, carried)
        ->Next();
  }

 private:
  // One execution: writes the tensor in one slot; on a dynamic channel, one larger than a
  // slot goes staged (stage.h) or in as many slot-sized chunks as it needs (the first
  // carrying the shape), each as soon as the receiver has given a slot back.
  // Credits are waited for on the progress thread. When the channel moves to a larger ring
  // (growth), the marker goes on the old ring first.
  class Sending : public std::enable_shared_from_this<Sending> {
   public:
    Sending(OpKernelContext* ctx, Tensor x, bool dead, rdmadev::ChannelRegistry::Sender s,
            rdmadev::ChannelRegistry::Sender moving_from, rdmadev::Deadline deadline,
            DoneCallback done, uint32_t tag, std::vector<uint64_t> block,
            const std::string& channel, uint64_t carried)
        : ctx_(ctx), x_(std::move(x)), dead_(dead), s_(std::move(s)), from_(std::move(moving_from)),
          deadline_(deadline), done_(std::move(done)), tag_(tag), block_(std::move(block)),
          channel_(channel), carried_(carried) {
      trace_.Begin();
    }

    void Next() {
      const auto data = x_.tensor_data();
      const uint64_t len = data.size();
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
        if ((from_.ring || Staging()) && half.stage) {
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
          if (dead_) {
            s_.ring->SendDead(deadline_, tag_);
            Done();
            return;
          }
          if (Staging() && SendStaged()) {
            Done();
            return;
          }
          const bool first = !started_;
          const uint64_t chunk = block_.empty() ? len : std::min(len - sent_, s_.ring->layout().capacity);
          const int64_t since = trace_.Mark();
          s_.ring->Send(data.data() + sent_, chunk, deadline_, tag_,
                        first ? block_.data() : nullptr,
                        first ? block_.size() * sizeof(uint64_t) : 0);
          trace_.Phase("rdmadev.write", since);
          started_ = true;
          sent_ += chunk;
          ++chunks_;
        } catch (const rdmadev::Error& e) {
          ctx_->SetStatus(SendStatus(e));
          Done();
          return;
        }
        if (sent_ >= len) {
          Done();
          return;
        }
      }
    }

   private:
    // Whether this tensor goes staged (stage.h): a dynamic channel's tensor larger than a
    // slot, when the slots hold a stage record but are smaller than the domain's
    // stage_below_slot_bytes (larger slots pipeline chunks better), and no stage was refused.
    bool Staging() const {
      const auto& lay = s_.ring->layout();
      return !block_.empty() && !chunking_ && x_.tensor_data().size() > lay.capacity &&
             lay.capacity >= rdmadev::kStageRecordBytes &&
             lay.capacity < s_.domain->options().stage_below_slot_bytes;
    }

    // Copies the tensor into the channel's stage and writes the record; false (chunks
    // instead) when the channel has no stage for it (Stage::Room).
    bool SendStaged() {
      const auto data = x_.tensor_data();
      const int64_t since = trace_.Mark();
      std::shared_ptr<rdmadev::Region> stage = s_.stage->Room(s_.domain, data.size(), channel_);
      if (!stage) {
        chunking_ = true;
        return false;
      }
      std::memcpy(stage->base(), data.data(), data.size());
      rdmadev::StageRecord record{stage->desc(), 0, data.size()};
      const uint64_t n = s_.ring->SendStaged(record.Encode(), deadline_, tag_, block_.data(),
                                             block_.size() * sizeof(uint64_t));
      s_.stage->set_busy(n);
      rdmadev::CountStaged();
      trace_.Phase("rdmadev.write", since);
      ++chunks_;
      return true;
    }

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
    const Tensor x_;
    const bool dead_;  // the input is dead: the transfer says so, and carries nothing
    rdmadev::ChannelRegistry::Sender s_;
    rdmadev::ChannelRegistry::Sender from_;  // the ring to write the marker on (growth), else empty
    const rdmadev::Deadline deadline_;
    DoneCallback done_;
    const uint32_t tag_;
    const std::vector<uint64_t> block_;  // the shape block (dynamic channels), else empty
    const std::string channel_;
    const uint64_t carried_;  // the tensors' bytes, for the trace
    uint64_t sent_ = 0;
    bool started_ = false;
    bool chunking_ = false;  // the stage was refused: this tensor goes in chunks
    TransferTrace trace_;
    int64_t credit_since_ = 0;  // when the current credit wait began (trace on)
    uint64_t chunks_ = 0;
  };

  // A bundle's tensors at their offsets in one buffer, which goes as one static transfer (the
  // ring refuses more bytes than its slots hold). The bytes between them are zeroed: a slot
  // never carries this process's stale memory.
  absl::Status Bundled(OpKernelContext* ctx, Tensor* out) const {
    uint64_t end = 0;
    for (int i = 0; i < ctx->num_inputs(); ++i) {
      const Tensor& x = ctx->input(i);
      if (!tensorflow::DataTypeCanUseMemcpy(x.dtype()) || offsets_[i] < 0 ||
          static_cast<uint64_t>(offsets_[i]) < end) {
        return tensorflow::errors::InvalidArgument(
            "rdmadev bundle ", channel_, ": tensor ", i, " (", tensorflow::DataTypeString(x.dtype()), " ",
            x.shape().DebugString(), ") cannot go at offset ", offsets_[i], " after ", end,
            " bytes: the plan does not match the graph");
      }
      end = offsets_[i] + x.tensor_data().size();
    }
    TF_RETURN_IF_ERROR(ctx->allocate_temp(tensorflow::DT_UINT8, TensorShape({static_cast<int64_t>(end)}), out));
    char* base = const_cast<char*>(out->tensor_data().data());
    uint64_t filled = 0;
    for (int i = 0; i < ctx->num_inputs(); ++i) {
      const auto data = ctx->input(i).tensor_data();
      std::memset(base + filled, 0, offsets_[i] - filled);
      std::memcpy(base + offsets_[i], data.data(), data.size());
      filled = offsets_[i] + data.size();
    }
    return absl::OkStatus();
  }

  std::string channel_;
  float timeout_s_ = 0;  // always set from the attr (the plan's deadline)
  int64_t max_bytes_ = 0;
  bool owned_ = false;  // a half pair's kernel: holds its half while it lives
  std::vector<int64_t> offsets_;  // a bundle's (RdmadevSendBundle): where each input goes
};

REGISTER_KERNEL_BUILDER(Name("RdmadevSendBundle").Device(tensorflow::DEVICE_CPU), SendOp);
REGISTER_KERNEL_BUILDER(Name("RdmadevSend").Device(tensorflow::DEVICE_CPU), SendOp);
REGISTER_KERNEL_BUILDER(Name("_Send").Device(tensorflow::DEVICE_CPU).Label(kTransferLabel), SendOp);
REGISTER_KERNEL_BUILDER(Name("_HostSend").Device(tensorflow::DEVICE_CPU).Label(kTransferLabel), SendOp);

}  // namespace
}  // namespace rdmadev_tf
