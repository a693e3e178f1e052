// SendOp's modes (send_write.h says which there are and how one is chosen).
#include "send_write.h"

#include <algorithm>
#include <cstring>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "tensorflow/core/framework/tensor_shape.h"

namespace rdmadev_tf {

using tensorflow::OpKernelContext;
using tensorflow::Tensor;
using tensorflow::TensorShape;
using Sender = rdmadev::ChannelRegistry::Sender;

namespace {

// RdmadevSend's (and a labelled _Send's) payload: its one input.
class TensorPayload : public Payload {
 public:
  absl::Status Take(OpKernelContext* ctx, Tensor* x) const override {
    *x = ctx->input(0);
    return absl::OkStatus();
  }
};

// A bundle's tensors at their offsets in one buffer, which goes as one static transfer (the
// ring refuses more bytes than its slots hold). The bytes between them are zeroed: a slot
// never carries this process's stale memory.
class BundlePayload : public Payload {
 public:
  BundlePayload(std::vector<int64_t> offsets, std::string channel)
      : offsets_(std::move(offsets)), channel_(std::move(channel)) {}

  absl::Status Take(OpKernelContext* ctx, Tensor* out) const override {
    uint64_t end = 0;
    for (int i = 0; i < ctx->num_inputs(); ++i) {
      const Tensor& x = ctx->input(i);
      if (!tensorflow::DataTypeCanUseMemcpy(x.dtype()) || offsets_[i] < 0 ||
          static_cast<uint64_t>(offsets_[i]) < end) {
        return tensorflow::errors::InvalidArgument(
            "rdmadev bundle ", channel_, ": tensor ", i, " (",
            tensorflow::DataTypeString(x.dtype()), " ", x.shape().DebugString(),
            ") cannot go at offset ", offsets_[i], " after ", end,
            " bytes: the plan does not match the graph");
      }
      end = offsets_[i] + x.tensor_data().size();
    }
    TF_RETURN_IF_ERROR(ctx->allocate_temp(tensorflow::DT_UINT8,
                                          TensorShape({static_cast<int64_t>(end)}), out));
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

 private:
  const std::vector<int64_t> offsets_;  // where each input goes
  const std::string channel_;
};

// A static channel's write: the whole tensor in one slot.
class WholeWrite : public TensorWrite {
 public:
  explicit WholeWrite(Tensor x) : x_(std::move(x)) {}

  bool Staging(const Sender&) const override { return false; }

  bool Next(const Sender& s, const rdmadev::Deadline& deadline, uint32_t tag,
            TransferTrace& trace, uint64_t* chunks) override {
    const auto data = x_.tensor_data();
    const int64_t since = trace.Mark();
    s.ring->Send(data.data(), data.size(), deadline, tag);
    trace.Phase("rdmadev.write", since);
    ++*chunks;
    return true;
  }

 private:
  const Tensor x_;
};

// A dynamic channel's shape block for `shape` (channel.h): u64 rank, then u64 dims.
std::vector<uint64_t> ShapeBlock(const TensorShape& shape) {
  std::vector<uint64_t> block{static_cast<uint64_t>(shape.dims())};
  for (int i = 0; i < shape.dims(); ++i) block.push_back(static_cast<uint64_t>(shape.dim_size(i)));
  return block;
}

// A dynamic channel's write: the first slot carries the shape block. A tensor larger than a
// slot goes staged (stage.h) or in as many slot-sized chunks as it needs, each as soon as
// the receiver has given a slot back.
class ShapedWrite : public TensorWrite {
 public:
  ShapedWrite(Tensor x, std::string channel)
      : x_(std::move(x)), block_(ShapeBlock(x_.shape())), channel_(std::move(channel)) {}

  // Whether this tensor goes staged: larger than a slot, when the slots hold a stage record
  // but are smaller than the domain's stage_below_slot_bytes (larger slots pipeline chunks
  // better), and no stage was refused.
  bool Staging(const Sender& s) const override {
    const auto& lay = s.ring->layout();
    return !chunking_ && x_.tensor_data().size() > lay.capacity &&
           lay.capacity >= rdmadev::kStageRecordBytes &&
           lay.capacity < s.domain->options().stage_below_slot_bytes;
  }

