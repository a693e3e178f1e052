// RDMADEV_TEST's StreamExecutor side (TF's StreamExecutor C API), for rdmadev's tests only:
// see test_device.h. One device per process; device memory is host memory (aligned_alloc);
// every copy is a memcpy; streams, events and timers are trivially synchronous.
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <atomic>

#include "tensorflow/c/experimental/stream_executor/stream_executor.h"
#include "tensorflow/c/tf_status.h"
#include "test_device.h"

static const char kPlatformName[] = "RDMADEV_TEST_PLATFORM";
static const size_t kAlign = 64;

struct SP_Stream_st { int unused; };
struct SP_Event_st { int unused; };
struct SP_Timer_st { uint64_t start_ns, stop_ns; };

namespace {

std::atomic<int64_t> g_allocs{0}, g_in_use{0}, g_peak{0}, g_largest{0};

uint64_t NowNs() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return uint64_t(ts.tv_sec) * 1000000000u + uint64_t(ts.tv_nsec);
}

void* AlignedAlloc(uint64_t size) {  // aligned_alloc wants a multiple of the alignment
  return aligned_alloc(kAlign, size == 0 ? kAlign : (size + kAlign - 1) / kAlign * kAlign);
}

void Allocate(const SP_Device*, uint64_t size, int64_t, SP_DeviceMemoryBase* mem) {
  mem->struct_size = SP_DEVICE_MEMORY_BASE_STRUCT_SIZE;
  mem->opaque = AlignedAlloc(size);
  mem->size = mem->opaque ? size : 0;
  if (!mem->opaque) return;
  g_allocs++;
  int64_t now = g_in_use += int64_t(size);
  for (int64_t p = g_peak; now > p && !g_peak.compare_exchange_weak(p, now);) {}
  for (int64_t l = g_largest; int64_t(size) > l && !g_largest.compare_exchange_weak(l, size);) {}
}

void Deallocate(const SP_Device*, SP_DeviceMemoryBase* mem) {
  if (!mem->opaque) return;
  g_in_use -= int64_t(mem->size);
  free(mem->opaque);
  mem->opaque = nullptr;
  mem->size = 0;
}

void* HostAllocate(const SP_Device*, uint64_t size) { return AlignedAlloc(size); }
void HostDeallocate(const SP_Device*, void* mem) { free(mem); }

TF_Bool AllocatorStats(const SP_Device*, SP_AllocatorStats* stats) {
  *stats = SP_AllocatorStats{SP_ALLOCATORSTATS_STRUCT_SIZE};
  stats->num_allocs = g_allocs;
  stats->bytes_in_use = g_in_use;
  stats->peak_bytes_in_use = g_peak;
  stats->largest_alloc_size = g_largest;
  return true;
}

TF_Bool MemoryUsage(const SP_Device*, int64_t* free_bytes, int64_t* total) {
  *total = int64_t(sysconf(_SC_PHYS_PAGES)) * sysconf(_SC_PAGE_SIZE);
  *free_bytes = int64_t(sysconf(_SC_AVPHYS_PAGES)) * sysconf(_SC_PAGE_SIZE);
  return true;
}

using Dev = const SP_Device*;
using Mem = SP_DeviceMemoryBase;
void Ok(TF_Status* st) { TF_SetStatus(st, TF_OK, ""); }

void CreateStream(Dev, SP_Stream* s, TF_Status* st) { *s = new SP_Stream_st{}; Ok(st); }
void DestroyStream(Dev, SP_Stream s) { delete s; }
void OkStreams(Dev, SP_Stream, SP_Stream, TF_Status* st) { Ok(st); }
void OkStream(Dev, SP_Stream, TF_Status* st) { Ok(st); }
void OkDevice(Dev, TF_Status* st) { Ok(st); }
void CreateEvent(Dev, SP_Event* e, TF_Status* st) { *e = new SP_Event_st{}; Ok(st); }
void DestroyEvent(Dev, SP_Event e) { delete e; }
SE_EventStatus EventStatus(Dev, SP_Event) { return SE_EVENT_COMPLETE; }
void OkStreamEvent(Dev, SP_Stream, SP_Event, TF_Status* st) { Ok(st); }
void OkEvent(Dev, SP_Event, TF_Status* st) { Ok(st); }
void CreateTimer(Dev, SP_Timer* t, TF_Status* st) { *t = new SP_Timer_st{}; Ok(st); }
void DestroyTimer(Dev, SP_Timer t) { delete t; }
void StartTimer(Dev, SP_Stream, SP_Timer t, TF_Status* st) { t->start_ns = NowNs(); Ok(st); }
void StopTimer(Dev, SP_Stream, SP_Timer t, TF_Status* st) { t->stop_ns = NowNs(); Ok(st); }
uint64_t TimerNs(SP_Timer t) { return t->stop_ns - t->start_ns; }

