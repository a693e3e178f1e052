#include "region.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstring>

// In an AddressSanitizer build (the fuzz targets of tests/fuzz/; never the shipped library) a
// region's mapping sits between two guard pages, and ASan is told that its bytes past `size`
// (up to a page of slack) and both guard pages are off limits: any access outside the region
// is reported where it happens, even one that lands in mapped memory, which would otherwise
// go unseen unless it reached an unmapped page.
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
// 2: 80 bytes, carries the verbs address and rkey.
constexpr uint32_t kDescVersion = 2;

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

std::shared_ptr<Region> Region::Allocate(uint64_t id, uint64_t size, const std::string& label) {
  std::shared_ptr<Region> r(new Region());
  r->size_ = size;
  r->mapped_ = RoundUp(size == 0 ? 1 : size, kPageSize);
  if (r->mapped_ < size) throw Error(ErrorKind::kRegion, "Failed to allocate region: size overflows");
  std::string name = "rdmadev:" + label;
  r->fd_ = memfd_create(name.c_str(), MFD_CLOEXEC);
  if (r->fd_ < 0) ThrowErrno(ErrorKind::kRegion, "Failed to create memfd for region", errno);
  // fallocate reserves every page now, so running out of memory is an error here
  // rather than a SIGBUS in the middle of a transfer.
  if (ftruncate(r->fd_, static_cast<off_t>(r->mapped_)) != 0 ||
      fallocate(r->fd_, 0, 0, static_cast<off_t>(r->mapped_)) != 0) {
    ThrowErrno(ErrorKind::kRegion, "Failed to reserve " + std::to_string(r->mapped_) +
                                       " bytes for region", errno,
               "free memory, or plan smaller regions");
  }
#ifdef RDMADEV_ASAN_REGIONS
  void* span = mmap(nullptr, r->mapped_ + 2 * kPageSize, PROT_NONE,
                    MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (span == MAP_FAILED) ThrowErrno(ErrorKind::kRegion, "Failed to reserve region", errno);
  void* p = mmap(static_cast<uint8_t*>(span) + kPageSize, r->mapped_, PROT_READ | PROT_WRITE,
                 MAP_SHARED | MAP_POPULATE | MAP_FIXED, r->fd_, 0);
  if (p == MAP_FAILED) {
    int err = errno;  // for the ThrowErrno below
    munmap(span, r->mapped_ + 2 * kPageSize);
    errno = err;
  }
#else
  void* p = mmap(nullptr, r->mapped_, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, r->fd_, 0);
#endif
  if (p == MAP_FAILED) ThrowErrno(ErrorKind::kRegion, "Failed to map region", errno);
  r->base_ = static_cast<uint8_t*>(p);
#ifdef RDMADEV_ASAN_REGIONS
  ASAN_POISON_MEMORY_REGION(r->base_ - kPageSize, kPageSize);
  ASAN_POISON_MEMORY_REGION(r->base_ + size, r->mapped_ - size + kPageSize);
#endif
  struct stat st;
  if (fstat(r->fd_, &st) != 0) ThrowErrno(ErrorKind::kRegion, "Failed to stat region memfd", errno);
  r->desc_.id = id;
  r->desc_.size = size;
  r->desc_.rkey = RandomU64();
  r->desc_.pid = static_cast<uint32_t>(getpid());
  r->desc_.fd = r->fd_;
  r->desc_.ino = st.st_ino;
  r->desc_.dev = st.st_dev;
  return r;
}

Region::~Region() {
#ifdef RDMADEV_ASAN_REGIONS
  if (base_) {
    ASAN_UNPOISON_MEMORY_REGION(base_ - kPageSize, mapped_ + 2 * kPageSize);
    munmap(base_ - kPageSize, mapped_ + 2 * kPageSize);
  }
#else
  if (base_) munmap(base_, mapped_);
#endif
  if (fd_ >= 0) close(fd_);
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
  // No new shm peer can map the region once its fd is gone; existing mappings stay valid.
  if (fd_ >= 0) {
    close(fd_);
    fd_ = -1;
  }
}

}  // namespace rdmadev
