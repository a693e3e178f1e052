// RecvOp's delivery modes (recv_delivery.h says which there are and how one is chosen).
#include "recv_delivery.h"

#include <algorithm>
#include <cstring>
#include <limits>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "tensorflow/core/framework/tensor.h"
#include "tensorflow/core/framework/tensor_shape.h"

namespace rdmadev_tf {

using tensorflow::DataType;
using tensorflow::OpKernelConstruction;
using tensorflow::PartialTensorShape;
using tensorflow::Tensor;
using tensorflow::TensorShape;
using Receiver = rdmadev::ChannelRegistry::Receiver;

namespace {

// A static channel's transfer: a tensor of the planned shape, exactly its bytes in one slot.
class StaticDelivery : public Delivery {
 public:
  StaticDelivery(PartialTensorShape planned, DataType dtype, std::string channel,
                 std::shared_ptr<const SlotOutput> put)
      : planned_(std::move(planned)), dtype_(dtype), channel_(std::move(channel)),
        put_(std::move(put)) {
    fully_defined_ = planned_.AsTensorShape(&shape_);
  }

  absl::Status Deliver(const rdmadev::Slot& slot, const Receiver& r, Outlet& out,
                       std::unique_ptr<Chunks>*) const override {
    if (!fully_defined_) {
      ReleaseSlot(r, slot.seq);
      return tensorflow::errors::InvalidArgument(
          "rdmadev channel ", channel_, " has static slots but the planned shape ",
          planned_.DebugString(), " is not fully defined: the plan does not match the graph");
    }
    const uint64_t want = shape_.num_elements() * tensorflow::DataTypeSize(dtype_);
    if (slot.length != want) {
      ReleaseSlot(r, slot.seq);
      return tensorflow::errors::InvalidArgument(
          "rdmadev channel ", channel_, " delivered ", slot.length, " bytes where ",
          shape_.DebugString(), " ", tensorflow::DataTypeString(dtype_), " needs ", want,
          ": the sender's tensor does not match the plan");
    }
    return put_->Put(slot, shape_, want, r, out);
  }

 private:
  const PartialTensorShape planned_;
  TensorShape shape_;  // planned_, when fully defined
  bool fully_defined_ = false;
  const DataType dtype_;
  const std::string channel_;
  const std::shared_ptr<const SlotOutput> put_;
};

// A staged tensor (stage.h): read from the sender's stage straight into the output, then
// the slot released, which frees the stage. The channel then wants slots that hold it.
class StagedRead {
 public:
  StagedRead(std::string channel, std::shared_ptr<const CopiedOutput> copied)
      : channel_(std::move(channel)), copied_(std::move(copied)) {}

  // `s` says whether the slot's shape block was good (ShapeBlockDelivery::ShapeOf), which
  // gave `shape` and `bytes`.
  absl::Status Read(const rdmadev::Slot& slot, absl::Status s, const TensorShape& shape,
                    uint64_t bytes, const Receiver& r, Outlet& out) const {
    char* dst = nullptr;
    try {
      const auto record = rdmadev::StageRecord::Decode(slot.data, slot.length);
      if (s.ok()) s = copied_->Allocate(shape, bytes, out, &dst);
      if (s.ok()) {
        const int64_t since = out.trace().Mark();
        r.staged->Read(*r.ring->endpoint(), record, dst, bytes, out.deadline());
        out.trace().Phase("rdmadev.copy", since);
        out.Count(bytes);
        r.ring->Want(bytes);
      }
    } catch (const rdmadev::Error& e) {  // a bad record is the sender's fault, as a bad shape
      const auto kind = e.kind() == rdmadev::ErrorKind::kProtocol ? rdmadev::ErrorKind::kBounds
                                                                  : e.kind();
      s = ToStatus(kind, "rdmadev channel " + channel_ + ": " + e.what() +
                             (e.hint().empty() ? "" : ". Fix: " + e.hint()));
    }
    ReleaseSlot(r, slot.seq);
    return s;
  }

