// The rules the planner (graph_pass, Python) must apply exactly as rdmadev's passes do, decided
// here once: which ops are a rendezvous pair's halves, when a pair crosses tasks, the mark of a
// pair that leaves a conditional's branch, the attr of a run-time shape's bound, and where
// oneDNN's shape functions are wrong, and on which device rdmadev's node for a half runs. Plain C++ on strings, without TensorFlow: the passes use
// them (pairs.h, branch_exits.cc, shapes.cc), and the Cython bindings (rdmadev._native.rules)
// hand the same ones to the planner through rdmadev._core.planner_rules(), so that no Python
// copy exists to keep equal.
#pragma once

#include <cctype>
#include <string>

namespace rdmadev_tf {

// The ops of a rendezvous pair's halves (_HostSend/_HostRecv: a GPU device's host-memory
// tensors), each list ending with a null.
inline constexpr const char* kSendOps[] = {"_Send", "_HostSend", nullptr};
inline constexpr const char* kRecvOps[] = {"_Recv", "_HostRecv", nullptr};

inline bool OneOf(const char* const* names, const std::string& op) {
  for (; *names; ++names) {
    if (op == *names) return true;
  }
  return false;
}
inline bool IsSendOpName(const std::string& op) { return OneOf(kSendOps, op); }
inline bool IsRecvOpName(const std::string& op) { return OneOf(kRecvOps, op); }

// The task part of a TF device name: `/job:ps/replica:0/task:0` of
// `/job:ps/replica:0/task:0/device:CPU:0` (and of the legacy `.../task:0/cpu:0`).
inline std::string TaskOf(const std::string& device) {
  size_t t = device.find("/task:");
  if (t != std::string::npos) return device.substr(0, device.find('/', t + 1));
  size_t d = device.find("/device:");
  return d == std::string::npos ? device : device.substr(0, d);
}

// Whether a pair from `send_device` to `recv_device` joins two tasks: the traffic rdmadev
// plans (a pair within a task is TF's local rendezvous).
inline bool CrossesTasks(const std::string& send_device, const std::string& recv_device) {
  return TaskOf(send_device) != TaskOf(recv_device);
}

// The device kind rdmadev's kernels are registered for (kernels/recv_op.cc, send_op.cc): its
// ops run on a task's CPU, whatever device computes the tensor.
inline constexpr char kKernelDeviceKind[] = "CPU";

// The device rdmadev's node for a pair's half on `device` runs on: `device` itself when it is a
// CPU, else its task's CPU, through which the half crosses (the pass adds TF's own copy between
// the two: a GPU, PluggableDevice or XLA device has no rdmadev kernel). Legacy `.../cpu:0` names
// count as CPUs.
inline std::string KernelDevice(const std::string& device) {
  size_t last = device.rfind('/');
  std::string leaf = last == std::string::npos ? device : device.substr(last + 1);
  if (leaf.rfind("device:", 0) == 0) leaf = leaf.substr(7);
  std::string kind = leaf.substr(0, leaf.find(':'));
  for (char& c : kind) c = static_cast<char>(toupper(static_cast<unsigned char>(c)));
  if (kind == kKernelDeviceKind) return device;
  return TaskOf(device) + "/device:" + kKernelDeviceKind + ":0";
}

// What MarkBranchExitsPass (branch_exits.cc) names the node it puts between a branch's value
// and the task it crosses to, after the value's node: the partitioner names both halves of that
// pair after it (`_src`), so each half tells from its own partition that it is in a branch.
inline constexpr char kBranchMark[] = "/rdmadev_in_branch";

// The attr the pass writes on both halves of a pair whose tensor has a run-time shape with a
// known bound (a list of one fully defined shape; shapes.h).
inline constexpr char kBoundAttr[] = "_rdmadev_bound";

// oneDNN's fused rewrites (op names starting kUntrustedPrefix) register shape functions that
// are wrong past output 0: _MklNativeConv2DBackpropFilterWithBias gives its bias gradient
// (output 1) the conv's input channels instead of its output channels (commit 3601043;
// tests/planner/test_gp_shapes.py and tests/e2e's conv scenario). Those shapes stay unknown,
// and the planner gives the pair a dynamic channel. Outputs 1 and 2 of oneDNN's batch norms
// (op names containing kTrustedFused) are the exception: the batch statistics and the scale
// and offset gradients are [C] in TF's FusedBatchNorm(Grad) shape functions, which these ops
// register, and in their kernels. Distrusted, the batch statistics of benchmarks/cnn.py's
// resnet50 (53 batch norms x 2 x 2 workers) each took a dynamic channel of two 1 MiB slots on
// ps: 424 MiB for a few KiB a step.
inline constexpr char kUntrustedPrefix[] = "_Mkl";
inline constexpr char kTrustedFused[] = "FusedBatchNorm";

// False where TF's shape function for output `index` of op `op` is known to be wrong.
inline bool TrustedOutput(const std::string& op, int index) {
  if (index == 0 || op.rfind(kUntrustedPrefix, 0) != 0) return true;
  return (index == 1 || index == 2) && op.find(kTrustedFused) != std::string::npos;
}

}  // namespace rdmadev_tf
