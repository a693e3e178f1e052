// RDMADEV_TEST's kernels (TF's C kernel API), for rdmadev's tests only: see test_device.h.
// Single-threaded, fixed summation order: the same inputs give the same bits on every run.
#include <stdio.h>
#include <string.h>

#include <string>
#include <vector>

#include "tensorflow/c/kernels.h"
#include "tensorflow/c/tf_status.h"
#include "tensorflow/c/tf_tensor.h"
#include "test_device.h"

namespace {

// Owns one TF_Status per compute call; Fail() reports `what` as the kernel's error.
struct Ctx {
  TF_OpKernelContext* ctx;
  TF_Status* st = TF_NewStatus();
  std::vector<TF_Tensor*> owned;
  explicit Ctx(TF_OpKernelContext* c) : ctx(c) {}
  ~Ctx() { for (TF_Tensor* t : owned) TF_DeleteTensor(t); TF_DeleteStatus(st); }
  bool ok() const { return TF_GetCode(st) == TF_OK; }
  bool Fail(const std::string& what) {
    TF_StringView op = TF_GetOpKernelName(ctx);
    TF_SetStatus(st, TF_INVALID_ARGUMENT, (std::string(op.data, op.len) + ": " + what).c_str());
    TF_OpKernelContext_Failure(ctx, st);
    return false;
  }
  bool Check() { if (!ok()) TF_OpKernelContext_Failure(ctx, st); return ok(); }
  TF_Tensor* In(int i) {
    TF_Tensor* t = nullptr;
    TF_GetInput(ctx, i, &t, st);
    if (!Check()) return nullptr;
    owned.push_back(t);
    return t;
  }
  TF_Tensor* Out(int i, TF_DataType dt, const std::vector<int64_t>& dims) {
    int64_t n = 1;
    for (int64_t d : dims) n *= d;
    size_t bytes = size_t(n) * TF_DataTypeSize(dt);
    TF_Tensor* t = TF_AllocateOutput(ctx, i, dt, dims.data(), int(dims.size()), bytes, st);
    if (!Check()) return nullptr;
    owned.push_back(t);
    return t;
  }
};

std::vector<int64_t> Dims(const TF_Tensor* t) {
  std::vector<int64_t> d(TF_NumDims(t));
  for (size_t i = 0; i < d.size(); ++i) d[i] = TF_Dim(t, int(i));
  return d;
}
const float* F(const TF_Tensor* t) { return static_cast<const float*>(TF_TensorData(t)); }
float* MutF(TF_Tensor* t) { return static_cast<float*>(TF_TensorData(t)); }

struct Attrs { TF_Bool a = false, b = false; };

void* MatMulCreate(TF_OpKernelConstruction* c) {
  Attrs* at = new Attrs;
  TF_Status* st = TF_NewStatus();
  TF_OpKernelConstruction_GetAttrBool(c, "transpose_a", &at->a, st);
  if (TF_GetCode(st) == TF_OK) TF_OpKernelConstruction_GetAttrBool(c, "transpose_b", &at->b, st);
  if (TF_GetCode(st) != TF_OK) TF_OpKernelConstruction_Failure(c, st);
  TF_DeleteStatus(st);
  return at;
}
void MatMulDelete(void* at) { delete static_cast<Attrs*>(at); }

void MatMulCompute(void* kernel, TF_OpKernelContext* c) {
  const Attrs& at = *static_cast<Attrs*>(kernel);
  Ctx k(c);
  TF_Tensor *a = k.In(0), *b = a ? k.In(1) : nullptr;
  if (!b) return;
  auto da = Dims(a), db = Dims(b);
  if (da.size() != 2 || db.size() != 2) { k.Fail("both inputs must be matrices"); return; }
  const int64_t m = at.a ? da[1] : da[0], ka = at.a ? da[0] : da[1];
  const int64_t kb = at.b ? db[1] : db[0], n = at.b ? db[0] : db[1];
  if (ka != kb) { k.Fail("inner dimensions differ: " + std::to_string(ka) + " vs " + std::to_string(kb)); return; }
  TF_Tensor* out = k.Out(0, TF_FLOAT, {m, n});
  if (!out) return;
  const float *pa = F(a), *pb = F(b);
  float* pc = MutF(out);
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < n; ++j) {
      float sum = 0.0f;  // fixed order: p = 0, 1, ..., ka - 1
      for (int64_t p = 0; p < ka; ++p)
        sum += (at.a ? pa[p * m + i] : pa[i * ka + p]) * (at.b ? pb[j * kb + p] : pb[p * n + j]);
      pc[i * n + j] = sum;
    }
}