  bool Next(const Sender& s, const rdmadev::Deadline& deadline, uint32_t tag,
            TransferTrace& trace, uint64_t* chunks) override {
    if (Staging(s) && SendStaged(s, deadline, tag, trace, chunks)) return true;
    const auto data = x_.tensor_data();
    const uint64_t len = data.size();
    const bool first = !started_;
    const uint64_t chunk = std::min(len - sent_, s.ring->layout().capacity);
    const int64_t since = trace.Mark();
    s.ring->Send(data.data() + sent_, chunk, deadline, tag, first ? block_.data() : nullptr,
                 first ? block_.size() * sizeof(uint64_t) : 0);
    trace.Phase("rdmadev.write", since);
    started_ = true;
    sent_ += chunk;
    ++*chunks;
    return sent_ >= len;
  }

 private:
  // Copies the tensor into the channel's stage and writes the record; false (chunks
  // instead) when the channel has no stage for it (Stage::Room).
  bool SendStaged(const Sender& s, const rdmadev::Deadline& deadline, uint32_t tag,
                  TransferTrace& trace, uint64_t* chunks) {
    const auto data = x_.tensor_data();
    const int64_t since = trace.Mark();
    std::shared_ptr<rdmadev::Region> stage = s.stage->Room(s.domain, data.size(), channel_);
    if (!stage) {
      chunking_ = true;
      return false;
    }
    std::memcpy(stage->base(), data.data(), data.size());
    rdmadev::StageRecord record{stage->desc(), 0, data.size()};
    const uint64_t n = s.ring->SendStaged(record.Encode(), deadline, tag, block_.data(),
                                          block_.size() * sizeof(uint64_t));
    s.stage->set_busy(n);
    rdmadev::CountStaged();
    trace.Phase("rdmadev.write", since);
    ++*chunks;
    return true;
  }

  const Tensor x_;
  const std::vector<uint64_t> block_;  // the shape block
  const std::string channel_;
  uint64_t sent_ = 0;
  bool started_ = false;
  bool chunking_ = false;  // the stage was refused: this tensor goes in chunks
};

}  // namespace

absl::Status Payload::Build(tensorflow::OpKernelConstruction* c, const std::string& channel,
                            std::unique_ptr<const Payload>* out) {
  if (c->def().op() != "RdmadevSendBundle") {
    *out = std::make_unique<TensorPayload>();
    return absl::OkStatus();
  }
  std::vector<int64_t> offsets;
  TF_RETURN_IF_ERROR(c->GetAttr("offsets", &offsets));
  if (static_cast<int>(offsets.size()) != c->num_inputs() || offsets.empty()) {
    return tensorflow::errors::InvalidArgument("rdmadev bundle ", channel, " has ",
                                               offsets.size(), " offsets for ", c->num_inputs(),
                                               " tensors");
  }
  *out = std::make_unique<BundlePayload>(std::move(offsets), channel);
  return absl::OkStatus();
}

absl::Status TensorWrite::For(const Tensor& x, const rdmadev::RingLayout& lay, int64_t max_bytes,
                              const std::string& channel, std::unique_ptr<TensorWrite>* out) {
  if (!lay.shape_bytes()) {
    *out = std::make_unique<WholeWrite>(x);
    return absl::OkStatus();
  }
  const uint64_t bytes = x.tensor_data().size();
  if (max_bytes > 0 && bytes > static_cast<uint64_t>(max_bytes)) {
    return tensorflow::errors::ResourceExhausted(
        "rdmadev channel ", channel, ": a ", x.shape().DebugString(), " ",
        tensorflow::DataTypeString(x.dtype()), " tensor of ", bytes, " bytes exceeds ",
        kMaxTensorSetting, "=", max_bytes,
        " (the most one tensor of a dynamic shape may carry); raise it on every task");
  }
  if (static_cast<uint64_t>(x.dims()) > lay.rank_capacity()) {
    return tensorflow::errors::InvalidArgument(
        "rdmadev channel ", channel, ": a tensor of rank ", x.dims(),
        " does not fit the channel's shape block (", lay.rank_capacity(),
        " dims): the plan does not match the graph");
  }
  if (lay.capacity == 0 && bytes != 0) {
    return tensorflow::errors::InvalidArgument(
        "rdmadev channel ", channel, " has slots of 0 bytes and cannot carry ", bytes,
        " bytes: give it a capacity (capacity_hints)");
  }
  *out = std::make_unique<ShapedWrite>(x, channel);
  return absl::OkStatus();
}

}  // namespace rdmadev_tf