 private:
  const std::string channel_;
  const std::shared_ptr<const CopiedOutput> copied_;
};

// A dynamic channel's transfer: the shape the sender wrote in the slot's shape block, checked
// against the plan's and the limit; then the whole tensor in the slot, a staged one, or the
// first chunk of one larger than a slot (a full slot, after which Chunks takes the rest).
class ShapeBlockDelivery : public Delivery {
 public:
  ShapeBlockDelivery(PartialTensorShape planned, DataType dtype, int64_t max_bytes,
                     std::string channel, std::shared_ptr<const SlotOutput> put,
                     std::shared_ptr<const CopiedOutput> copied)
      : planned_(std::move(planned)), dtype_(dtype), max_bytes_(max_bytes), channel_(channel),
        put_(std::move(put)), copied_(copied), staged_(std::move(channel), std::move(copied)) {}

  absl::Status Deliver(const rdmadev::Slot& slot, const Receiver& r, Outlet& out,
                       std::unique_ptr<Chunks>* rest) const override {
    TensorShape shape;
    uint64_t bytes = 0;
    auto s = ShapeOf(slot, r, &shape, &bytes);
    if (slot.staged) return staged_.Read(slot, s, shape, bytes, r, out);
    if (s.ok() && bytes == slot.length) return put_->Put(slot, shape, bytes, r, out);
    if (s.ok() && (bytes < slot.length || slot.length != r.ring->layout().capacity)) {
      s = tensorflow::errors::InvalidArgument(
          "rdmadev channel ", channel_, " delivered ", slot.length, " bytes for a ",
          shape.DebugString(), " ", tensorflow::DataTypeString(dtype_), " of ", bytes,
          ": the sender does not follow the protocol");
    }
    if (s.ok()) {
      char* dst = nullptr;
      s = copied_->Allocate(shape, bytes, out, &dst);
      if (s.ok()) {
        out.CopyOut(dst, slot.data, slot.length);
        out.Count(slot.length);
        *rest = std::make_unique<Chunks>(channel_, dst, slot.length, bytes);
      }
    }
    ReleaseSlot(r, slot.seq);
    return s;
  }

 private:
  // The shape the sender wrote in `slot`'s shape block, checked against the plan's and the
  // limit: what a peer claims never makes this process allocate more than max_bytes.
  absl::Status ShapeOf(const rdmadev::Slot& slot, const Receiver& r, TensorShape* shape,
                       uint64_t* bytes) const {
    const auto& lay = r.ring->layout();
    uint64_t rank;
    std::memcpy(&rank, slot.shape + rdmadev::kShapeRankOffset, sizeof rank);
    if (rank > lay.rank_capacity()) {
      return tensorflow::errors::InvalidArgument(
          "rdmadev channel ", channel_, ": the sender claims rank ", rank,
          ", more than the channel's shape block holds (", lay.rank_capacity(), ")");
    }
    for (uint64_t i = 0; i < rank; ++i) {
      int64_t d;
      std::memcpy(&d, slot.shape + rdmadev::kShapeDimsOffset + i * rdmadev::kShapeDimBytes,
                  sizeof d);
      auto s = shape->AddDimWithStatus(d);
      if (!s.ok()) {
        return tensorflow::errors::InvalidArgument(
            "rdmadev channel ", channel_, ": the sender's shape is not valid: ", s.message());
      }
    }
    if (!planned_.IsCompatibleWith(*shape)) {
      return tensorflow::errors::InvalidArgument(
          "rdmadev channel ", channel_, ": the sender's shape ", shape->DebugString(),
          " does not match the planned ", planned_.DebugString());
    }
    const uint64_t size = tensorflow::DataTypeSize(dtype_);
    const uint64_t n = static_cast<uint64_t>(shape->num_elements());
    if (size && n > std::numeric_limits<uint64_t>::max() / size) {
      return tensorflow::errors::InvalidArgument("rdmadev channel ", channel_,
                                                 ": the sender's shape ", shape->DebugString(),
                                                 " overflows 64-bit bytes");
    }
    *bytes = n * size;
    if (max_bytes_ > 0 && *bytes > static_cast<uint64_t>(max_bytes_)) {
      return tensorflow::errors::ResourceExhausted(
          "rdmadev channel ", channel_, ": the sender's ", shape->DebugString(), " ",
          tensorflow::DataTypeString(dtype_), " tensor of ", *bytes, " bytes exceeds ",
          kMaxTensorSetting, "=", max_bytes_, " on this task; raise it on every task");
    }
    return absl::OkStatus();
  }