template <float (*Op)(float)>
void UnaryCompute(void*, TF_OpKernelContext* c) {
  Ctx k(c);
  TF_Tensor* x = k.In(0);
  TF_Tensor* y = x ? k.Out(0, TF_FLOAT, Dims(x)) : nullptr;
  if (!y) return;
  const int64_t n = TF_TensorElementCount(x);
  for (int64_t i = 0; i < n; ++i) MutF(y)[i] = Op(F(x)[i]);
}
float Relu(float x) { return x > 0.0f ? x : 0.0f; }
float Square(float x) { return x * x; }

// Binary ops with NumPy broadcasting: dims aligned from the right, size 1 stretches.
template <float (*Op)(float, float)>
void BinaryCompute(void*, TF_OpKernelContext* c) {
  Ctx k(c);
  TF_Tensor *x = k.In(0), *y = x ? k.In(1) : nullptr;
  if (!y) return;
  auto dx = Dims(x), dy = Dims(y);
  const size_t r = dx.size() > dy.size() ? dx.size() : dy.size();
  dx.insert(dx.begin(), r - dx.size(), 1);
  dy.insert(dy.begin(), r - dy.size(), 1);
  std::vector<int64_t> dz(r), sx(r), sy(r);
  for (size_t i = 0; i < r; ++i) {
    if (dx[i] != dy[i] && dx[i] != 1 && dy[i] != 1) { k.Fail("shapes cannot be broadcast"); return; }
    dz[i] = dx[i] == 1 ? dy[i] : dx[i];
  }
  for (int64_t i = int64_t(r) - 1, ax = 1, ay = 1; i >= 0; ax *= dx[i], ay *= dy[i], --i) {
    sx[i] = dx[i] == 1 ? 0 : ax;  // a stretched dim does not move through its input
    sy[i] = dy[i] == 1 ? 0 : ay;
  }
  TF_Tensor* z = k.Out(0, TF_FLOAT, dz);
  if (!z) return;
  const int64_t n = TF_TensorElementCount(z);
  std::vector<int64_t> idx(r, 0);
  int64_t ox = 0, oy = 0;
  for (int64_t e = 0; e < n; ++e) {
    MutF(z)[e] = Op(F(x)[ox], F(y)[oy]);
    for (int64_t i = int64_t(r) - 1; i >= 0; --i) {  // odometer step over the output index
      ox += sx[i], oy += sy[i];
      if (++idx[i] < dz[i]) break;
      ox -= sx[i] * dz[i], oy -= sy[i] * dz[i], idx[i] = 0;
    }
  }
}
float Add(float a, float b) { return a + b; }
float Sub(float a, float b) { return a - b; }
float Mul(float a, float b) { return a * b; }
float ReluGrad(float g, float x) { return x > 0.0f ? g : 0.0f; }

void* SumCreate(TF_OpKernelConstruction* c) {
  TF_Bool* keep = new TF_Bool(false);
  TF_Status* st = TF_NewStatus();
  TF_OpKernelConstruction_GetAttrBool(c, "keep_dims", keep, st);
  if (TF_GetCode(st) != TF_OK) TF_OpKernelConstruction_Failure(c, st);
  TF_DeleteStatus(st);
  return keep;
}
void SumDelete(void* keep) { delete static_cast<TF_Bool*>(keep); }

