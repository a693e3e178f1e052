// RecvOp (recv_op.h), part two: the transfer an execution took made into the kernel's
// output: the shape a dynamic channel's sender wrote, checked; the slot aliased (zero-copy)
// or copied out; a staged tensor read from the sender's stage; chunks gathered.
#include <algorithm>
#include <cstring>
#include <limits>
#include <memory>
#include <string>

#include "recv_op.h"

namespace rdmadev_tf {
namespace {

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

}  // namespace

// The shape the sender wrote in `slot`'s shape block, checked against the plan's and the
// limit: what a peer claims never makes this process allocate more than max_bytes.
tensorflow::Status RecvOp::Receive::ShapeOf(const rdmadev::Slot& slot, TensorShape* shape,
                                            uint64_t* bytes) {
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
tensorflow::Status RecvOp::Receive::DeliverDynamic(const rdmadev::Slot& slot) {
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
tensorflow::Status RecvOp::Receive::DeliverStaged(const rdmadev::Slot& slot) {
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
tensorflow::Status RecvOp::Receive::Gather(const rdmadev::Slot& slot) {
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
tensorflow::Status RecvOp::Receive::Deliver(const rdmadev::Slot& slot, const TensorShape& shape) {
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

// A bundle's slot: each tensor copied out of it into its own output, then the slot released.
tensorflow::Status RecvOp::Receive::DeliverBundle(const rdmadev::Slot& slot) {
  const RecvOp& op = *op_;
  tensorflow::Status s;
  if (slot.length != static_cast<uint64_t>(op.static_shape_.num_elements())) {
    s = tensorflow::errors::InvalidArgument("rdmadev bundle ", op.channel_, " delivered ", slot.length,
                                            " bytes where its tensors span ", op.static_shape_.num_elements(),
                                            ": the sender's tensors do not match the plan");
  }
  uint64_t carried = 0;  // the tensors' bytes, without the gaps between them
  for (size_t i = 0; s.ok() && i < op.bundle_.size(); ++i) {
    const BundleMember& m = op.bundle_[i];
    Tensor* out = nullptr;
    s = ctx_->allocate_output(static_cast<int>(i), m.shape, &out);
    if (s.ok() && m.bytes) CopyOut(const_cast<char*>(out->tensor_data().data()), slot.data + m.offset, m.bytes);
    carried += m.bytes;
  }
  if (s.ok()) Count(carried);
  r_.ring->Release(slot.seq, rdmadev::Deadline::After(60));
  return s;
}

// The output of a receive that copies, `bytes` at *dst: in one of the kernel's warm
// buffers from kWarmMinBytes on where it keeps them (warm.h), else in TF's memory.
tensorflow::Status RecvOp::Receive::Output(const TensorShape& shape, uint64_t bytes, char** dst) {
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
void RecvOp::Receive::CopyOut(char* dst, const uint8_t* src, uint64_t n) {
  const int64_t since = trace_.Mark();
  std::memcpy(dst, src, n);
  trace_.Phase("rdmadev.copy", since);
}

// For the trace: a slot's bytes delivered into the output.
void RecvOp::Receive::Count(uint64_t bytes) {
  received_ += bytes;
  ++chunks_;
}

}  // namespace rdmadev_tf
