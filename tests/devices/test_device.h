// RDMADEV_TEST: a PluggableDevice for rdmadev's TESTS ONLY, never shipped.
//
// On CPU-only machines it gives TensorFlow a device that is not the CPU, so tests can move
// tensors that live in "device" memory. It is built and loaded by tests/device_plugin.py.
//
// * stream_executor.cc (SE_InitPlugin, TF's StreamExecutor C API): one device per process;
//   device memory is host memory (aligned_alloc); every copy (host<->device, device<->device)
//   is a memcpy; streams, events and timers are trivially synchronous: all work is done
//   by the time a call returns.
// * kernels.cc (TF_InitKernel, TF's C kernel API), float32 only unless said: MatMul
//   (transpose_a/b), Relu, ReluGrad, Square, AddV2/Sub/Mul (NumPy broadcasting), Sum
//   (given axes, keep_dims; reduction_indices int32/int64 in host memory), Identity (numeric
//   and bool dtypes, a memcpy). Single-threaded with a fixed summation order, so a result
//   is the same bit for bit on every run (but not TF's CPU kernels' bits: Eigen blocks).
//   Ops without a kernel here fall to the CPU by TF's soft placement.
#ifndef RDMADEV_TESTS_DEVICES_TEST_DEVICE_H_
#define RDMADEV_TESTS_DEVICES_TEST_DEVICE_H_

// The device type: TF wants capital letters and underscores only (no digits).
static const char kDeviceType[] = "RDMADEV_TEST";

#endif  // RDMADEV_TESTS_DEVICES_TEST_DEVICE_H_
