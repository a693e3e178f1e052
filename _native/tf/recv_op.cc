// The RdmadevRecv kernel (and TF's own _Recv/_HostRecv of a pair the pass labelled): waits
// for the next transfer of its step on a channel and outputs it, aliasing the slot
// (zero-copy) or copied out of it, read from the sender's stage, or gathered from chunks;
// transfers a failed step left behind are discarded. ops.cc says which kernels own their
// channels and why.
#include <algorithm>
#include <atomic>
#include <cstring>
#include <functional>
#include <limits>
#include <memory>
#include <mutex>
#include <string>

#include "tensorflow/core/framework/cancellation.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/tensor.h"

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

namespace {

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

REGISTER_KERNEL_BUILDER(Name("RdmadevRecv").Device(tensorflow::DEVICE_CPU), RecvOp);
REGISTER_KERNEL_BUILDER(Name("_Recv").Device(tensorflow::DEVICE_CPU).Label(kTransferLabel), RecvOp);
REGISTER_KERNEL_BUILDER(Name("_HostRecv").Device(tensorflow::DEVICE_CPU).Label(kTransferLabel), RecvOp);

}  // namespace
}  // namespace rdmadev_tf
