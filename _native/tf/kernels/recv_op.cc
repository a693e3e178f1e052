// RecvOp (recv_op.h): the kernel, and the wait of one execution for its step's transfer
// (reserving a slot, parking on the progress thread, a slot held by an earlier step, another
// step's transfer found first). The kernel's delivery modes make it the output
// (recv_delivery.h).
#include <memory>
#include <mutex>
#include <string>

#include "recv_op.h"

namespace rdmadev_tf {
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

}  // namespace

RecvOp::RecvOp(OpKernelConstruction* c)
    : AsyncOpKernel(c), transfer_node_(IsTransferNode(c)), tf_path_(c) {
  OP_REQUIRES_OK(c, c->GetAttr(Setting(c, "channel"), &channel_));
  OP_REQUIRES_OK(c, Deliveries::Build(c, channel_, &deliveries_));
  OP_REQUIRES_OK(c, c->GetAttr(Setting(c, "timeout_s"), &timeout_s_));
  OP_REQUIRES_OK(c, c->GetAttr(Setting(c, "owned"), &owned_));
  if (owned_) rdmadev::ChannelRegistry::Global().Hold(channel_, rdmadev::ChannelRegistry::kRecv);
}

RecvOp::~RecvOp() {
  if (owned_) rdmadev::ChannelRegistry::Global().LetGo(channel_, rdmadev::ChannelRegistry::kRecv);
}

void RecvOp::ComputeAsync(OpKernelContext* ctx, DoneCallback done) {
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
  if (!r.ring) {  // a half pair kept on TF's path (registry.h KeepOnTf)
    tf_path_.RecvAsync(ctx, std::move(done));
    return;
  }
  // Step tags are compared on channels the control plane set up for an instantiation
  // (they name their peer), whose two halves always run in the same multi-task step; a
  // channel bound by hand may pair halves of different steps (eager ops run as functions
  // of their own), so it never discards.
  const uint32_t tag = r.peer.empty() ? 0 : StepTagOf(ctx);
  std::make_shared<Receive>(this, ctx, std::move(done), std::move(r), tag, deadline)->Start();
}

RecvOp::Receive::Receive(const RecvOp* op, OpKernelContext* ctx, DoneCallback done,
                         rdmadev::ChannelRegistry::Receiver r, uint32_t tag,
                         rdmadev::Deadline deadline)
    : op_(op), ctx_(ctx), done_(std::move(done)), r_(std::move(r)),
      delivery_(&op->deliveries_->For(r_.ring->layout())), tag_(tag), deadline_(deadline),
      cm_(ctx->cancellation_manager()), out_(ctx, tag, deadline) {
  out_.trace().Begin();
}

void RecvOp::Receive::Start() {
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

void RecvOp::Receive::Cancel() {
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
void RecvOp::Receive::Wait() {
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
    wait_since_ = out_.trace().Mark();
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
absl::Status RecvOp::Receive::Park(uint64_t gen, const std::atomic<uint64_t>* word,
                                   uint64_t target, rdmadev::Deadline until,
                                   rdmadev::Liveness alive,
                                   std::function<void(const rdmadev::Status&)> then,
                                   std::string what) {
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
void RecvOp::Receive::WaitForASlot(uint64_t gen, uint64_t let_go, const rdmadev::Error& e) {
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
void RecvOp::Receive::LeaveForItsStep(uint32_t tag) {
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
bool RecvOp::Receive::Placed(uint32_t tag) const {
  return r_.ring->Superseded(res_) || FailedSteps::Global().Has(tag);
}

// This receive's place went to a later step's receive (RingReceiver::Reserve).
absl::Status RecvOp::Receive::Superseded() const {
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
absl::Status RecvOp::Receive::AllSlotsHeld(const rdmadev::Error& e) const {
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
bool RecvOp::Receive::Took(const rdmadev::Status& st) {
  out_.trace().Phase("rdmadev.wait_data", wait_since_);
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
  if (tag_ && tag && tag != tag_ && !chunks_ && !FailedSteps::Global().Has(tag)) {
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
      delivery_ = &op_->deliveries_->For(r_.ring->layout());
      return true;
    }
    if (chunks_) {
      auto s = chunks_->Add(slot, r_, out_);
      if (!s.ok() || chunks_->done()) {
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
      ReleaseSlot(r_, slot.seq);
      // A transfer node outputs nothing: TF's executor makes that a dead tensor.
      Finish(op_->transfer_node_ ? absl::OkStatus()
                                 : tensorflow::errors::InvalidArgument(
                                       "rdmadev channel ", op_->channel_, ": the sender's "
                                       "tensor is dead, which only a labelled _Recv can output: "
                                       "the two halves were not swapped alike"));
      return false;
    }
    auto s = delivery_->Deliver(slot, r_, out_, &chunks_);
    if (!s.ok() || !chunks_) {
      Finish(s);
      return false;
    }
    return true;
  } catch (const rdmadev::Error& e) {
    Finish(ToStatus(e));
    return false;
  }
}

void RecvOp::Receive::Finish(const tensorflow::Status& s) {
  out_.trace().End("rdmadev.recv", op_->channel_, r_.peer, out_.received(), out_.chunks());
  if (!s.ok()) FailedSteps::Global().Add(tag_);
  if (s.ok() && chunks_) r_.ring->Want(chunks_->total());  // it came in chunks: grow the ring
  if (cm_) cm_->TryDeregisterCallback(token_);  // drops the callback's reference to this
  if (!s.ok()) ctx_->SetStatus(s);
  done_();
}

REGISTER_KERNEL_BUILDER(Name("RdmadevRecv").Device(tensorflow::DEVICE_CPU), RecvOp);
REGISTER_KERNEL_BUILDER(Name("RdmadevRecvBundle").Device(tensorflow::DEVICE_CPU), RecvOp);
REGISTER_KERNEL_BUILDER(Name("_Recv").Device(tensorflow::DEVICE_CPU).Label(kTransferLabel), RecvOp);
REGISTER_KERNEL_BUILDER(Name("_HostRecv").Device(tensorflow::DEVICE_CPU).Label(kTransferLabel), RecvOp);

}  // namespace rdmadev_tf