// Every copy is a memcpy, done before the call returns; the async forms are the sync ones.
void Copy(void* dst, const void* src, uint64_t size, TF_Status* st) {
  if (size) memcpy(dst, src, size);
  Ok(st);
}
void SyncDtoH(Dev, void* dst, const Mem* src, uint64_t n, TF_Status* st) { Copy(dst, src->opaque, n, st); }
void SyncHtoD(Dev, Mem* dst, const void* src, uint64_t n, TF_Status* st) { Copy(dst->opaque, src, n, st); }
void SyncDtoD(Dev, Mem* dst, const Mem* src, uint64_t n, TF_Status* st) { Copy(dst->opaque, src->opaque, n, st); }
void DtoH(Dev, SP_Stream, void* dst, const Mem* src, uint64_t n, TF_Status* st) { Copy(dst, src->opaque, n, st); }
void HtoD(Dev, SP_Stream, Mem* dst, const void* src, uint64_t n, TF_Status* st) { Copy(dst->opaque, src, n, st); }
void DtoD(Dev d, SP_Stream, Mem* dst, const Mem* src, uint64_t n, TF_Status* st) { SyncDtoD(d, dst, src, n, st); }

void MemZero(Dev, SP_Stream, Mem* m, uint64_t n, TF_Status* st) { memset(m->opaque, 0, n); Ok(st); }
void Memset8(Dev, SP_Stream, Mem* m, uint8_t v, uint64_t n, TF_Status* st) { memset(m->opaque, v, n); Ok(st); }
void Memset32(Dev, SP_Stream, Mem* m, uint32_t v, uint64_t n, TF_Status* st) {
  uint32_t* p = static_cast<uint32_t*>(m->opaque);
  for (uint64_t i = 0; i < n / 4; ++i) p[i] = v;
  Ok(st);
}

TF_Bool HostCallback(const SP_Device*, SP_Stream, SE_StatusCallbackFn fn, void* arg) {
  TF_Status* st = TF_NewStatus();  // the stream is always idle: run the callback now
  fn(arg, st);
  TF_DeleteStatus(st);
  return true;
}

void DeviceCount(const SP_Platform*, int* n, TF_Status* st) { *n = 1; TF_SetStatus(st, TF_OK, ""); }

void CreateDevice(const SP_Platform*, SE_CreateDeviceParams* p, TF_Status* st) {
  if (p->ordinal != 0) {
    TF_SetStatus(st, TF_INVALID_ARGUMENT, "RDMADEV_TEST has one device per process");
    return;
  }
  SP_Device* d = p->device;
  *d = SP_Device{SP_DEVICE_STRUCT_SIZE};
  d->ordinal = 0;
  d->hardware_name = "rdmadev test device (host memory)";
  d->device_vendor = "rdmadev tests";
  TF_SetStatus(st, TF_OK, "");
}
void DestroyDevice(const SP_Platform*, SP_Device*) {}

int32_t NumaNode(const SP_Device*) { return -1; }
int64_t Bandwidth(const SP_Device*) { return 1024; }
double Gflops(const SP_Device*) { return 1.0; }
void CreateDeviceFns(const SP_Platform*, SE_CreateDeviceFnsParams* p, TF_Status* st) {
  SP_DeviceFns* f = p->device_fns;
  *f = SP_DeviceFns{SP_DEVICE_FNS_STRUCT_SIZE};
  f->get_numa_node = NumaNode;
  f->get_memory_bandwidth = Bandwidth;
  f->get_gflops = Gflops;
  TF_SetStatus(st, TF_OK, "");
}
void DestroyDeviceFns(const SP_Platform*, SP_DeviceFns*) {}