  const PartialTensorShape planned_;
  const DataType dtype_;
  const int64_t max_bytes_;  // the most a dynamic tensor may carry (0: no limit)
  const std::string channel_;
  const std::shared_ptr<const SlotOutput> put_;
  const std::shared_ptr<const CopiedOutput> copied_;
  const StagedRead staged_;
};

// A bundle's transfer (RdmadevRecvBundle): the small static tensors of a step, each at its
// planned offset in the slot's payload, copied out into their own outputs.
class BundleDelivery : public Delivery {
 public:
  // One tensor of the bundle: output i, `bytes` at `offset` in the payload.
  struct Member {
    DataType dtype;
    TensorShape shape;
    uint64_t offset, bytes;
  };

  BundleDelivery(std::vector<Member> members, uint64_t span, std::string channel)
      : members_(std::move(members)), span_(span), channel_(std::move(channel)) {}

  // From the bundle's attributes: each tensor of static shape at its offset, in order.
  static absl::Status Build(OpKernelConstruction* c, const std::string& channel,
                            std::unique_ptr<const Delivery>* out) {
    std::vector<DataType> dtypes;
    std::vector<PartialTensorShape> shapes;
    std::vector<int64_t> offsets;
    TF_RETURN_IF_ERROR(c->GetAttr("dtypes", &dtypes));
    TF_RETURN_IF_ERROR(c->GetAttr("shapes", &shapes));
    TF_RETURN_IF_ERROR(c->GetAttr("offsets", &offsets));
    if (dtypes.empty() || shapes.size() != dtypes.size() || offsets.size() != dtypes.size()) {
      return tensorflow::errors::InvalidArgument("rdmadev bundle ", channel, " has ",
                                                 dtypes.size(), " dtypes, ", shapes.size(),
                                                 " shapes and ", offsets.size(), " offsets");
    }
    std::vector<Member> members;
    uint64_t end = 0;
    for (size_t i = 0; i < dtypes.size(); ++i) {
      Member m{dtypes[i], {}, static_cast<uint64_t>(offsets[i]), 0};
      if (!shapes[i].AsTensorShape(&m.shape) || !tensorflow::DataTypeCanUseMemcpy(dtypes[i]) ||
          offsets[i] < 0 || m.offset < end) {
        return tensorflow::errors::InvalidArgument(
            "rdmadev bundle ", channel, ": tensor ", i, " (",
            tensorflow::DataTypeString(dtypes[i]), " ", shapes[i].DebugString(), " at ",
            offsets[i], ") is not a static plain-bytes tensor after the previous one: the plan "
            "does not match the graph");
      }
      m.bytes = m.shape.num_elements() * tensorflow::DataTypeSize(m.dtype);
      end = m.offset + m.bytes;
      members.push_back(m);
    }
    *out = std::make_unique<BundleDelivery>(std::move(members), end, channel);
    return absl::OkStatus();
  }

  absl::Status Deliver(const rdmadev::Slot& slot, const Receiver& r, Outlet& out,
                       std::unique_ptr<Chunks>*) const override {
    absl::Status s;
    if (slot.length != span_) {
      s = tensorflow::errors::InvalidArgument("rdmadev bundle ", channel_, " delivered ",
                                              slot.length, " bytes where its tensors span ",
                                              span_, ": the sender's tensors do not match the plan");
    }
    uint64_t carried = 0;  // the tensors' bytes, without the gaps between them
    for (size_t i = 0; s.ok() && i < members_.size(); ++i) {
      const Member& m = members_[i];
      Tensor* t = nullptr;
      s = out.ctx()->allocate_output(static_cast<int>(i), m.shape, &t);
      if (s.ok() && m.bytes) {
        out.CopyOut(const_cast<char*>(t->tensor_data().data()), slot.data + m.offset, m.bytes);
      }
      carried += m.bytes;
    }
    if (s.ok()) out.Count(carried);
    ReleaseSlot(r, slot.seq);
    return s;
  }

