#include "shm.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cstring>
#include <fstream>
#include <iterator>
#include <map>
#include <mutex>
#include <shared_mutex>

namespace rdmadev {
namespace {

int PidfdOpen(pid_t pid) { return static_cast<int>(syscall(SYS_pidfd_open, pid, 0)); }

// Two processes share memory through /proc only if they share a kernel (boot id) and a
// pid namespace (the pid in a descriptor must mean the same process to both).
std::string HostKey() {
  std::ifstream f("/proc/sys/kernel/random/boot_id");
  std::string boot;
  std::getline(f, boot);
  struct stat st;
  std::string pidns = stat("/proc/self/ns/pid", &st) == 0 ? std::to_string(st.st_ino) : "0";
  return boot + "." + pidns;
}

class ShmEndpoint : public Endpoint {
 public:
  ShmEndpoint(std::string reach, pid_t pid, int pidfd)
      : reach_(std::move(reach)), pid_(pid), pidfd_(pidfd) {}
  ~ShmEndpoint() override { Close(); }

  std::string fabric() const override { return ShmBackend::kName; }
  std::string peer() const override { return "shm=" + reach_; }

  // The peer's region, in the mapping of its chunk: one mapping per chunk, shared by every
  // region of it attached through this endpoint, and unmapped with the last of them.
  std::shared_ptr<RemoteRegion> Attach(const RegionDesc& desc) override {
    std::shared_lock<std::shared_mutex> lock(mu_);
    if (pidfd_ < 0) throw Error(ErrorKind::kClosed, "Failed to attach region: endpoint closed");
    if (desc.pid != static_cast<uint32_t>(pid_)) {
      throw Error(ErrorKind::kProtocol,
                  "Failed to attach region " + std::to_string(desc.id) + ": it belongs to pid " +
                      std::to_string(desc.pid) + ", not to this endpoint's peer (pid " +
                      std::to_string(pid_) + ")",
                  0, "attach a region through an endpoint to the process that owns it");
    }
    if (desc.offset % kPageSize != 0) {
      throw Error(ErrorKind::kProtocol, "Failed to attach region " + std::to_string(desc.id) +
                                            ": its offset " + std::to_string(desc.offset) +
                                            " in its chunk is not a page multiple",
                  0, "pass the exact descriptor the owning process gave");
    }
    auto rr = std::make_shared<RemoteRegion>(desc);
    auto mapping = MapChunk(desc);
    if (!RangeInside(desc.offset, desc.size, mapping->len)) {
      throw Error(ErrorKind::kProtocol,
                  "Failed to attach region " + std::to_string(desc.id) + ": its " +
                      std::to_string(desc.size) + " bytes at " + std::to_string(desc.offset) +
                      " lie outside its chunk of " + std::to_string(mapping->len) + " bytes",
                  0, "pass the exact descriptor the owning process gave");
    }
    const auto* entry = reinterpret_cast<const std::atomic<uint64_t>*>(
        mapping->base + Chunk::DirectoryOffset(desc.offset));
    CheckRegionLive(desc, entry->load(std::memory_order_acquire));
    rr->mapped = mapping->base + desc.offset;
    rr->mapping = std::move(mapping);
    return rr;
  }

  void Write(const void* src, const RemoteRegion& dst, uint64_t roff, uint64_t len,
             const Signal* sig, const Deadline&) override {
    CheckRemoteRange(dst.desc, roff, len, sig);
    std::shared_lock<std::shared_mutex> lock(mu_);
    if (pidfd_ < 0) throw Error(ErrorKind::kClosed, "Failed to write: endpoint closed");
    if (len) std::memcpy(dst.mapped + roff, src, len);
    if (sig) {
      auto* words = reinterpret_cast<uint64_t*>(dst.mapped + sig->off);
      __atomic_store_n(&words[1], sig->aux, __ATOMIC_RELAXED);
      __atomic_store_n(&words[0], sig->seq, __ATOMIC_RELEASE);
    }
  }

  void Read(const RemoteRegion& src, uint64_t roff, void* dst, uint64_t len,
            const Deadline&) override {
    CheckRemoteRange(src.desc, roff, len, nullptr);
    std::shared_lock<std::shared_mutex> lock(mu_);
    if (pidfd_ < 0) throw Error(ErrorKind::kClosed, "Failed to read: endpoint closed");
    __atomic_thread_fence(__ATOMIC_ACQUIRE);
    if (len) std::memcpy(dst, src.mapped + roff, len);
  }

  bool PeerAlive(std::string* why) override {
    std::shared_lock<std::shared_mutex> lock(mu_);
    if (pidfd_ < 0) {
      *why = "endpoint closed";
      return false;
    }
    // A pidfd becomes readable when its process exits.
    pollfd p{pidfd_, POLLIN, 0};
    if (poll(&p, 1, 0) > 0) {
      *why = "peer process " + std::to_string(pid_) + " exited";
      return false;
    }
    return true;
  }

  void Close() override {
    std::unique_lock<std::shared_mutex> lock(mu_);
    if (pidfd_ >= 0) close(pidfd_);
    pidfd_ = -1;
  }

