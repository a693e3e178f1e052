// How the tensor of one slot becomes RecvOp's output 0 (recv_output.h).
#include "recv_output.h"

#include <algorithm>
#include <cstring>
#include <memory>
#include <string>
#include <utility>

#include "tensorflow/core/framework/tensor.h"

namespace rdmadev_tf {

using tensorflow::Tensor;
using tensorflow::TensorShape;
using Receiver = rdmadev::ChannelRegistry::Receiver;

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

void Outlet::CopyOut(char* dst, const uint8_t* src, uint64_t n) {
  const int64_t since = trace_.Mark();
  std::memcpy(dst, src, n);
  trace_.Phase("rdmadev.copy", since);
}

CopiedOutput::CopiedOutput(tensorflow::OpKernelConstruction* c, tensorflow::DataType dtype,
                           std::string channel)
    : dtype_(dtype), channel_(std::move(channel)) {
  if (c->device()->GetAllocator(tensorflow::AllocatorAttributes())->Name() == kMallocAllocator) {
    warm_ = std::make_shared<WarmPool>();
  }
}

absl::Status CopiedOutput::Put(const rdmadev::Slot& slot, const TensorShape& shape,
                               uint64_t bytes, const Receiver& r, Outlet& out) const {
  char* dst = nullptr;
  auto s = Allocate(shape, bytes, out, &dst);
  if (s.ok() && bytes) out.CopyOut(dst, slot.data, bytes);
  if (s.ok()) out.Count(bytes);
  ReleaseSlot(r, slot.seq);
  return s;
}

absl::Status CopiedOutput::Allocate(const TensorShape& shape, uint64_t bytes, Outlet& out,
                                    char** dst) const {
  if (warm_ && bytes >= kWarmMinBytes) {
    bool reused = false;
    Tensor t = warm_->Take(dtype_, shape, bytes, &reused);
    if (!t.IsInitialized()) {
      return tensorflow::errors::ResourceExhausted(
          "rdmadev channel ", channel_, ": out of memory for a received tensor of ", bytes,
          " bytes");
    }
    if (reused) rdmadev::CountWarm();
    *dst = const_cast<char*>(t.tensor_data().data());
    out.ctx()->set_output(0, t);
    return absl::OkStatus();
  }
  Tensor* t = nullptr;
  auto s = out.ctx()->allocate_output(0, shape, &t);
  if (s.ok()) *dst = const_cast<char*>(t->tensor_data().data());
  return s;
}

absl::Status AliasedOutput::Put(const rdmadev::Slot& slot, const TensorShape& shape,
                                uint64_t bytes, const Receiver& r, Outlet& out) const {
  if (bytes < static_cast<uint64_t>(min_bytes_) ||
      r.ring->held() >= std::max<uint32_t>(r.ring->layout().slots, 2)) {
    return copied_->Put(slot, shape, bytes, r, out);
  }
  auto* buf = new SlotBuffer(slot, r.ring);
  Tensor t(dtype_, shape, buf);
  buf->Unref();
  out.ctx()->set_output(0, t);
  out.Count(bytes);
  return absl::OkStatus();
}

}  // namespace rdmadev_tf