 private:
  const std::vector<Member> members_;  // in output order
  const uint64_t span_;                // the payload's bytes: the last tensor's end
  const std::string channel_;
};

}  // namespace

absl::Status Chunks::Add(const rdmadev::Slot& slot, const Receiver& r, Outlet& out) {
  if (slot.staged || slot.dead) {
    ReleaseSlot(r, slot.seq);
    return tensorflow::errors::InvalidArgument(
        "rdmadev channel ", channel_, ": a staged or dead transfer where the tensor's next "
        "chunk was due (", filled_, " of ", total_, " bytes received): the sender does "
        "not follow the protocol");
  }
  const uint64_t want = std::min(total_ - filled_, r.ring->layout().capacity);
  absl::Status s;
  if (slot.length != want || (out.tag() && slot.tag && slot.tag != out.tag())) {
    s = tensorflow::errors::InvalidArgument(
        "rdmadev channel ", channel_, ": chunk of ", slot.length, " bytes where ", want,
        " of the tensor's ", total_, " were due (", filled_, " received): the sender does "
        "not follow the protocol");
    filled_ = total_;  // the transfer is over either way
  } else {
    out.CopyOut(dst_ + filled_, slot.data, want);
    out.Count(want);
    filled_ += want;
  }
  ReleaseSlot(r, slot.seq);
  return s;
}

absl::Status Deliveries::Build(OpKernelConstruction* c, const std::string& channel,
                               std::unique_ptr<const Deliveries>* out) {
  auto d = std::unique_ptr<Deliveries>(new Deliveries);
  if (c->def().op() == "RdmadevRecvBundle") {
    TF_RETURN_IF_ERROR(BundleDelivery::Build(c, channel, &d->bundle_));
    *out = std::move(d);
    return absl::OkStatus();
  }
  DataType dtype;
  PartialTensorShape planned;
  bool zero_copy = false;
  int64_t zero_copy_min_bytes = 0;  // alias only tensors of at least this many bytes
  int64_t max_bytes = 0;            // the most a dynamic tensor may carry (0: no limit)
  TF_RETURN_IF_ERROR(c->GetAttr(IsTransferNode(c) ? "tensor_type" : "dtype", &dtype));
  TF_RETURN_IF_ERROR(c->GetAttr(Setting(c, "shape"), &planned));
  TF_RETURN_IF_ERROR(c->GetAttr(Setting(c, "zero_copy"), &zero_copy));
  TF_RETURN_IF_ERROR(c->GetAttr(Setting(c, "zero_copy_min_bytes"), &zero_copy_min_bytes));
  TF_RETURN_IF_ERROR(c->GetAttr(Setting(c, "max_bytes"), &max_bytes));
  if (!tensorflow::DataTypeCanUseMemcpy(dtype)) {
    return tensorflow::errors::InvalidArgument("rdmadev channel ", channel, " cannot carry ",
                                               tensorflow::DataTypeString(dtype));
  }
  std::shared_ptr<const CopiedOutput> copied = std::make_shared<CopiedOutput>(c, dtype, channel);
  std::shared_ptr<const SlotOutput> put = copied;
  if (zero_copy) put = std::make_shared<AliasedOutput>(dtype, zero_copy_min_bytes, copied);
  d->static_ = std::make_unique<StaticDelivery>(planned, dtype, channel, put);
  d->shape_block_ =
      std::make_unique<ShapeBlockDelivery>(planned, dtype, max_bytes, channel, put, copied);
  *out = std::move(d);
  return absl::OkStatus();
}

const Delivery& Deliveries::For(const rdmadev::RingLayout& layout) const {
  if (bundle_) return *bundle_;
  return layout.shape_bytes() ? *shape_block_ : *static_;
}

}  // namespace rdmadev_tf
