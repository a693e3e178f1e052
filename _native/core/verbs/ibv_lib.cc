#include "ibv_lib.h"

#include <dlfcn.h>

#include <mutex>

namespace rdmadev {

#if RDMADEV_HAVE_VERBS
namespace {

template <typename F>
bool Resolve(void* h, const char* name, F* slot, std::string* missing) {
  *slot = reinterpret_cast<F>(dlsym(h, name));
  if (!*slot) *missing += std::string(missing->empty() ? "" : ", ") + name;
  return *slot != nullptr;
}

}  // namespace

const IbvLib* LoadIbv(std::string* why) {
  static std::once_flag once;
  static IbvLib lib;
  static const IbvLib* loaded = nullptr;
  static std::string error;
  std::call_once(once, [] {
    // RTLD_LOCAL: the providers (librxe, libmlx5 ...) are loaded by libibverbs itself.
    void* h = dlopen("libibverbs.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!h) {
      const char* e = dlerror();
      error = std::string("libibverbs is not installed (") + (e ? e : "dlopen failed") +
              "): apt-get install libibverbs1 ibverbs-providers (or rdma-core)";
      return;
    }
    std::string missing;
    Resolve(h, "ibv_get_device_list", &lib.get_device_list, &missing);
    Resolve(h, "ibv_free_device_list", &lib.free_device_list, &missing);
    Resolve(h, "ibv_get_device_name", &lib.get_device_name, &missing);
    Resolve(h, "ibv_open_device", &lib.open_device, &missing);
    Resolve(h, "ibv_close_device", &lib.close_device, &missing);
    Resolve(h, "ibv_query_device", &lib.query_device, &missing);
    Resolve(h, "ibv_query_port", &lib.query_port, &missing);
    Resolve(h, "ibv_query_gid", &lib.query_gid, &missing);
    Resolve(h, "ibv_alloc_pd", &lib.alloc_pd, &missing);
    Resolve(h, "ibv_dealloc_pd", &lib.dealloc_pd, &missing);
    Resolve(h, "ibv_reg_mr", &lib.reg_mr, &missing);
    Resolve(h, "ibv_dereg_mr", &lib.dereg_mr, &missing);
    Resolve(h, "ibv_create_cq", &lib.create_cq, &missing);
    Resolve(h, "ibv_destroy_cq", &lib.destroy_cq, &missing);
    Resolve(h, "ibv_create_qp", &lib.create_qp, &missing);
    Resolve(h, "ibv_modify_qp", &lib.modify_qp, &missing);
    Resolve(h, "ibv_destroy_qp", &lib.destroy_qp, &missing);
    Resolve(h, "ibv_wc_status_str", &lib.wc_status_str, &missing);
    if (!missing.empty()) {
      error = "libibverbs.so.1 lacks " + missing + ": install a current rdma-core";
      dlclose(h);
      return;
    }
    loaded = &lib;
  });
  if (!loaded && why) *why = error;
  return loaded;
}

#else

const IbvLib* LoadIbv(std::string* why) {
  if (why) {
    *why = "this rdmadev was built without the libibverbs headers (<infiniband/verbs.h>): "
           "install them (libibverbs-dev on Debian and Ubuntu, rdma-core-devel on RHEL) and "
           "build rdmadev again where they are (pip install -e . in its tree; a wheel: build "
           "it on a machine that has them)";
  }
  return nullptr;
}

#endif

}  // namespace rdmadev
