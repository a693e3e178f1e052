// Region: page-aligned, pre-faulted memory that peers may write into and read from, placed
// in a Chunk: one memfd, one mapping and, on verbs, one memory registration that holds the
// regions a Domain grants to one peer (arena.h decides where each region goes).
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include "common.h"

namespace rdmadev {

// What a peer needs to address a region, whatever the fabric. Serialized to a fixed
// 80-byte little-endian record (see Encode/Decode); the version is checked on decode.
//   0 u32 magic "RDMR"   4 u32 version (3)   8 u64 id   16 u64 size   24 u64 rkey (tcp)
//  32 u32 pid   36 i32 fd   40 u64 ino   48 u64 dev   72 u64 offset      (shm)
//  56 u64 verbs_addr   64 u32 verbs_rkey   68 u32 reserved                 (verbs)
struct RegionDesc {
  uint64_t id = 0;     // unique within the owning domain
  uint64_t size = 0;   // usable bytes
  uint64_t rkey = 0;   // random key a peer must present (tcp frames)
  uint32_t pid = 0;    // owner process (shm maps /proc/<pid>/fd/<fd>)
  int32_t fd = -1;     // the memfd of the owner's chunk holding the region
  uint64_t ino = 0;    // that memfd's inode: guards against a recycled pid or fd
  uint64_t dev = 0;
  uint64_t offset = 0;  // where the region starts in that chunk (a page multiple)
  uint64_t verbs_addr = 0;  // virtual address of byte 0 in the owner (RDMA WRITE/READ target)
  uint32_t verbs_rkey = 0;  // the chunk's memory registration's remote key (0: not registered)

  static constexpr size_t kEncodedSize = 80;
  std::string Encode() const;
  static RegionDesc Decode(const std::string& bytes);  // throws kProtocol
};

// How long a verbs peer's write posted before a release may still land (registry.h says why
// 10 s covers it): a receiving ring is retired that long, and a released region's span of its
// chunk quarantined as long (Fabric::late_write_window_s) before another region takes it.
constexpr double kLateWriteGraceS = 10;

// Any authenticated peer may access a region granted to kAnyPeer.
extern const char kAnyPeer[];

// Memory mapped, and registered with a Domain's fabrics, once for many regions: a memfd, every
// page reserved and faulted in when it is made, so that no transfer pays first-touch cost
// (2 GB/s here against 12 GB/s warm). Regions take page spans of it (Take) and give them back
// when they go (Give); a span given back while its peer may still write to it is quarantined
// before it is taken again.
//
// Its first pages are its directory: one 64-bit word per page of the chunk, holding the id of
// the live region that starts on that page (0: none). A peer attaching a region reads its word
// (shm from its mapping, verbs with one RDMA READ) and refuses a region that was closed.
class Chunk {
 public:
  using Clock = std::chrono::steady_clock;
  // A chunk with `room` bytes (rounded up to pages) for regions, after its directory.
  static std::shared_ptr<Chunk> Map(uint64_t id, uint64_t room, const std::string& label);
  // Where the directory word of the region at `offset` lies in its chunk.
  static uint64_t DirectoryOffset(uint64_t offset) { return offset / kPageSize * 8; }
  ~Chunk();
  Chunk(const Chunk&) = delete;
  Chunk& operator=(const Chunk&) = delete;

  uint64_t id() const { return id_; }
  uint8_t* base() const { return base_; }
  uint64_t size() const { return size_; }
  int fd() const { return fd_; }
  uint64_t ino() const { return ino_; }
  uint64_t dev() const { return dev_; }
  // The verbs registration of the whole chunk (address of byte 0, remote key): recorded by
  // the verbs fabric when the chunk is made (Fabric::RegisterChunk), (0, 0) once it is gone.
  void SetVerbsKey(uint64_t addr, uint32_t rkey) {
    verbs_addr_ = addr;
    verbs_rkey_ = rkey;
  }
  uint64_t verbs_addr() const { return verbs_addr_; }
  uint32_t verbs_rkey() const { return verbs_rkey_; }
  // How long a span given back by a region that did not go quietly stays quarantined: the
  // longest a peer's write may still land after a release, over the fabrics that reach the
  // chunk's memory directly (Fabric::late_write_window_s). Set by the arena that maps it.
  void set_quarantine_s(double s) { quarantine_s_ = s; }
  double quarantine_s() const { return quarantine_s_; }

