// libibverbs, loaded at run time. rdmadev never links it: `import rdmadev` works on a
// machine without it, and the verbs fabric then reports "not viable" with the dlopen error.
// The types (and the inline ibv_post_send / ibv_poll_cq, which call through the provider's
// function table in struct ibv_context) come from <infiniband/verbs.h> at build time; every
// exported function is called through this table instead of by name.
#pragma once

#if __has_include(<infiniband/verbs.h>)
#include <infiniband/verbs.h>
#define RDMADEV_HAVE_VERBS 1
#else
#define RDMADEV_HAVE_VERBS 0
#endif

#include <string>

namespace rdmadev {

#if RDMADEV_HAVE_VERBS
// The exported libibverbs functions the fabric uses (documented in ibv_*(3)), resolved with
// dlsym from "libibverbs.so.1" (the soname every rdma-core since 2016 provides).
struct IbvLib {
  ibv_device** (*get_device_list)(int* num);
  void (*free_device_list)(ibv_device** list);
  const char* (*get_device_name)(ibv_device* device);
  ibv_context* (*open_device)(ibv_device* device);
  int (*close_device)(ibv_context* context);
  int (*query_device)(ibv_context* context, ibv_device_attr* attr);
  // The exported ibv_query_port fills the leading (compat) part of ibv_port_attr, which has
  // every field used here; the header's ibv_query_port macro would reference the symbol.
  int (*query_port)(ibv_context* context, uint8_t port, ibv_port_attr* attr);
  int (*query_gid)(ibv_context* context, uint8_t port, int index, ibv_gid* gid);
  ibv_pd* (*alloc_pd)(ibv_context* context);
  int (*dealloc_pd)(ibv_pd* pd);
  ibv_mr* (*reg_mr)(ibv_pd* pd, void* addr, size_t length, int access);
  int (*dereg_mr)(ibv_mr* mr);
  ibv_cq* (*create_cq)(ibv_context* context, int cqe, void* cq_context,
                       ibv_comp_channel* channel, int comp_vector);
  int (*destroy_cq)(ibv_cq* cq);
  ibv_qp* (*create_qp)(ibv_pd* pd, ibv_qp_init_attr* attr);
  int (*modify_qp)(ibv_qp* qp, ibv_qp_attr* attr, int mask);
  int (*destroy_qp)(ibv_qp* qp);
  const char* (*wc_status_str)(ibv_wc_status status);
};
#else
struct IbvLib;
#endif

// The loaded table (loaded once per process, never unloaded), or null with *why set.
const IbvLib* LoadIbv(std::string* why);

}  // namespace rdmadev
