// Region: page-aligned, pre-faulted memory that peers may write into and read from.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <set>
#include <string>

#include "common.h"

namespace rdmadev {

// What a peer needs to address a region, whatever the fabric. Serialized to a fixed
// 80-byte little-endian record (see Encode/Decode); the version is checked on decode.
//   0 u32 magic "RDMR"   4 u32 version (2)   8 u64 id   16 u64 size   24 u64 rkey (tcp)
//  32 u32 pid   36 i32 fd   40 u64 ino   48 u64 dev                  (shm)
//  56 u64 verbs_addr   64 u32 verbs_rkey   68 u32 reserved   72 u64 reserved   (verbs)
struct RegionDesc {
  uint64_t id = 0;     // unique within the owning domain
  uint64_t size = 0;   // usable bytes
  uint64_t rkey = 0;   // random key a peer must present (tcp frames, verbs rkey later)
  uint32_t pid = 0;    // owner process (shm maps /proc/<pid>/fd/<fd>)
  int32_t fd = -1;     // owner's memfd
  uint64_t ino = 0;    // memfd inode: guards against a recycled pid or fd
  uint64_t dev = 0;
  uint64_t verbs_addr = 0;  // virtual address of byte 0 in the owner (RDMA WRITE/READ target)
  uint32_t verbs_rkey = 0;  // the memory registration's remote key (0: not registered)

  static constexpr size_t kEncodedSize = 80;
  std::string Encode() const;
  static RegionDesc Decode(const std::string& bytes);  // throws kProtocol
};

// Any authenticated peer may access a region granted to kAnyPeer.
extern const char kAnyPeer[];

class Region {
 public:
  // Maps `size` bytes (at least one page) of a fresh memfd and faults every page in now,
  // so that no transfer pays first-touch cost (2 GB/s here against 12 GB/s warm).
  static std::shared_ptr<Region> Allocate(uint64_t id, uint64_t size, const std::string& label);
  ~Region();
  Region(const Region&) = delete;
  Region& operator=(const Region&) = delete;

  uint8_t* base() const { return base_; }
  uint64_t size() const { return size_; }
  uint64_t id() const { return desc_.id; }
  const RegionDesc& desc() const { return desc_; }
  // Records the verbs registration (address, rkey) in the descriptor; called by the verbs
  // fabric before the region is handed out, and with (0, 0) when it is deregistered.
  void SetVerbsKey(uint64_t addr, uint32_t rkey) {
    desc_.verbs_addr = addr;
    desc_.verbs_rkey = rkey;
  }

  // Which peers (by authenticated name) may access the region over fabrics that check.
  void Grant(const std::string& peer);
  bool Granted(const std::string& peer) const;

  // Throws kBounds unless [off, off+len) lies inside the region (overflow-safe).
  void CheckRange(uint64_t off, uint64_t len, const char* what) const;
  // The 64-bit word at `off` (8-aligned, inside the region).
  std::atomic<uint64_t>* Word(uint64_t off) const;

  // Revokes peer access. The memory stays mapped until the last reference goes, so a
  // view still held by Python (or a TF tensor aliasing a slot) never dangles.
  void Close();
  bool closed() const { return closed_.load(std::memory_order_acquire); }

 private:
  Region() = default;
  uint8_t* base_ = nullptr;
  uint64_t size_ = 0;
  uint64_t mapped_ = 0;
  int fd_ = -1;
  RegionDesc desc_;
  std::atomic<bool> closed_{false};
  mutable std::mutex grants_mu_;
  std::set<std::string> grants_;
};

// Overflow-safe "[off, off+len) inside [0, size)".
inline bool RangeInside(uint64_t off, uint64_t len, uint64_t size) {
  return off <= size && len <= size - off;
}

// Random bytes from the kernel (getrandom); throws on failure.
uint64_t RandomU64();
void RandomBytes(void* dst, size_t n);

}  // namespace rdmadev
