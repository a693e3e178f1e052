#include "region.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstring>
#include <iterator>

// In an AddressSanitizer build (the fuzz targets of tests/fuzz/; never the shipped library) a
// chunk's mapping sits between two guard pages, and ASan is told that every byte of it but
// those of its regions (each its `size`, not its page-rounded span) is off limits, guard
// pages too: any access outside a region is reported where it happens, even one that lands
// in mapped memory, which would otherwise go unseen unless it reached an unmapped page.
#if defined(__has_feature)
#if __has_feature(address_sanitizer)
#define RDMADEV_ASAN_REGIONS 1
#endif
#endif
#if defined(__SANITIZE_ADDRESS__) && !defined(RDMADEV_ASAN_REGIONS)
#define RDMADEV_ASAN_REGIONS 1
#endif
#ifdef RDMADEV_ASAN_REGIONS
#include <sanitizer/asan_interface.h>
#endif

namespace rdmadev {

const char kAnyPeer[] = "*";

namespace {
constexpr uint32_t kDescMagic = 0x524d4452;  // "RDMR" little-endian
// 2: 80 bytes, carries the verbs address and rkey. 3: and the region's offset in its chunk.
constexpr uint32_t kDescVersion = 3;

template <typename T>
void Put(std::string* out, size_t at, T v) { std::memcpy(&(*out)[at], &v, sizeof v); }
template <typename T>
T Get(const std::string& in, size_t at) { T v; std::memcpy(&v, &in[at], sizeof v); return v; }
}  // namespace

static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "descriptors and frames are little-endian");

std::string RegionDesc::Encode() const {
  std::string out(kEncodedSize, '\0');
  Put<uint32_t>(&out, 0, kDescMagic);
  Put<uint32_t>(&out, 4, kDescVersion);
  Put<uint64_t>(&out, 8, id);
  Put<uint64_t>(&out, 16, size);
  Put<uint64_t>(&out, 24, rkey);
  Put<uint32_t>(&out, 32, pid);
  Put<int32_t>(&out, 36, fd);
  Put<uint64_t>(&out, 40, ino);
  Put<uint64_t>(&out, 48, dev);
  Put<uint64_t>(&out, 56, verbs_addr);
  Put<uint32_t>(&out, 64, verbs_rkey);
  Put<uint64_t>(&out, 72, offset);
  return out;
}

RegionDesc RegionDesc::Decode(const std::string& bytes) {
  if (bytes.size() != kEncodedSize || Get<uint32_t>(bytes, 0) != kDescMagic) {
    throw Error(ErrorKind::kProtocol,
                "Failed to decode region descriptor: not an rdmadev region descriptor (" +
                    std::to_string(bytes.size()) + " bytes)",
                0, "pass the exact bytes of Region.descriptor from the owning process");
  }
  if (Get<uint32_t>(bytes, 4) != kDescVersion) {
    throw Error(ErrorKind::kProtocol, "Failed to decode region descriptor: version " +
                                          std::to_string(Get<uint32_t>(bytes, 4)) + " != " +
                                          std::to_string(kDescVersion),
                0, "run the same rdmadev version in every task");
  }
  RegionDesc d;
  d.id = Get<uint64_t>(bytes, 8);
  d.size = Get<uint64_t>(bytes, 16);
  d.rkey = Get<uint64_t>(bytes, 24);
  d.pid = Get<uint32_t>(bytes, 32);
  d.fd = Get<int32_t>(bytes, 36);
  d.ino = Get<uint64_t>(bytes, 40);
  d.dev = Get<uint64_t>(bytes, 48);
  d.verbs_addr = Get<uint64_t>(bytes, 56);
  d.verbs_rkey = Get<uint32_t>(bytes, 64);
  d.offset = Get<uint64_t>(bytes, 72);
  return d;
}

void RandomBytes(void* dst, size_t n) {
  auto* p = static_cast<uint8_t*>(dst);
  while (n > 0) {
    ssize_t got = getrandom(p, n, 0);
    if (got < 0) {
      if (errno == EINTR) continue;
      ThrowErrno(ErrorKind::kFabric, "Failed to read random bytes", errno);
    }
    p += got;
    n -= static_cast<size_t>(got);
  }
}

uint64_t RandomU64() {
  uint64_t v;
  RandomBytes(&v, sizeof v);
  return v;
}