 private:
  struct ChunkMapping {
    uint8_t* base = nullptr;
    uint64_t len = 0;
    ~ChunkMapping() {
      if (base) munmap(base, len);
    }
  };

  // The mapping of the chunk `desc` lies in: the one already made for it, or a new one.
  std::shared_ptr<ChunkMapping> MapChunk(const RegionDesc& desc) {
    const std::pair<uint64_t, uint64_t> key{desc.dev, desc.ino};
    std::lock_guard<std::mutex> lock(maps_mu_);
    for (auto it = maps_.begin(); it != maps_.end();) {  // forget chunks no longer attached
      it = it->second.expired() ? maps_.erase(it) : std::next(it);
    }
    if (auto known = maps_[key].lock()) return known;
    std::string path = "/proc/" + std::to_string(desc.pid) + "/fd/" + std::to_string(desc.fd);
    int fd = open(path.c_str(), O_RDWR | O_CLOEXEC);
    if (fd < 0) {
      int err = errno;
      ThrowErrno(err == ENOENT ? ErrorKind::kPeerLost : ErrorKind::kRegion,
                 "Failed to open peer region " + path, err,
                 err == EACCES || err == EPERM
                     ? "tasks sharing memory must run as the same user; or use RDMADEV_FABRIC=tcp"
                     : "the peer closed the region or exited");
    }
    struct stat st;
    if (fstat(fd, &st) != 0 || st.st_ino != desc.ino || st.st_dev != desc.dev ||
        st.st_size <= 0 || static_cast<uint64_t>(st.st_size) % kPageSize != 0) {
      close(fd);
      throw Error(ErrorKind::kPeerLost,
                  "Failed to attach region " + std::to_string(desc.id) + ": " + path +
                      " is no longer that region (it was closed)",
                  0, "ask the peer for a fresh descriptor");
    }
    auto m = std::make_shared<ChunkMapping>();
    m->len = static_cast<uint64_t>(st.st_size);
    // MAP_POPULATE: fault the peer's pages into our page table now, not per transfer.
    void* p = mmap(nullptr, m->len, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd, 0);
    int err = errno;
    close(fd);
    if (p == MAP_FAILED) ThrowErrno(ErrorKind::kRegion, "Failed to map peer region " + path, err);
    m->base = static_cast<uint8_t*>(p);
    maps_[key] = m;
    return m;
  }

  std::string reach_;
  pid_t pid_;
  std::shared_mutex mu_;
  int pidfd_;
  std::mutex maps_mu_;
  std::map<std::pair<uint64_t, uint64_t>, std::weak_ptr<ChunkMapping>> maps_;  // (dev, ino)
};

class ShmFabric : public Fabric {
 public:
  ShmFabric() : host_(HostKey()) {}
  std::string name() const override { return ShmBackend::kName; }
  std::string reach() const override { return host_ + ":" + std::to_string(getpid()); }
  // A peer's write is a copy by one of its threads that passed its credit wait before the
  // release: one slot's memcpy (milliseconds), however long that thread is descheduled on a
  // loaded host; 2 s is ~100x the longest copy seen here (a 64 MiB slot).
  double late_write_window_s() const override { return 2; }
  bool CanReach(const std::string& peer_reach) const override {
    return peer_reach.rfind(host_ + ":", 0) == 0;
  }
  std::shared_ptr<Endpoint> Connect(const std::string& peer_reach, const Deadline&) override {
    if (!CanReach(peer_reach)) {
      throw Error(ErrorKind::kFabric, "Failed to connect over shm to '" + peer_reach +
                                          "': the peer runs on another host or pid namespace",
                  0, "use RDMADEV_FABRIC=auto or tcp across hosts");
    }
    std::string pid_text = peer_reach.substr(host_.size() + 1);
    char* end = nullptr;
    long pid = std::strtol(pid_text.c_str(), &end, 10);
    if (pid_text.empty() || *end != '\0' || pid <= 0) {
      throw Error(ErrorKind::kProtocol, "Failed to parse shm reach '" + peer_reach + "'");
    }
    int pidfd = PidfdOpen(static_cast<pid_t>(pid));
    if (pidfd < 0) {
      ThrowErrno(ErrorKind::kPeerLost, "Failed to connect over shm to pid " + pid_text, errno,
                 "the peer process is not running");
    }
    return std::make_shared<ShmEndpoint>(peer_reach, static_cast<pid_t>(pid), pidfd);
  }
  void Close() override {}

 private:
  std::string host_;
};

}  // namespace

std::string ShmBackend::UnviableReason(const ShmOptions&) {
  int fd = memfd_create("rdmadev-probe", MFD_CLOEXEC);
  if (fd < 0) return std::string("memfd_create failed: ") + std::strerror(errno);
  close(fd);
  int pidfd = PidfdOpen(getpid());
  if (pidfd < 0) {
    return std::string("pidfd_open failed (needs Linux 5.3+): ") + std::strerror(errno);
  }
  close(pidfd);
  if (access("/proc/self/fd", R_OK) != 0) return "/proc is not mounted";
  return "";
}

std::unique_ptr<Fabric> ShmBackend::Make(const FabricContext&, const ShmOptions&) {
  return std::unique_ptr<Fabric>(new ShmFabric());
}

}  // namespace rdmadev