void SumCompute(void* kernel, TF_OpKernelContext* c) {
  Ctx k(c);
  TF_Tensor *x = k.In(0), *ax = x ? k.In(1) : nullptr;
  if (!ax) return;
  auto dx = Dims(x);
  const int64_t r = int64_t(dx.size()), na = TF_TensorElementCount(ax);
  std::vector<bool> reduced(r, false);
  for (int64_t i = 0; i < na; ++i) {
    int64_t a = TF_TensorType(ax) == TF_INT32 ? static_cast<const int32_t*>(TF_TensorData(ax))[i]
                                              : static_cast<const int64_t*>(TF_TensorData(ax))[i];
    if (a < -r || a >= r) {
      k.Fail("axis " + std::to_string(a) + " out of range for rank " + std::to_string(r));
      return;
    }
    reduced[a < 0 ? a + r : a] = true;
  }
  std::vector<int64_t> dout, so(r);  // so: the output stride of each input dim (0 if reduced)
  for (int64_t i = 0; i < r; ++i)
    if (!reduced[i] || *static_cast<TF_Bool*>(kernel)) dout.push_back(reduced[i] ? 1 : dx[i]);
  for (int64_t i = r - 1, s = 1; i >= 0; --i) { so[i] = reduced[i] ? 0 : s; if (!reduced[i]) s *= dx[i]; }
  TF_Tensor* out = k.Out(0, TF_FLOAT, dout);
  if (!out) return;
  float* po = MutF(out);
  for (int64_t i = 0, n = TF_TensorElementCount(out); i < n; ++i) po[i] = 0.0f;
  const int64_t n = TF_TensorElementCount(x);
  std::vector<int64_t> idx(r, 0);
  int64_t o = 0;
  for (int64_t e = 0; e < n; ++e) {  // input order: a fixed summation order
    po[o] += F(x)[e];
    for (int64_t i = r - 1; i >= 0; --i) {
      o += so[i];
      if (++idx[i] < dx[i]) break;
      o -= so[i] * dx[i], idx[i] = 0;
    }
  }
}

void IdentityCompute(void*, TF_OpKernelContext* c) {
  Ctx k(c);
  TF_Tensor* x = k.In(0);
  TF_Tensor* y = x ? k.Out(0, TF_TensorType(x), Dims(x)) : nullptr;
  if (y && TF_TensorByteSize(x)) memcpy(TF_TensorData(y), TF_TensorData(x), TF_TensorByteSize(x));
}

// Registers `op` on RDMADEV_TEST with attr `attr` (if any) constrained to `dt`.
void Register(const char* op, const char* attr, TF_DataType dt, void (*compute)(void*, TF_OpKernelContext*),
              void* (*create)(TF_OpKernelConstruction*) = nullptr, void (*del)(void*) = nullptr,
              const char* host_arg = nullptr, TF_DataType idx_dt = TF_INT32) {
  TF_Status* st = TF_NewStatus();
  TF_KernelBuilder* b = TF_NewKernelBuilder(op, kDeviceType, create, compute, del);
  if (attr) TF_KernelBuilder_TypeConstraint(b, attr, dt, st);
  if (host_arg && TF_GetCode(st) == TF_OK) {
    TF_KernelBuilder_HostMemory(b, host_arg);
    TF_KernelBuilder_TypeConstraint(b, "Tidx", idx_dt, st);
  }
  std::string name = std::string("RdmadevTest") + op + "_" + std::to_string(dt) + "_" + std::to_string(idx_dt);
  if (TF_GetCode(st) == TF_OK) TF_RegisterKernelBuilder(name.c_str(), b, st);
  else TF_DeleteKernelBuilder(b);
  if (TF_GetCode(st) != TF_OK)  // no way to return an error from TF_InitKernel: say it once
    fprintf(stderr, "RDMADEV_TEST device plugin: registering %s failed: %s\n", name.c_str(), TF_Message(st));
  TF_DeleteStatus(st);
}

}  // namespace

extern "C" void TF_InitKernel() {
  Register("MatMul", "T", TF_FLOAT, MatMulCompute, MatMulCreate, MatMulDelete);
  Register("Relu", "T", TF_FLOAT, UnaryCompute<Relu>);
  Register("Square", "T", TF_FLOAT, UnaryCompute<Square>);
  Register("ReluGrad", "T", TF_FLOAT, BinaryCompute<ReluGrad>);
  Register("AddV2", "T", TF_FLOAT, BinaryCompute<Add>);
  Register("Sub", "T", TF_FLOAT, BinaryCompute<Sub>);
  Register("Mul", "T", TF_FLOAT, BinaryCompute<Mul>);
  for (TF_DataType idx : {TF_INT32, TF_INT64})
    Register("Sum", "T", TF_FLOAT, SumCompute, SumCreate, SumDelete, "reduction_indices", idx);
  for (TF_DataType dt : {TF_FLOAT, TF_DOUBLE, TF_HALF, TF_BFLOAT16, TF_INT8, TF_INT16, TF_INT32, TF_INT64,
                         TF_UINT8, TF_UINT16, TF_UINT32, TF_UINT64, TF_BOOL, TF_COMPLEX64, TF_COMPLEX128})
    Register("Identity", "T", dt, IdentityCompute);
}
