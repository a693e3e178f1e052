// Output buffers of large received tensors that are copied out of their slot (not aliased),
// kept warm from one step to the next where TF's CPU allocator is malloc itself.
//
// Why: TF's plain CPU allocator ("cpu", TF_ENABLE_ONEDNN_OPTS=0 on x86) is glibc's malloc, and
// at or above glibc's largest mmap threshold (32 MiB on 64-bit, DEFAULT_MMAP_THRESHOLD_MAX;
// mallopt cannot raise it further) each allocation is a fresh mapping whose pages fault in on
// first touch, and each free unmaps it. Measured here (transfer.py, copied receives, 64 MiB):
// 47 ms a call with that allocator against 22 ms with oneDNN's ("mklcpu", TF's default on
// x86), which serves allocations of 256 KiB and more from a BFC pool that keeps its memory.
// So a kernel keeps its own buffers only where TF's allocator is "cpu".
//
// A WarmPool belongs to one RecvOp kernel and keeps at most kIdleMax idle buffers. One is
// enough: a synchronous step frees what it received before the next step's receive by the
// same kernel. A buffer is TF's like any other: it owns its memory, so a consumer may compute
// into it, forward it or keep it. It goes back to the pool only when TF drops its last
// reference, so a kept tensor is never handed out again under its holder; a receive that finds
// no idle buffer allocates a new one. Buffers are whole 2 MiB pages advised as transparent
// huge pages, so where the kernel has them a new buffer faults in 2 MiB at a time.
#pragma once

#include <sys/mman.h>

#include <cstdint>
#include <cstdlib>
#include <memory>
#include <mutex>
#include <vector>

#include "tensorflow/core/framework/tensor.h"

namespace rdmadev_tf {

// Received tensors of at least this many bytes are copied into warm buffers (see above).
constexpr uint64_t kWarmMinBytes = uint64_t{32} << 20;
// The name of TF's malloc-backed CPU allocator (tensorflow/core/framework/cpu_allocator_impl.cc).
constexpr const char* kMallocAllocator = "cpu";

class WarmPool : public std::enable_shared_from_this<WarmPool> {
 public:
  // Idle buffers a pool keeps (see above).
  static constexpr size_t kIdleMax = 1;
  // Buffers are whole huge pages (x86-64's 2 MiB transparent huge pages).
  static constexpr size_t kHugePage = size_t{2} << 20;

  ~WarmPool() {
    for (const auto& b : idle_) std::free(b.data);
  }

  // A tensor of `dtype` and `shape` (`bytes` of it) in a warm buffer, *reused telling whether
  // the buffer was kept from an earlier receive; an empty Tensor when memory ran out.
  tensorflow::Tensor Take(tensorflow::DataType dtype, const tensorflow::TensorShape& shape,
                          uint64_t bytes, bool* reused) {
    const size_t capacity = (bytes + kHugePage - 1) / kHugePage * kHugePage;
    void* data = nullptr;
    size_t got = 0;
    {
      std::lock_guard<std::mutex> lock(mu_);
      // An idle buffer serves if it holds the tensor with at most half of itself to spare (a
      // dynamic channel's tensors may shrink); the others are freed below.
      for (auto it = idle_.begin(); it != idle_.end(); ++it) {
        if (it->capacity >= capacity && it->capacity / 2 < capacity) {
          data = it->data;
          got = it->capacity;
          idle_.erase(it);
          break;
        }
      }
      if (!data) {
        for (const auto& b : idle_) std::free(b.data);
        idle_.clear();
      }
    }
    *reused = data != nullptr;
    if (!data) {
      data = std::aligned_alloc(kHugePage, capacity);
      if (!data) return tensorflow::Tensor();
      madvise(data, capacity, MADV_HUGEPAGE);  // advice only: without THP pages stay 4 KiB
      got = capacity;
    }
    auto* buf = new Buffer(data, bytes, got, shared_from_this());
    tensorflow::Tensor out(dtype, shape, buf);
    buf->Unref();
    return out;
  }

 private:
  struct Idle {
    void* data;
    size_t capacity;
  };

  // A received tensor's memory; back to its pool when TF drops the last reference.
  class Buffer : public tensorflow::TensorBuffer {
   public:
    Buffer(void* data, size_t size, size_t capacity, std::shared_ptr<WarmPool> pool)
        : TensorBuffer(data), size_(size), capacity_(capacity), pool_(std::move(pool)) {}
    ~Buffer() override { pool_->Give(data(), capacity_); }
    size_t size() const override { return size_; }
    TensorBuffer* root_buffer() override { return this; }
    void FillAllocationDescription(tensorflow::AllocationDescription* d) const override {
      d->set_requested_bytes(size_);
      d->set_allocated_bytes(capacity_);
      d->set_allocator_name("rdmadev_warm");
    }
    bool OwnsMemory() const override { return true; }

   private:
    size_t size_, capacity_;
    std::shared_ptr<WarmPool> pool_;
  };

  void Give(void* data, size_t capacity) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (idle_.size() < kIdleMax) {
        idle_.push_back({data, capacity});
        return;
      }
    }
    std::free(data);
  }

  std::mutex mu_;
  std::vector<Idle> idle_;
};

}  // namespace rdmadev_tf
