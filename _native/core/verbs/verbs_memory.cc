#include "verbs_memory.h"

#include <sys/resource.h>

#include <mutex>

namespace rdmadev {

#if RDMADEV_HAVE_VERBS
namespace {

// Sizes for messages, rounded up (a "needs" figure must not understate).
std::string Bytes(uint64_t n) {
  if (n >= (uint64_t(1) << 20)) return std::to_string((n + (1 << 20) - 1) >> 20) + " MiB";
  if (n >= 1024) return std::to_string((n + 1023) >> 10) + " KiB";
  return std::to_string(n) + " bytes";
}

std::string MemlockText() {
  rlimit rl{};
  if (getrlimit(RLIMIT_MEMLOCK, &rl) != 0) return "unknown";
  return rl.rlim_cur == RLIM_INFINITY ? "unlimited" : Bytes(rl.rlim_cur);
}

}  // namespace

VerbsMemory::VerbsMemory(std::unique_ptr<VerbsDevice> dev) : dev_(std::move(dev)) {
  pd_ = dev_->lib->alloc_pd(dev_->ctx);
  if (!pd_) {
    ThrowErrno(ErrorKind::kFabric, "Failed to allocate protection domain on " + dev_->name, errno,
               "the device is out of resources");
  }
}

VerbsMemory::~VerbsMemory() {
  DeregisterAll();
  if (pd_) dev_->lib->dealloc_pd(pd_);
  // dev_ closes the device context last.
}

ibv_mr* VerbsMemory::Reg(void* p, size_t len, const std::string& what) {
  int access = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ;
  ibv_mr* mr = dev_->lib->reg_mr(pd_, p, len, access);
  if (mr) return mr;
  int err = errno;
  std::string msg = "Failed to register " + what + " (" + Bytes(len) + ") with RDMA device " +
                    dev_->name;
  if (err == ENOMEM || err == EAGAIN || err == EPERM) {
    uint64_t have;
    {
      std::shared_lock<std::shared_mutex> lock(mu_);
      have = registered_bytes_;
    }
    ThrowErrno(ErrorKind::kRegion, msg, err,
               "registration pins memory: this process needs " + Bytes(have + len) +
                   " locked (" + Bytes(have) + " registered already + " + Bytes(len) +
                   ") but RLIMIT_MEMLOCK is " + MemlockText() +
                   ". Raise it: `ulimit -l unlimited` in the launching shell, memlock in "
                   "/etc/security/limits.conf, LimitMEMLOCK=infinity for a systemd unit, "
                   "`--ulimit memlock=-1` for docker");
  }
  ThrowErrno(ErrorKind::kRegion, msg, err,
             "check `rdmadev doctor` and the kernel log (dmesg) for the device's reason");
}

void VerbsMemory::Register(Chunk& chunk) {
  ibv_mr* mr = Reg(chunk.base(), chunk.size(), "a chunk of regions");
  std::unique_lock<std::shared_mutex> lock(mu_);
  by_chunk_[chunk.id()] = mr;
  by_address_[reinterpret_cast<uintptr_t>(chunk.base())] = mr;
  registered_bytes_ += chunk.size();
  chunk.SetVerbsKey(reinterpret_cast<uint64_t>(chunk.base()), mr->rkey);
}

void VerbsMemory::Deregister(Chunk& chunk) {
  ibv_mr* mr = nullptr;
  {
    std::unique_lock<std::shared_mutex> lock(mu_);
    auto it = by_chunk_.find(chunk.id());
    if (it == by_chunk_.end()) return;
    mr = it->second;
    by_chunk_.erase(it);
    by_address_.erase(reinterpret_cast<uintptr_t>(mr->addr));
    registered_bytes_ -= mr->length;
  }
  chunk.SetVerbsKey(0, 0);
  dev_->lib->dereg_mr(mr);
}

ibv_mr* VerbsMemory::RegisterBuffer(void* p, size_t len, const std::string& what) {
  ibv_mr* mr = Reg(p, len, what);
  std::unique_lock<std::shared_mutex> lock(mu_);
  registered_bytes_ += len;
  return mr;
}

void VerbsMemory::DeregisterBuffer(ibv_mr* mr) {
  {
    std::unique_lock<std::shared_mutex> lock(mu_);
    registered_bytes_ -= mr->length;
  }
  dev_->lib->dereg_mr(mr);
}

bool VerbsMemory::LocalKey(const void* p, uint64_t len, uint32_t* lkey) const {
  auto a = reinterpret_cast<uintptr_t>(p);
  std::shared_lock<std::shared_mutex> lock(mu_);
  auto it = by_address_.upper_bound(a);
  if (it == by_address_.begin()) return false;
  --it;
  ibv_mr* mr = it->second;
  if (a - it->first > mr->length || len > mr->length - (a - it->first)) return false;
  *lkey = mr->lkey;
  return true;
}

void VerbsMemory::DeregisterAll() {
  std::map<uint64_t, ibv_mr*> regs;
  {
    std::unique_lock<std::shared_mutex> lock(mu_);
    regs.swap(by_chunk_);
    by_address_.clear();
    registered_bytes_ = 0;
  }
  for (auto& kv : regs) dev_->lib->dereg_mr(kv.second);
}
#endif

}  // namespace rdmadev
