// TF's own path for a half pair the control plane could not set up (ChannelRegistry::KeepOnTf:
// its peer task runs without rdmadev, the receiving task has no room within its budget, the
// peer never planned its half). A half pair's node keeps TF's rendezvous attrs (labelled.h:
// TF's own _Send/_Recv, labelled, or an RdmadevSend/RdmadevRecv with the pass's copies); a
// kernel that finds its half kept does what TF's own SendOp/RecvOp do with them: Send puts the
// step's rendezvous, from which the receiving task's worker fetches it over gRPC, and
// RecvAsync fetches it from the sending task. Same keys as TF's (Rendezvous::CreateKey with
// the execution's frame and iteration), so either end may be TF's own kernel: a task started
// without rdmadev keeps TF's _Send/_Recv.
#pragma once

#include <string>

#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/rendezvous.h"

namespace rdmadev_tf {

class TfPath {
 public:
  // Reads the rendezvous attrs of the node `c` builds a kernel for; a node not of a half
  // pair has none (available() is false then).
  explicit TfPath(tensorflow::OpKernelConstruction* c);
  bool available() const { return available_; }

  // TF's _Send: puts input 0 (or its deadness) in the step's rendezvous; sets ctx's status.
  void Send(tensorflow::OpKernelContext* ctx) const;
  // TF's _Recv: output 0 (or its deadness) from the step's rendezvous, then done().
  void RecvAsync(tensorflow::OpKernelContext* ctx,
                 tensorflow::AsyncOpKernel::DoneCallback done) const;

 private:
  absl::Status KeyOf(tensorflow::OpKernelContext* ctx,
                     tensorflow::Rendezvous::ParsedKey* key) const;

  bool available_ = false;
  bool host_memory_ = false;  // _HostSend/_HostRecv: keyed by the function's call frame
  std::string send_device_, recv_device_, tensor_name_;
  uint64_t send_device_incarnation_ = 0;
};

}  // namespace rdmadev_tf
