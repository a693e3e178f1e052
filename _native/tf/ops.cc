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
//
// The exception is a half pair (`owned`): a TF1 task plans only its own partition, so no
// process planned both halves and none could release them. Those kernels live in the
// session's OpSegment until the session's graphs are deregistered; they hold their half in
// the registry, and the last one destroyed unbinds it (rdmadev.cluster.channels: the halves
// meet by channel key, which graphs and sessions of the same pair share).
#include <algorithm>
#include <atomic>
#include <cstring>
#include <deque>
#include <functional>
#include <limits>
#include <memory>
#include <mutex>
#include <unordered_set>
#include <string>
#include <vector>

#include "tensorflow/core/framework/cancellation.h"
#include "tensorflow/core/framework/common_shape_fns.h"
#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/shape_inference.h"
#include "tensorflow/core/framework/tensor.h"

#include "labelled.h"
#include "registry.h"
#include "tf_status.h"
#include "trace.h"
#include "warm.h"

namespace rdmadev_tf {

using tensorflow::AsyncOpKernel;
using tensorflow::DataType;
using tensorflow::OpKernelConstruction;
using tensorflow::OpKernelContext;
using tensorflow::Tensor;
using tensorflow::TensorShape;

// Both ops are registered as distributed communication (SetIsDistributedCommunication): TF's
// executor turns an Unavailable status from any other op into Internal, and a lost or silent
// peer must reach MonitoredTrainingSession and ParameterServerStrategy's coordinator as
// UnavailableError, the error they take for a lost task, as gRPC's _Recv's does.
REGISTER_OP("RdmadevSend")
    .Input("x: T")
    .Attr("T: type")
    .Attr("channel: string")
    .Attr("timeout_s: float")
    .Attr("max_bytes: int = 0")
    .Attr("owned: bool = false")
    .SetIsStateful()
    .SetIsDistributedCommunication()
    .SetShapeFn(tensorflow::shape_inference::NoOutputs)
    .Doc("Writes x into the next slot of rdmadev channel `channel` (one-sided). On a dynamic "
         "channel the slot's shape block carries x's shape, and a tensor larger than a slot "
         "is staged (copied into the channel's stage for the receiver to read) when the slots "
         "are below the task's RDMADEV_STAGE_BELOW_SLOT_BYTES and its registered-memory limit "
         "leaves room, else sent in slot-sized chunks; max_bytes (0: no limit) bounds what it "
         "may send. An "
         "owned kernel (a half pair) holds its half of the channel while it lives; the last "
         "one destroyed unbinds it.");

REGISTER_OP("RdmadevRecv")
    .Output("y: dtype")
    .Attr("dtype: type")
    .Attr("shape: shape")
    .Attr("channel: string")
    .Attr("timeout_s: float")
    .Attr("zero_copy: bool = false")
    .Attr("zero_copy_min_bytes: int = 0")
    .Attr("max_bytes: int = 0")
    .Attr("owned: bool = false")
    .SetIsStateful()
    .SetIsDistributedCommunication()
    .SetShapeFn([](tensorflow::shape_inference::InferenceContext* c) {
      tensorflow::PartialTensorShape shape;
      TF_RETURN_IF_ERROR(c->GetAttr("shape", &shape));
      tensorflow::shape_inference::ShapeHandle out;
      TF_RETURN_IF_ERROR(c->MakeShapeFromPartialTensorShape(shape, &out));
      c->set_output(0, out);
      return absl::OkStatus();
    })
    .Doc("Waits for the next transfer on rdmadev channel `channel` and outputs it. On a dynamic "
         "channel its shape is the one the sender wrote (compatible with `shape`), at most "
         "max_bytes (0: no limit) bytes, read from the sender's stage or gathered from as many "
         "chunks as it was sent in. With zero_copy a tensor of at least zero_copy_min_bytes "
         "that came in one slot aliases it (the slot goes back to the sender when the tensor is freed). An owned kernel (a "
         "half pair) holds its half of the channel while it lives; the last one destroyed "
         "unbinds it.");

namespace {

// Whether a wait on `ring` (a channel half whose peer is task `peer`) may go on: the half is
// still bound here and the peer still there; the reason names what went (WaitStatus).
template <typename Ring>
rdmadev::Liveness AliveOf(const std::shared_ptr<Ring>& ring, const std::string& peer) {
  return [ring, peer](std::string* why) {
    if (ring->unbound()) {
      *why = "the channel was unbound";
      return false;
    }
    if (ring->endpoint()->Alive(why)) return true;
    if (!peer.empty()) *why = "task " + peer + ": " + *why;
    return false;
  };
}

// The status of a failed wait on `ring`, a half of `channel`. One that ended because the
// control plane unbound the half says why that happens, instead of "peer lost".
template <typename Ring>
absl::Status WaitStatus(const rdmadev::Status& st, const Ring& ring, const std::string& channel) {
  if (st.kind != rdmadev::ErrorKind::kPeerLost || !ring.unbound()) return ToStatus(st);
  return tensorflow::errors::Unavailable(
      "rdmadev channel ", channel, " was unbound in this task while this step waited on it: ",
      "its function was released, its peer task failed or restarted, or the connection to it "
      "broke (a running peer's channels are then set up again), so the transfer will not "
      "come. This step was cut short by a failure elsewhere; run it again once the cluster "
      "is whole");
}

// The step tag of this execution (channel.h): from TF's step id, which the tasks of one
// multi-task step share.
uint32_t StepTagOf(OpKernelContext* ctx) {
  return rdmadev::StepTag(static_cast<uint64_t>(ctx->step_id()));
}

// Whether TF cancelled the kernel's step: a wait for a half pair to be bound (TF1 sessions)
// ends then, instead of at its deadline (ChannelRegistry::FindSender/FindReceiver).
rdmadev::ChannelRegistry::Cancelled StepCancelled(OpKernelContext* ctx) {
  tensorflow::CancellationManager* cm = ctx->cancellation_manager();
  if (cm == nullptr) return nullptr;
  return [cm] { return cm->IsCancelled(); };
}

// How long a receive that finds another step's transfer in its slot leaves it there for
// that step's own receive (which then takes this receive's place: RingReceiver::Reserve),
// unless that step is known to have failed here (FailedSteps). Past it the transfer is taken
// as a late one of a failed step and discarded. It covers the lag between a step's sender
// writing and the same step's receive starting in this task, a remote component function
// dispatched on a loaded machine (milliseconds, up to a second seen on 2 cores); a step
// after a failure whose late transfer this task cannot place pays it once.
constexpr double kForeignTransferGraceS = 5.0;
// How long a receive of a planned channel that finds every slot held by earlier receives
// waits for one to be let go before failing (AllSlotsHeld). An earlier step's tensor holding
// a slot belongs to a step its caller gave up; it goes when that step ends, which its own
// superseded receives make happen within milliseconds.
constexpr double kHeldSlotGraceS = 5.0;

// The tags of steps an rdmadev kernel failed in, in this task (timed out, cancelled,
// superseded, its half gone): a transfer tagged so that arrives later is a failed step's,
// and a receive discards it at once. The last kRemembered, the failures of many steps; a
// later step whose 24-bit tag equals a remembered one only goes without the wait that
// LeaveForItsStep gives a transfer it cannot place.
class FailedSteps {
 public:
  static constexpr size_t kRemembered = 4096;
  static FailedSteps& Global() {
    static FailedSteps* steps = new FailedSteps;  // never destroyed: kernels outlive statics
    return *steps;
  }
  void Add(uint32_t tag) {
    if (!tag) return;
    std::lock_guard<std::mutex> lock(mu_);
    if (!known_.insert(tag).second) return;
    order_.push_back(tag);
    if (order_.size() > kRemembered) {
      known_.erase(order_.front());
      order_.pop_front();
    }
  }
  bool Has(uint32_t tag) const {
    std::lock_guard<std::mutex> lock(mu_);
    return known_.count(tag) > 0;
  }