std::shared_ptr<Chunk> Chunk::Map(uint64_t id, uint64_t room, const std::string& label) {
  std::shared_ptr<Chunk> c(new Chunk());
  c->id_ = id;
  const uint64_t room_pages = RoundUp(room == 0 ? 1 : room, kPageSize) / kPageSize;
  // A directory page holds the words of 512 pages, its own included.
  const uint64_t words_per_page = kPageSize / 8;
  const uint64_t dir_pages = (room_pages + words_per_page - 2) / (words_per_page - 1);
  c->size_ = (dir_pages + room_pages) * kPageSize;
  if (room_pages == 0 || c->size_ / kPageSize < room_pages) {
    throw Error(ErrorKind::kRegion, "Failed to allocate region: size overflows");
  }
  std::string name = "rdmadev:" + label;
  c->fd_ = memfd_create(name.c_str(), MFD_CLOEXEC);
  if (c->fd_ < 0) ThrowErrno(ErrorKind::kRegion, "Failed to create memfd for region", errno);
  // fallocate reserves every page now, so running out of memory is an error here
  // rather than a SIGBUS in the middle of a transfer.
  if (ftruncate(c->fd_, static_cast<off_t>(c->size_)) != 0 ||
      fallocate(c->fd_, 0, 0, static_cast<off_t>(c->size_)) != 0) {
    ThrowErrno(ErrorKind::kRegion, "Failed to reserve " + std::to_string(c->size_) +
                                       " bytes for region", errno,
               "free memory, or plan smaller regions");
  }
#ifdef RDMADEV_ASAN_REGIONS
  void* span = mmap(nullptr, c->size_ + 2 * kPageSize, PROT_NONE,
                    MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (span == MAP_FAILED) ThrowErrno(ErrorKind::kRegion, "Failed to reserve region", errno);
  void* p = mmap(static_cast<uint8_t*>(span) + kPageSize, c->size_, PROT_READ | PROT_WRITE,
                 MAP_SHARED | MAP_POPULATE | MAP_FIXED, c->fd_, 0);
  if (p == MAP_FAILED) {
    int err = errno;  // for the ThrowErrno below
    munmap(span, c->size_ + 2 * kPageSize);
    errno = err;
  }
#else
  void* p = mmap(nullptr, c->size_, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, c->fd_, 0);
#endif
  if (p == MAP_FAILED) ThrowErrno(ErrorKind::kRegion, "Failed to map region", errno);
  c->base_ = static_cast<uint8_t*>(p);
#ifdef RDMADEV_ASAN_REGIONS
  ASAN_POISON_MEMORY_REGION(c->base_ - kPageSize, kPageSize);
  ASAN_POISON_MEMORY_REGION(c->base_ + dir_pages * kPageSize, (room_pages + 1) * kPageSize);
#endif
  struct stat st;
  if (fstat(c->fd_, &st) != 0) ThrowErrno(ErrorKind::kRegion, "Failed to stat region memfd", errno);
  c->ino_ = st.st_ino;
  c->dev_ = st.st_dev;
  c->free_[dir_pages * kPageSize] = room_pages * kPageSize;
  return c;
}

Chunk::~Chunk() {
#ifdef RDMADEV_ASAN_REGIONS
  if (base_) {
    ASAN_UNPOISON_MEMORY_REGION(base_ - kPageSize, size_ + 2 * kPageSize);
    munmap(base_ - kPageSize, size_ + 2 * kPageSize);
  }
#else
  if (base_) munmap(base_, size_);
#endif
  if (fd_ >= 0) close(fd_);
}

void Chunk::FreeLocked(uint64_t offset, uint64_t span) {
  auto next = free_.lower_bound(offset);
  if (next != free_.end() && offset + span == next->first) {  // joins the run after it
    span += next->second;
    next = free_.erase(next);
  }
  if (next != free_.begin()) {
    auto prev = std::prev(next);
    if (prev->first + prev->second == offset) {  // joins the run before it
      prev->second += span;
      return;
    }
  }
  free_[offset] = span;
}

void Chunk::ReleaseQuarantineLocked() {
  const auto now = Clock::now();
  for (auto it = quarantined_.begin(); it != quarantined_.end();) {
    if (it->until <= now) {
      FreeLocked(it->offset, it->span);
      it = quarantined_.erase(it);
    } else {
      ++it;
    }
  }
}

bool Chunk::Take(uint64_t span, uint64_t* offset) {
  std::lock_guard<std::mutex> lock(mu_);
  ReleaseQuarantineLocked();
  for (auto it = free_.begin(); it != free_.end(); ++it) {
    if (it->second < span) continue;
    *offset = it->first;
    if (it->second > span) free_[it->first + span] = it->second - span;
    free_.erase(it);
    taken_ += span;
    return true;
  }
  return false;
}

void Chunk::Give(uint64_t offset, uint64_t span, Clock::time_point reusable_at) {
  std::lock_guard<std::mutex> lock(mu_);
  taken_ -= span;
  if (reusable_at > Clock::now()) {
    quarantined_.push_back({offset, span, reusable_at});
  } else {
    FreeLocked(offset, span);
  }
}

uint64_t Chunk::quarantined() const {
  std::lock_guard<std::mutex> lock(mu_);
  const auto now = Clock::now();
  uint64_t n = 0;
  for (const auto& q : quarantined_) n += q.until > now ? q.span : 0;
  return n;
}

bool Chunk::idle() const {
  std::lock_guard<std::mutex> lock(mu_);
  const auto now = Clock::now();
  for (const auto& q : quarantined_) {
    if (q.until > now) return false;
  }
  return taken_ == 0;
}

std::shared_ptr<Region> Region::Allocate(uint64_t id, uint64_t size, const std::string& label) {
  auto chunk = Chunk::Map(id, size, label);
  uint64_t offset = 0;
  chunk->Take(RoundUp(size == 0 ? 1 : size, kPageSize), &offset);
  return Place(id, size, std::move(chunk), offset);
}

std::shared_ptr<Region> Region::Place(uint64_t id, uint64_t size, std::shared_ptr<Chunk> chunk,
                                      uint64_t offset) {
  std::shared_ptr<Region> r(new Region());
  r->size_ = size;
  r->span_ = RoundUp(size == 0 ? 1 : size, kPageSize);
  r->offset_ = offset;
  r->base_ = chunk->base() + offset;
#ifdef RDMADEV_ASAN_REGIONS
  ASAN_UNPOISON_MEMORY_REGION(r->base_, size);
#endif
  // A span taken again holds its last region's bytes: a ring's sequence words must read 0.
  std::memset(r->base_, 0, size);
  r->desc_.id = id;
  r->desc_.size = size;
  r->desc_.rkey = RandomU64();
  r->desc_.pid = static_cast<uint32_t>(getpid());
  r->desc_.fd = chunk->fd();
  r->desc_.ino = chunk->ino();
  r->desc_.dev = chunk->dev();
  r->desc_.offset = offset;
  if (chunk->verbs_rkey() != 0) {
    r->desc_.verbs_addr = chunk->verbs_addr() + offset;
    r->desc_.verbs_rkey = chunk->verbs_rkey();
  }
  chunk->DirectoryWord(offset)->store(id, std::memory_order_release);
  r->chunk_ = std::move(chunk);
  return r;
}

Region::~Region() {
  if (!chunk_) return;
  chunk_->DirectoryWord(offset_)->store(0, std::memory_order_release);
#ifdef RDMADEV_ASAN_REGIONS
  ASAN_POISON_MEMORY_REGION(base_, span_);
#endif
  auto reusable_at = Chunk::Clock::now();
  if (!quiet_.load(std::memory_order_acquire)) {
    reusable_at += std::chrono::duration_cast<Chunk::Clock::duration>(
        std::chrono::duration<double>(chunk_->quarantine_s()));
  }
  chunk_->Give(offset_, span_, reusable_at);
}

void Region::Grant(const std::string& peer) {
  std::lock_guard<std::mutex> lock(grants_mu_);
  grants_.insert(peer);
}

bool Region::Granted(const std::string& peer) const {
  std::lock_guard<std::mutex> lock(grants_mu_);
  return grants_.count(peer) > 0 || grants_.count(kAnyPeer) > 0;
}

void Region::CheckRange(uint64_t off, uint64_t len, const char* what) const {
  if (!RangeInside(off, len, size_)) {
    throw Error(ErrorKind::kBounds,
                std::string("Failed to ") + what + ": range [" + std::to_string(off) + ", +" +
                    std::to_string(len) + ") lies outside region " + std::to_string(id()) +
                    " of " + std::to_string(size_) + " bytes",
                0, "keep offset + length within the region's size");
  }
}

std::atomic<uint64_t>* Region::Word(uint64_t off) const {
  CheckRange(off, 8, "address sequence word");
  if (off % 8 != 0) {
    throw Error(ErrorKind::kBounds, "Failed to address sequence word: offset " +
                                        std::to_string(off) + " is not 8-byte aligned");
  }
  return reinterpret_cast<std::atomic<uint64_t>*>(base_ + off);
}

void Region::Close() {
  std::lock_guard<std::mutex> lock(grants_mu_);
  closed_.store(true, std::memory_order_release);
  grants_.clear();
  // Peers attaching it from now on find it closed; those attached already keep their access
  // (shm mappings, verbs keys) until its span is taken again after its quarantine.
  chunk_->DirectoryWord(offset_)->store(0, std::memory_order_release);
}

}  // namespace rdmadev