void CreateStreamExecutor(const SP_Platform*, SE_CreateStreamExecutorParams* p, TF_Status* st) {
  SP_StreamExecutor* se = p->stream_executor;
  *se = SP_StreamExecutor{SP_STREAMEXECUTOR_STRUCT_SIZE};
  se->allocate = Allocate;
  se->deallocate = Deallocate;
  se->host_memory_allocate = HostAllocate;
  se->host_memory_deallocate = HostDeallocate;
  se->get_allocator_stats = AllocatorStats;
  se->device_memory_usage = MemoryUsage;
  se->create_stream = CreateStream;
  se->destroy_stream = DestroyStream;
  se->create_stream_dependency = OkStreams;
  se->get_stream_status = OkStream;
  se->create_event = CreateEvent;
  se->destroy_event = DestroyEvent;
  se->get_event_status = EventStatus;
  se->record_event = OkStreamEvent;
  se->wait_for_event = OkStreamEvent;
  se->create_timer = CreateTimer;
  se->destroy_timer = DestroyTimer;
  se->start_timer = StartTimer;
  se->stop_timer = StopTimer;
  se->memcpy_dtoh = DtoH;
  se->memcpy_htod = HtoD;
  se->memcpy_dtod = DtoD;
  se->sync_memcpy_dtoh = SyncDtoH;
  se->sync_memcpy_htod = SyncHtoD;
  se->sync_memcpy_dtod = SyncDtoD;
  se->block_host_for_event = OkEvent;
  se->block_host_until_done = OkStream;
  se->synchronize_all_activity = OkDevice;
  se->mem_zero = MemZero;
  se->memset = Memset8;
  se->memset32 = Memset32;
  se->host_callback = HostCallback;
  TF_SetStatus(st, TF_OK, "");
}
void DestroyStreamExecutor(const SP_Platform*, SP_StreamExecutor*) {}

void CreateTimerFns(const SP_Platform*, SP_TimerFns* t, TF_Status* st) {
  *t = SP_TimerFns{SP_TIMER_FNS_STRUCT_SIZE};
  t->nanoseconds = TimerNs;
  TF_SetStatus(st, TF_OK, "");
}
void DestroyTimerFns(const SP_Platform*, SP_TimerFns*) {}
void DestroyPlatform(SP_Platform*) {}
void DestroyPlatformFns(SP_PlatformFns*) {}

}  // namespace

extern "C" void SE_InitPlugin(SE_PlatformRegistrationParams* params, TF_Status* status) {
  params->major_version = SE_MAJOR;
  params->minor_version = SE_MINOR;
  params->patch_version = SE_PATCH;
  SP_Platform* p = params->platform;
  *p = SP_Platform{SP_PLATFORM_STRUCT_SIZE};
  p->name = kPlatformName;
  p->type = kDeviceType;
  p->supports_unified_memory = false;
  p->use_bfc_allocator = false;  // every tensor is its own aligned_alloc
  p->force_memory_growth = false;
  SP_PlatformFns* f = params->platform_fns;
  *f = SP_PlatformFns{SP_PLATFORM_FNS_STRUCT_SIZE};
  f->get_device_count = DeviceCount;
  f->create_device = CreateDevice;
  f->destroy_device = DestroyDevice;
  f->create_device_fns = CreateDeviceFns;
  f->destroy_device_fns = DestroyDeviceFns;
  f->create_stream_executor = CreateStreamExecutor;
  f->destroy_stream_executor = DestroyStreamExecutor;
  f->create_timer_fns = CreateTimerFns;
  f->destroy_timer_fns = DestroyTimerFns;
  params->destroy_platform = DestroyPlatform;
  params->destroy_platform_fns = DestroyPlatformFns;
  TF_SetStatus(status, TF_OK, "");
}