 private:
  mutable std::mutex mu_;
  std::unordered_set<uint32_t> known_;
  std::deque<uint32_t> order_;
};

// The sooner of two deadlines.
rdmadev::Deadline Sooner(const rdmadev::Deadline& a, const rdmadev::Deadline& b) {
  if (a.infinite) return b;
  if (b.infinite) return a;
  return a.at <= b.at ? a : b;
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


// The setting that bounds one dynamic tensor (rdmadev/config.py), for messages.
constexpr char kMaxTensorSetting[] = "RDMADEV_MAX_TENSOR_BYTES";

// A dynamic channel's shape block for `shape` (channel.h): u64 rank, then u64 dims.
std::vector<uint64_t> ShapeBlock(const TensorShape& shape) {
  std::vector<uint64_t> block{static_cast<uint64_t>(shape.dims())};
  for (int i = 0; i < shape.dims(); ++i) block.push_back(static_cast<uint64_t>(shape.dim_size(i)));
  return block;
}

// The pass swaps a pair whose tensor may be dead (a half in a branch of a conditional) by
// labelling TF's own _Send/_Recv nodes for these kernels instead of replacing them with
// RdmadevSend/RdmadevRecv (labelled.h): TF's executor runs a transfer node even when its input
// is dead, and lets a receiving one output a dead tensor, which it allows no other op.

// Whether `c` builds a kernel for one of TF's own transfer nodes (labelled by the pass).
bool IsTransferNode(OpKernelConstruction* c) { return c->def().op()[0] == '_'; }

// The attr that holds setting `name` on the node `c` builds a kernel for.
std::string Setting(OpKernelConstruction* c, const std::string& name) {
  return IsTransferNode(c) ? kSettingPrefix + name : name;
}

class SendOp : public AsyncOpKernel {
 public:
  explicit SendOp(OpKernelConstruction* c) : AsyncOpKernel(c) {
    OP_REQUIRES_OK(c, c->GetAttr(Setting(c, "channel"), &channel_));
    OP_REQUIRES_OK(c, c->GetAttr(Setting(c, "timeout_s"), &timeout_s_));
    OP_REQUIRES_OK(c, c->GetAttr(Setting(c, "max_bytes"), &max_bytes_));
    OP_REQUIRES_OK(c, c->GetAttr(Setting(c, "owned"), &owned_));
    if (owned_) rdmadev::ChannelRegistry::Global().Hold(channel_, rdmadev::ChannelRegistry::kSend);
  }
  ~SendOp() override {
    if (owned_) rdmadev::ChannelRegistry::Global().LetGo(channel_, rdmadev::ChannelRegistry::kSend);
  }

  void ComputeAsync(OpKernelContext* ctx, DoneCallback done) override {
    const Tensor x = ctx->input(0);  // holds a reference until the write is done
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
    std::make_shared<Sending>(ctx, x, dead, std::move(s), std::move(moving_from), deadline,
                              std::move(done), StepTagOf(ctx), std::move(block), channel_)
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
            const std::string& channel)
        : ctx_(ctx), x_(std::move(x)), dead_(dead), s_(std::move(s)), from_(std::move(moving_from)),
          deadline_(deadline), done_(std::move(done)), tag_(tag), block_(std::move(block)),
          channel_(channel) {
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
      trace_.End("rdmadev.send", channel_, s_.peer, x_.tensor_data().size(), chunks_);
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
    uint64_t sent_ = 0;
    bool started_ = false;
    bool chunking_ = false;  // the stage was refused: this tensor goes in chunks
    TransferTrace trace_;
    int64_t credit_since_ = 0;  // when the current credit wait began (trace on)
    uint64_t chunks_ = 0;
  };

  std::string channel_;
  float timeout_s_ = 0;  // always set from the attr (the plan's deadline)
  int64_t max_bytes_ = 0;
  bool owned_ = false;  // a half pair's kernel: holds its half while it lives
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
      // The credit of a channel that went, or of a connection that broke (the pair is set up
      // again, or its peer is gone), has no one to read it: nothing to report.
      std::string why;
      if (ring_->unbound() || !ring_->endpoint()->PeerAlive(&why)) return;
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
  explicit RecvOp(OpKernelConstruction* c) : AsyncOpKernel(c), transfer_node_(IsTransferNode(c)) {
    OP_REQUIRES_OK(c, c->GetAttr(Setting(c, "channel"), &channel_));
    OP_REQUIRES_OK(c, c->GetAttr(transfer_node_ ? "tensor_type" : "dtype", &dtype_));
    OP_REQUIRES_OK(c, c->GetAttr(Setting(c, "timeout_s"), &timeout_s_));
    OP_REQUIRES_OK(c, c->GetAttr(Setting(c, "zero_copy"), &zero_copy_));
    OP_REQUIRES_OK(c, c->GetAttr(Setting(c, "zero_copy_min_bytes"), &zero_copy_min_bytes_));
    OP_REQUIRES_OK(c, c->GetAttr(Setting(c, "max_bytes"), &max_bytes_));
    OP_REQUIRES_OK(c, c->GetAttr(Setting(c, "shape"), &shape_));
    OP_REQUIRES_OK(c, c->GetAttr(Setting(c, "owned"), &owned_));
    if (owned_) rdmadev::ChannelRegistry::Global().Hold(channel_, rdmadev::ChannelRegistry::kRecv);
    fully_defined_ = shape_.AsTensorShape(&static_shape_);
    if (c->device()->GetAllocator(tensorflow::AllocatorAttributes())->Name() == kMallocAllocator) {
      warm_ = std::make_shared<WarmPool>();
    }
    OP_REQUIRES(c, tensorflow::DataTypeCanUseMemcpy(dtype_),
                tensorflow::errors::InvalidArgument("rdmadev channel ", channel_,
                                                    " cannot carry ",
                                                    tensorflow::DataTypeString(dtype_)));
  }
  ~RecvOp() override {
    if (owned_) rdmadev::ChannelRegistry::Global().LetGo(channel_, rdmadev::ChannelRegistry::kRecv);
  }

  void ComputeAsync(OpKernelContext* ctx, DoneCallback done) override {
    rdmadev::Deadline deadline = rdmadev::Deadline::After(timeout_s_);
    rdmadev::ChannelRegistry::Receiver r;
    try {
      r = rdmadev::ChannelRegistry::Global().FindReceiver(channel_, deadline, StepCancelled(ctx));
    } catch (const rdmadev::Error& e) {
      FailedSteps::Global().Add(StepTagOf(ctx));
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
          deadline_(deadline), cm_(ctx->cancellation_manager()) {
      trace_.Begin();
    }

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
      std::shared_ptr<rdmadev::Domain> domain;
      {
        std::lock_guard<std::mutex> lock(mu_);
        cancelled_ = true;
        ticket = ticket_;
        domain = r_.domain;
      }
      if (ticket) domain->progress().Cancel(ticket);
    }

    // Waits for the next transfer of this step. When its sequence word is already there (the
    // sender ran first) the transfer is taken on this thread: a hop through the progress
    // thread costs its wake-up, 0.1-0.6 ms per pair on these machines (issue 13's per-pair
    // cost). Otherwise the progress thread completes the wait. A loop, not recursion: a
    // tensor whose chunks are all written already takes one pass per chunk.
    void Wait() {
      for (;;) {
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
        const uint64_t let_go = r_.ring->LetGoWord()->load(std::memory_order_acquire);
        try {
          res_ = r_.ring->Reserve(tag_);
          slot_grace_ = rdmadev::Deadline::Never();
        } catch (const rdmadev::Error& e) {
          WaitForASlot(gen, let_go, e);
          return;
        }
        wait_since_ = trace_.Mark();
        const std::atomic<uint64_t>* word = r_.ring->WordFor(res_.n);
        if (word->load(std::memory_order_acquire) >= res_.n) {
          if (Took(rdmadev::Status::Ok())) continue;
          return;
        }
        auto self = shared_from_this();
        auto parked = Park(gen, word, res_.n, deadline_, AliveOf(r_.ring, r_.peer),
                           [self](const rdmadev::Status& st) {
                             if (self->Took(st)) self->Wait();
                           },
                           "transfer " + std::to_string(res_.n) + " on channel " + op_->channel_);
        if (!parked.ok()) {
          r_.ring->Abandon(res_);
          Finish(parked);
        }
        return;
      }
    }

    // Hands a wait to the progress thread: `then` runs when `word` reaches `target`, `until`
    // passes or `alive` says no. TF's cancellation of the step ends it (Cancel).
    absl::Status Park(uint64_t gen, const std::atomic<uint64_t>* word, uint64_t target,
                      rdmadev::Deadline until, rdmadev::Liveness alive,
                      std::function<void(const rdmadev::Status&)> then, std::string what) {
      uint64_t ticket = 0;
      try {
        ticket = r_.domain->progress().Submit(
            word, target, until, std::move(alive),
            [then = std::move(then)](const rdmadev::Status& st, uint64_t) { then(st); },
            nullptr, std::move(what));
      } catch (const rdmadev::Error& e) {
        return ToStatus(e);
      }
      bool cancelled;
      {
        std::lock_guard<std::mutex> lock(mu_);
        if (gen == gen_) ticket_ = ticket;  // else the wait already completed and moved on
        cancelled = cancelled_;
      }
      if (cancelled) r_.domain->progress().Cancel(ticket);
      return absl::OkStatus();
    }

    // Every slot is held by earlier receives. On a planned channel (tagged) those belong to a
    // step its caller gave up, and this waits up to kHeldSlotGraceS for one to be let go;
    // otherwise, or past that, it is the caller's error (AllSlotsHeld).
    void WaitForASlot(uint64_t gen, uint64_t let_go, const rdmadev::Error& e) {
      if (slot_grace_.infinite) slot_grace_ = rdmadev::Deadline::After(kHeldSlotGraceS);
      if (!tag_ || slot_grace_.passed()) {
        Finish(AllSlotsHeld(e));
        return;
      }
      auto self = shared_from_this();
      auto parked = Park(
          gen, r_.ring->LetGoWord(), let_go + 1, Sooner(slot_grace_, deadline_),
          AliveOf(r_.ring, r_.peer),
          [self](const rdmadev::Status& st) {
            if (st.ok || (st.kind == rdmadev::ErrorKind::kTimeout && !self->deadline_.passed())) {
              self->Wait();  // a slot went, or the grace is over: Reserve again (or fail)
            } else {
              self->Finish(WaitStatus(st, *self->r_.ring, self->op_->channel_));
            }
          },
          "a slot of channel " + op_->channel_ + " held by an earlier step to be let go");
      if (!parked.ok()) Finish(parked);
    }

    // Transfer res_.n is another step's, and that step is not known to have failed here: so
    // this receive belongs to a step given up by its caller (or calls overlap), and the
    // other step's receive is due to take its place (RingReceiver::Reserve). Leaves the
    // transfer there until that happens (this receive then ends, Superseded), the step is
    // known failed here, or kForeignTransferGraceS passes (it is then taken as a failed
    // step's late transfer and discarded).
    void LeaveForItsStep(uint32_t tag) {
      uint64_t gen;
      {
        std::lock_guard<std::mutex> lock(mu_);
        gen = ++gen_;
        ticket_ = 0;
      }
      const auto* superseded = r_.ring->SupersededWord();
      auto alive = AliveOf(r_.ring, r_.peer);
      auto self = shared_from_this();
      auto parked = Park(
          gen, superseded, superseded->load(std::memory_order_acquire) + 1,
          Sooner(foreign_grace_, deadline_),
          [self, tag, alive](std::string* why) {
            if (!self->Placed(tag)) return alive(why);
            *why = "placed";  // Took sees how
            return false;
          },
          [self, tag](const rdmadev::Status& st) {
            // Took ends this receive (superseded), discards the transfer (a failed step's, or
            // the grace is over) or leaves it again (another receive was superseded).
            const bool placed = st.ok || self->Placed(tag) ||
                                (st.kind == rdmadev::ErrorKind::kTimeout && !self->deadline_.passed());
            if (self->Took(placed ? rdmadev::Status::Ok() : st)) self->Wait();
          },
          "step " + std::to_string(tag) + "'s receive to claim transfer " + std::to_string(res_.n) +
              " on channel " + op_->channel_);
      if (!parked.ok()) {
        r_.ring->Abandon(res_);
        Finish(parked);
      }
    }

    // Whether it is settled what becomes of transfer res_.n, a transfer of step `tag`: this
    // receive was superseded, or that step is known to have failed here.
    bool Placed(uint32_t tag) const {
      return r_.ring->Superseded(res_) || FailedSteps::Global().Has(tag);
    }

    // This receive's place went to a later step's receive (RingReceiver::Reserve).
    absl::Status Superseded() const {
      return tensorflow::errors::Aborted(
          "rdmadev channel ", op_->channel_, ": a later step's receive on this channel began "
          "while this one waited for transfer ", res_.n, ", and took its place. A function's "
          "steps run one at a time on its channels, so this step had been given up by its "
          "caller (a step run again after a failure, whose cancellation did not reach this "
          "task) or two calls of the function overlap (serialize them)");
    }

    // Reserve fails only when every slot is held by an earlier receive that has not let go.
    // A step takes each channel's transfer once, and the steps of one instantiation run one
    // at a time, so that means calls overlap, or a consumer kept an aliased slot.
    absl::Status AllSlotsHeld(const rdmadev::Error& e) const {
      return tensorflow::errors::FailedPrecondition(
          "rdmadev channel ", op_->channel_, ": ", e.what(),
          " by earlier receives in this task",
          tag_ ? " (for " + std::to_string(static_cast<int>(kHeldSlotGraceS)) + " s)" : "",
          ". Either two calls of this function overlap here "
          "(rdmadev's channels carry one step of a function at a time: serialize the calls; "
          "rdmadev.optimize does for calls from Python threads, and a TF1 session must not run "
          "these fetches in two threads at once), or a consumer keeps a received tensor past "
          "its step (RDMADEV_ZERO_COPY_MIN_BYTES=1T turns zero-copy receive off)");
    }

    // The wait for transfer res_.n ended with `st`: takes its slot. True when the execution needs
    // another transfer (the next chunk, or a stale transfer was discarded); else it finished.
    bool Took(const rdmadev::Status& st) {
      trace_.Phase("rdmadev.wait_data", wait_since_);
      if (r_.ring->Superseded(res_)) {
        Finish(Superseded());
        return false;
      }
      if (!st.ok) {
        if (!r_.ring->Abandon(res_)) {
          rdmadev::LogEvent("channel " + op_->channel_ + ": transfer " + std::to_string(res_.n) +
                            " was given up while a later one was reserved (overlapping steps); "
                            "the channel is out of step");
        }
        Finish(WaitStatus(st, *r_.ring, op_->channel_));
        return false;
      }
      const uint32_t tag = r_.ring->TagAt(res_.n);
      if (tag_ && tag && tag != tag_ && !gathering_ && !FailedSteps::Global().Has(tag)) {
        if (foreign_grace_.infinite) foreign_grace_ = rdmadev::Deadline::After(kForeignTransferGraceS);
        if (!foreign_grace_.passed()) {
          LeaveForItsStep(tag);
          return false;
        }
      }
      foreign_grace_ = rdmadev::Deadline::Never();
      try {
        rdmadev::Slot slot = r_.ring->Take(res_);
        if (slot.moved) {  // the sender moved to the successor ring: wait there
          r_.ring->Retire();
          auto next = rdmadev::ChannelRegistry::Global().AdvanceReceiver(op_->channel_);
          std::lock_guard<std::mutex> lock(mu_);  // Cancel reads r_ from another thread
          r_ = std::move(next);
          return true;
        }
        if (gathering_ && (slot.staged || slot.dead)) {
          r_.ring->Release(slot.seq, rdmadev::Deadline::After(60));
          Finish(tensorflow::errors::InvalidArgument(
              "rdmadev channel ", op_->channel_, ": a staged or dead transfer where the tensor's next "
              "chunk was due (", filled_, " of ", total_, " bytes received): the sender does "
              "not follow the protocol"));
          return false;
        }
        if (gathering_) {
          auto s = Gather(slot);
          if (!s.ok() || filled_ == total_) {
            Finish(s);
            return false;
          }
          return true;
        }
        if (tag_ && slot.tag && slot.tag != tag_) {  // a failed step's, late
          r_.ring->Discard(res_.n, rdmadev::Deadline::After(60));
          return true;
        }
        if (slot.dead) {
          r_.ring->Release(slot.seq, rdmadev::Deadline::After(60));
          // A transfer node outputs nothing: TF's executor makes that a dead tensor.
          Finish(op_->transfer_node_ ? absl::OkStatus()
                                     : tensorflow::errors::InvalidArgument(
                                           "rdmadev channel ", op_->channel_, ": the sender's "
                                           "tensor is dead, which only a labelled _Recv can output: "
                                           "the two halves were not swapped alike"));
          return false;
        }
        if (slot.staged) {
          Finish(DeliverStaged(slot));
          return false;
        }
        auto s = slot.shape ? DeliverDynamic(slot) : Deliver(slot, op_->static_shape_);
        if (!s.ok() || !gathering_) {
          Finish(s);
          return false;
        }
        return true;
      } catch (const rdmadev::Error& e) {
        Finish(ToStatus(e));
        return false;
      }
    }

    // The shape the sender wrote in `slot`'s shape block, checked against the plan's and the
    // limit: what a peer claims never makes this process allocate more than max_bytes.
    tensorflow::Status ShapeOf(const rdmadev::Slot& slot, TensorShape* shape, uint64_t* bytes) {
      const RecvOp& op = *op_;
      const auto& lay = r_.ring->layout();
      uint64_t rank;
      std::memcpy(&rank, slot.shape + rdmadev::kShapeRankOffset, sizeof rank);
      if (rank > lay.rank_capacity()) {
        return tensorflow::errors::InvalidArgument(
            "rdmadev channel ", op.channel_, ": the sender claims rank ", rank,
            ", more than the channel's shape block holds (", lay.rank_capacity(), ")");
      }
      for (uint64_t i = 0; i < rank; ++i) {
        int64_t d;
        std::memcpy(&d, slot.shape + rdmadev::kShapeDimsOffset + i * rdmadev::kShapeDimBytes, sizeof d);
        auto s = shape->AddDimWithStatus(d);
        if (!s.ok()) {
          return tensorflow::errors::InvalidArgument("rdmadev channel ", op.channel_,
                                                     ": the sender's shape is not valid: ", s.message());
        }
      }
      if (!op.shape_.IsCompatibleWith(*shape)) {
        return tensorflow::errors::InvalidArgument(
            "rdmadev channel ", op.channel_, ": the sender's shape ", shape->DebugString(),
            " does not match the planned ", op.shape_.DebugString());
      }
      const uint64_t size = tensorflow::DataTypeSize(op.dtype_);
      const uint64_t n = static_cast<uint64_t>(shape->num_elements());
      if (size && n > std::numeric_limits<uint64_t>::max() / size) {
        return tensorflow::errors::InvalidArgument("rdmadev channel ", op.channel_,
                                                   ": the sender's shape ", shape->DebugString(),
                                                   " overflows 64-bit bytes");
      }
      *bytes = n * size;
      if (op.max_bytes_ > 0 && *bytes > static_cast<uint64_t>(op.max_bytes_)) {
        return tensorflow::errors::ResourceExhausted(
            "rdmadev channel ", op.channel_, ": the sender's ", shape->DebugString(), " ",
            tensorflow::DataTypeString(op.dtype_), " tensor of ", *bytes, " bytes exceeds ",
            kMaxTensorSetting, "=", op.max_bytes_, " on this task; raise it on every task");
      }
      return absl::OkStatus();
    }

    // The first slot of a dynamic channel's transfer: the whole tensor, or its first chunk
    // (a full slot) after which Gather takes the rest.
    tensorflow::Status DeliverDynamic(const rdmadev::Slot& slot) {
      const RecvOp& op = *op_;
      TensorShape shape;
      uint64_t bytes = 0;
      auto s = ShapeOf(slot, &shape, &bytes);
      if (s.ok() && bytes == slot.length) return Deliver(slot, shape);
      if (s.ok() && (bytes < slot.length || slot.length != r_.ring->layout().capacity)) {
        s = tensorflow::errors::InvalidArgument(
            "rdmadev channel ", op.channel_, " delivered ", slot.length, " bytes for a ",
            shape.DebugString(), " ", tensorflow::DataTypeString(op.dtype_), " of ", bytes,
            ": the sender does not follow the protocol");
      }
      if (s.ok()) {
        s = Output(shape, bytes, &dst_);
        if (s.ok()) {
          CopyOut(dst_, slot.data, slot.length);
          Count(slot.length);
          filled_ = slot.length;
          total_ = bytes;
          gathering_ = true;
        }
      }
      r_.ring->Release(slot.seq, rdmadev::Deadline::After(60));
      return s;
    }

    // A staged tensor (stage.h): read from the sender's stage straight into the output, then
    // the slot released, which frees the stage. The channel then wants slots that hold it.
    tensorflow::Status DeliverStaged(const rdmadev::Slot& slot) {
      TensorShape shape;
      uint64_t bytes = 0;
      auto s = ShapeOf(slot, &shape, &bytes);
      char* dst = nullptr;
      try {
        const auto record = rdmadev::StageRecord::Decode(slot.data, slot.length);
        if (s.ok()) s = Output(shape, bytes, &dst);
        if (s.ok()) {
          const int64_t since = trace_.Mark();
          r_.staged->Read(*r_.ring->endpoint(), record, dst, bytes, deadline_);
          trace_.Phase("rdmadev.copy", since);
          Count(bytes);
          r_.ring->Want(bytes);
        }
      } catch (const rdmadev::Error& e) {  // a bad record is the sender's fault, as a bad shape
        const auto kind = e.kind() == rdmadev::ErrorKind::kProtocol ? rdmadev::ErrorKind::kBounds
                                                                    : e.kind();
        s = ToStatus(kind, "rdmadev channel " + op_->channel_ + ": " + e.what() +
                               (e.hint().empty() ? "" : ". Fix: " + e.hint()));
      }
      r_.ring->Release(slot.seq, rdmadev::Deadline::After(60));
      return s;
    }

    // A later chunk of the tensor being gathered: exactly the next bytes of it.
    tensorflow::Status Gather(const rdmadev::Slot& slot) {
      const RecvOp& op = *op_;
      const uint64_t want = std::min(total_ - filled_, r_.ring->layout().capacity);
      tensorflow::Status s;
      if (slot.length != want || (tag_ && slot.tag && slot.tag != tag_)) {
        s = tensorflow::errors::InvalidArgument(
            "rdmadev channel ", op.channel_, ": chunk of ", slot.length, " bytes where ", want,
            " of the tensor's ", total_, " were due (", filled_, " received): the sender does "
            "not follow the protocol");
        filled_ = total_;  // the transfer is over either way
      } else {
        CopyOut(dst_ + filled_, slot.data, want);
        Count(want);
        filled_ += want;
      }
      r_.ring->Release(slot.seq, rdmadev::Deadline::After(60));
      return s;
    }

    // Outputs the slot's tensor: aliased or copied, and the slot released when it can be.
    tensorflow::Status Deliver(const rdmadev::Slot& slot, const TensorShape& shape) {
      const RecvOp& op = *op_;
      if (!slot.shape && !op.fully_defined_) {
        r_.ring->Release(slot.seq, rdmadev::Deadline::After(60));
        return tensorflow::errors::InvalidArgument(
            "rdmadev channel ", op.channel_, " has static slots but the planned shape ",
            op.shape_.DebugString(), " is not fully defined: the plan does not match the graph");
      }
      const uint64_t want = shape.num_elements() * tensorflow::DataTypeSize(op.dtype_);
      if (slot.length != want) {
        r_.ring->Release(slot.seq, rdmadev::Deadline::After(60));
        return tensorflow::errors::InvalidArgument(
            "rdmadev channel ", op.channel_, " delivered ", slot.length, " bytes where ",
            shape.DebugString(), " ", tensorflow::DataTypeString(op.dtype_), " needs ", want,
            ": the sender's tensor does not match the plan");
      }
      // Aliasing is the planner's decision (zero_copy): credits return in order, so a
      // received tensor that stays alive (returned, stored, forwarded into a variable)
      // stops the sender K transfers later, and only the planner can tell that every
      // consumer is done with it within the step. Its size threshold (the plan's
      // zero_copy_min_bytes) applies here, where a dynamic channel's size is known, and one
      // run-time guard: alias only while another slot stays free. A ring of one slot (a
      // static channel, one tensor per step) aliases anyway: its sender writes the next
      // step's tensor only after TF has freed this one, which happens within this step.
      if (op.zero_copy_ && want >= static_cast<uint64_t>(op.zero_copy_min_bytes_) &&
          r_.ring->held() < std::max<uint32_t>(r_.ring->layout().slots, 2)) {
        auto* buf = new SlotBuffer(slot, r_.ring);
        Tensor out(op.dtype_, shape, buf);
        buf->Unref();
        ctx_->set_output(0, out);
        Count(want);
        return absl::OkStatus();
      }
      char* dst = nullptr;
      auto s = Output(shape, want, &dst);
      if (s.ok() && want) CopyOut(dst, slot.data, want);
      if (s.ok()) Count(want);
      r_.ring->Release(slot.seq, rdmadev::Deadline::After(60));
      return s;
    }

    // The output of a receive that copies, `bytes` at *dst: in one of the kernel's warm
    // buffers from kWarmMinBytes on where it keeps them (warm.h), else in TF's memory.
    tensorflow::Status Output(const TensorShape& shape, uint64_t bytes, char** dst) {
      if (op_->warm_ && bytes >= kWarmMinBytes) {
        bool reused = false;
        Tensor out = op_->warm_->Take(op_->dtype_, shape, bytes, &reused);
        if (!out.IsInitialized()) {
          return tensorflow::errors::ResourceExhausted(
              "rdmadev channel ", op_->channel_, ": out of memory for a received tensor of ",
              bytes, " bytes");
        }
        if (reused) rdmadev::CountWarm();
        *dst = const_cast<char*>(out.tensor_data().data());
        ctx_->set_output(0, out);
        return absl::OkStatus();
      }
      Tensor* out = nullptr;
      auto s = ctx_->allocate_output(0, shape, &out);
      if (s.ok()) *dst = const_cast<char*>(out->tensor_data().data());
      return s;
    }

    // Copies a slot's payload into the output tensor, timed for the trace.
    void CopyOut(char* dst, const uint8_t* src, uint64_t n) {
      const int64_t since = trace_.Mark();
      std::memcpy(dst, src, n);
      trace_.Phase("rdmadev.copy", since);
    }

    // For the trace: a slot's bytes delivered into the output.
    void Count(uint64_t bytes) {
      received_ += bytes;
      ++chunks_;
    }

    void Finish(const tensorflow::Status& s) {
      trace_.End("rdmadev.recv", op_->channel_, r_.peer, received_, chunks_);
      if (!s.ok()) FailedSteps::Global().Add(tag_);
      if (s.ok() && gathering_) r_.ring->Want(total_);  // it came in chunks: grow the ring
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

  std::string channel_;
  DataType dtype_;
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

REGISTER_KERNEL_BUILDER(Name("RdmadevSend").Device(tensorflow::DEVICE_CPU), SendOp);
REGISTER_KERNEL_BUILDER(Name("RdmadevRecv").Device(tensorflow::DEVICE_CPU), RecvOp);
REGISTER_KERNEL_BUILDER(Name("_Send").Device(tensorflow::DEVICE_CPU).Label(kTransferLabel), SendOp);
REGISTER_KERNEL_BUILDER(Name("_HostSend").Device(tensorflow::DEVICE_CPU).Label(kTransferLabel), SendOp);
REGISTER_KERNEL_BUILDER(Name("_Recv").Device(tensorflow::DEVICE_CPU).Label(kTransferLabel), RecvOp);
REGISTER_KERNEL_BUILDER(Name("_HostRecv").Device(tensorflow::DEVICE_CPU).Label(kTransferLabel), RecvOp);

}  // namespace
}  // namespace rdmadev_tf