  // The offset of `span` free bytes (a page multiple), first fit, now taken; false when no
  // free run that long is out of quarantine.
  bool Take(uint64_t span, uint64_t* offset);
  // Gives [offset, offset + span) back, to be taken again from `reusable_at`.
  void Give(uint64_t offset, uint64_t span, Clock::time_point reusable_at);
  // Bytes given back but still in quarantine.
  uint64_t quarantined() const;
  // Nothing taken and nothing in quarantine: the chunk may go.
  bool idle() const;
  // The directory word of the region at `offset`.
  std::atomic<uint64_t>* DirectoryWord(uint64_t offset) const {
    return reinterpret_cast<std::atomic<uint64_t>*>(base_ + DirectoryOffset(offset));
  }

 private:
  Chunk() = default;
  uint64_t id_ = 0;
  uint8_t* base_ = nullptr;
  uint64_t size_ = 0;
  int fd_ = -1;
  uint64_t ino_ = 0, dev_ = 0;
  uint64_t verbs_addr_ = 0;
  uint32_t verbs_rkey_ = 0;
  double quarantine_s_ = 0;
  mutable std::mutex mu_;
  uint64_t taken_ = 0;
  std::map<uint64_t, uint64_t> free_;  // offset -> length, coalesced
  struct Quarantined {
    uint64_t offset, span;
    Clock::time_point until;
  };
  std::vector<Quarantined> quarantined_;
  void FreeLocked(uint64_t offset, uint64_t span);  // into free_, coalesced
  void ReleaseQuarantineLocked();                   // spans whose quarantine ended
};

class Region {
 public:
  // A region of its own chunk, exactly page-rounded `size` (the fuzz targets' regions).
  static std::shared_ptr<Region> Allocate(uint64_t id, uint64_t size, const std::string& label);
  // `size` bytes of `chunk` at `offset`, whose span (page-rounded size) the caller took
  // from it; zeroed here. The span goes back to the chunk when the region is destroyed.
  static std::shared_ptr<Region> Place(uint64_t id, uint64_t size, std::shared_ptr<Chunk> chunk,
                                       uint64_t offset);
  ~Region();
  Region(const Region&) = delete;
  Region& operator=(const Region&) = delete;

  uint8_t* base() const { return base_; }
  uint64_t size() const { return size_; }
  uint64_t span() const { return span_; }
  uint64_t id() const { return desc_.id; }
  const RegionDesc& desc() const { return desc_; }
  const Chunk& chunk() const { return *chunk_; }

  // Which peers (by authenticated name) may access the region over fabrics that check.
  void Grant(const std::string& peer);
  bool Granted(const std::string& peer) const;

  // Throws kBounds unless [off, off+len) lies inside the region (overflow-safe).
  void CheckRange(uint64_t off, uint64_t len, const char* what) const;
  // The 64-bit word at `off` (8-aligned, inside the region).
  std::atomic<uint64_t>* Word(uint64_t off) const;

  // Revokes peer access. The memory stays where it is until the last reference goes, so a
  // view still held by Python (or a TF tensor aliasing a slot) never dangles.
  void Close();
  bool closed() const { return closed_.load(std::memory_order_acquire); }
  // Nothing can be in flight to the region any more (its channel's last step ended cleanly):
  // its span may be taken again as soon as it goes, without a quarantine for late writes.
  void Quiet() { quiet_.store(true, std::memory_order_release); }

 private:
  Region() = default;
  std::shared_ptr<Chunk> chunk_;
  uint64_t offset_ = 0;
  uint8_t* base_ = nullptr;
  uint64_t size_ = 0;
  uint64_t span_ = 0;
  RegionDesc desc_;
  std::atomic<bool> closed_{false};
  std::atomic<bool> quiet_{false};
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
