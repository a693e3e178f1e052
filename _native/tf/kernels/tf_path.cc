// TfPath (tf_path.h): TF's _Send/_Recv for a half pair kept on TF's path, as
// tensorflow/core/kernels/sendrecv_ops.cc does them.
#include "tf_path.h"

#include "tensorflow/core/framework/control_flow.h"

#include "kernel_support.h"

namespace rdmadev_tf {

TfPath::TfPath(tensorflow::OpKernelConstruction* c) {
  // TF's own attrs on a labelled node, the pass's copies on a half pair's RdmadevSend/Recv.
  const std::string prefix = IsTransferNode(c) ? "" : kRendezvousPrefix;
  if (!c->HasAttr(prefix + "tensor_name")) return;  // not a half pair's
  int64_t incarnation = 0;
  OP_REQUIRES_OK(c, c->GetAttr(prefix + "send_device", &send_device_));
  OP_REQUIRES_OK(c, c->GetAttr(prefix + "recv_device", &recv_device_));
  OP_REQUIRES_OK(c, c->GetAttr(prefix + "send_device_incarnation", &incarnation));
  OP_REQUIRES_OK(c, c->GetAttr(prefix + "tensor_name", &tensor_name_));
  send_device_incarnation_ = static_cast<uint64_t>(incarnation);
  host_memory_ = c->def().op() == "_HostSend" || c->def().op() == "_HostRecv";
  available_ = true;
}

absl::Status TfPath::KeyOf(tensorflow::OpKernelContext* ctx,
                           tensorflow::Rendezvous::ParsedKey* key) const {
  if (!available_) {
    return absl::InternalError("rdmadev: a half kept on TF's path has no rendezvous attrs "
                               "(its node is not a half pair's)");
  }
  if (ctx->rendezvous() == nullptr) {
    return absl::InternalError("rdmadev: a half kept on TF's path runs without a rendezvous");
  }
  // TF's host-memory pairs inside a function are keyed by the call frame (sendrecv_ops.cc).
  tensorflow::FrameAndIter frame_iter = ctx->frame_iter();
  if (host_memory_ && ctx->call_frame() != nullptr) {
    frame_iter = tensorflow::FrameAndIter(reinterpret_cast<uint64_t>(ctx->call_frame()), 0);
  }
  return tensorflow::Rendezvous::ParseKey(
      tensorflow::Rendezvous::CreateKey(send_device_, send_device_incarnation_, recv_device_,
                                        tensor_name_, frame_iter),
      key);
}

void TfPath::Send(tensorflow::OpKernelContext* ctx) const {
  tensorflow::Rendezvous::ParsedKey key;
  OP_REQUIRES_OK(ctx, KeyOf(ctx, &key));
  tensorflow::Rendezvous::Args args;
  args.device_context = ctx->op_device_context();
  args.alloc_attrs = ctx->input_alloc_attr(0);
  // rdmadev's kernels run on a CPU, also for a half of another device's pair (a labelled copy
  // on its task's host, pass.cc ApplyViaHost): the tensor is in host memory.
  args.alloc_attrs.set_on_host(true);
  OP_REQUIRES_OK(ctx, ctx->rendezvous()->Send(key, args, ctx->input(0), ctx->is_input_dead()));
}

void TfPath::RecvAsync(tensorflow::OpKernelContext* ctx,
                       tensorflow::AsyncOpKernel::DoneCallback done) const {
  tensorflow::Rendezvous::ParsedKey key;
  OP_REQUIRES_OK_ASYNC(ctx, KeyOf(ctx, &key), done);
  tensorflow::Rendezvous::Args args;
  args.device_context = ctx->op_device_context();
  args.alloc_attrs = ctx->output_alloc_attr(0);
  args.alloc_attrs.set_on_host(true);  // as in Send
  args.cancellation_manager = ctx->cancellation_manager();
  ctx->rendezvous()->RecvAsync(
      key, args,
      [ctx, done = std::move(done)](const absl::Status& s, const tensorflow::Rendezvous::Args&,
                                    const tensorflow::Rendezvous::Args&,
                                    const tensorflow::Tensor& val, bool is_dead) {
        ctx->SetStatus(s);
        // A transfer node left without an output is dead to TF's executor.
        if (s.ok() && !is_dead) ctx->set_output(0, val);
        done();
      });
}

}  // namespace rdmadev_tf
