// rdmadev's TensorFlow ops: RdmadevSend (one-sided write of a tensor into the peer's slot)
// and RdmadevRecv (waits for the slot's sequence word; its output may alias the slot): their
// interfaces. The kernels are in send_op.cc (its modes in send_write.h) and recv_op.h (its
// wait in recv_op.cc, its delivery modes in recv_delivery.h), what they share in
// kernel_support.h. Both are AsyncOpKernels completed by the domain's progress thread, so a
// waiting op never holds an inter-op thread (TF's pool has only as many threads as cores
// here).
//
// Kernels do not own their channels: TF destroys and re-creates the kernels of a function it
// still runs (measured: on every task when a ParameterServerStrategy worker fails and the
// coordinator resets the cluster), so a channel unbound with its last kernel broke the next
// step. Channels are released by the process that planned them once TF dropped the function
// (rdmadev.cluster.instances), when their peer task dies, or with their task. Kernels keep
// no reference to a channel between executions, so an unbound channel is freed at once.
//
// The exception is a half pair (`owned`): a TF1 task plans only its own partition, so no
// process planned both halves and none could release them. Those kernels live in the
// session's OpSegment until the session's graphs are deregistered; they hold their half in
// the registry, and the last one destroyed unbinds it (rdmadev.cluster.channels: the halves
// meet by channel key, which graphs and sessions of the same pair share).
#include <vector>

#include "tensorflow/core/framework/common_shape_fns.h"
#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/shape_inference.h"

namespace rdmadev_tf {

// Both ops are registered as distributed communication (SetIsDistributedCommunication): TF's
// executor turns an Unavailable status from any other op into Internal, and a lost
// peer must reach MonitoredTrainingSession and ParameterServerStrategy's coordinator as
// UnavailableError, the error they take for a lost task, as gRPC's _Recv's does.
REGISTER_OP("RdmadevSend")
    .Input("x: T")
    .Attr("T: type")
    .Attr("channel: string")
    .Attr("timeout_s: float")
    .Attr("max_bytes: int = 0")
    .Attr("owned: bool = false")
    .SetIsStateful()
    .SetIsDistributedCommunication()
    .SetShapeFn(tensorflow::shape_inference::NoOutputs)
    .Doc("Writes x into the next slot of rdmadev channel `channel` (one-sided). On a dynamic "
         "channel the slot's shape block carries x's shape, and a tensor larger than a slot "
         "is staged (copied into the channel's stage for the receiver to read) when the slots "
         "are below the task's RDMADEV_STAGE_BELOW_SLOT_BYTES and its registered-memory limit "
         "leaves room, else sent in slot-sized chunks; max_bytes (0: no limit) bounds what it "
         "may send. An "
         "owned kernel (a half pair) holds its half of the channel while it lives; the last "
         "one destroyed unbinds it.");

REGISTER_OP("RdmadevRecv")
    .Output("y: dtype")
    .Attr("dtype: type")
    .Attr("shape: shape")
    .Attr("channel: string")
    .Attr("timeout_s: float")
    .Attr("zero_copy: bool = false")
    .Attr("zero_copy_min_bytes: int = 0")
    .Attr("max_bytes: int = 0")
    .Attr("owned: bool = false")
    .SetIsStateful()
    .SetIsDistributedCommunication()
    .SetShapeFn([](tensorflow::shape_inference::InferenceContext* c) {
      tensorflow::PartialTensorShape shape;
      TF_RETURN_IF_ERROR(c->GetAttr("shape", &shape));
      tensorflow::shape_inference::ShapeHandle out;
      TF_RETURN_IF_ERROR(c->MakeShapeFromPartialTensorShape(shape, &out));
      c->set_output(0, out);
      return absl::OkStatus();
    })
    .Doc("Waits for the next transfer on rdmadev channel `channel` and outputs it. On a dynamic "
         "channel its shape is the one the sender wrote (compatible with `shape`), at most "
         "max_bytes (0: no limit) bytes, read from the sender's stage or gathered from as many "
         "chunks as it was sent in. With zero_copy a tensor of at least zero_copy_min_bytes "
         "that came in one slot aliases it (the slot goes back to the sender when the tensor is freed). An owned kernel (a "
         "half pair) holds its half of the channel while it lives; the last one destroyed "
         "unbinds it.");

// A bundle (graph_pass.bundles): the small static tensors of a step between two devices in one
// channel, each at its planned offset in the slot's payload. Same kernels as RdmadevSend and
// RdmadevRecv (send_op.cc, recv_op.cc), with one write and one wait for all of them.
REGISTER_OP("RdmadevSendBundle")
    .Input("xs: T")
    .Attr("T: list(type)")
    .Attr("offsets: list(int)")
    .Attr("channel: string")
    .Attr("timeout_s: float")
    .Attr("max_bytes: int = 0")
    .Attr("owned: bool = false")
    .SetIsStateful()
    .SetIsDistributedCommunication()
    .SetShapeFn(tensorflow::shape_inference::NoOutputs)
    .Doc("Copies each of xs into the next slot of rdmadev channel `channel` at its offset "
         "(bytes into the payload; the bytes between them zeroed) and writes the slot with "
         "one signal.");

REGISTER_OP("RdmadevRecvBundle")
    .Output("ys: dtypes")
    .Attr("dtypes: list(type)")
    .Attr("shapes: list(shape)")
    .Attr("offsets: list(int)")
    .Attr("channel: string")
    .Attr("timeout_s: float")
    .Attr("max_bytes: int = 0")
    .Attr("owned: bool = false")
    .Attr("zero_copy: bool = false")
    .Attr("zero_copy_min_bytes: int = 0")
    .SetIsStateful()
    .SetIsDistributedCommunication()
    .SetShapeFn([](tensorflow::shape_inference::InferenceContext* c) {
      std::vector<tensorflow::PartialTensorShape> shapes;
      TF_RETURN_IF_ERROR(c->GetAttr("shapes", &shapes));
      for (size_t i = 0; i < shapes.size(); ++i) {
        tensorflow::shape_inference::ShapeHandle out;
        TF_RETURN_IF_ERROR(c->MakeShapeFromPartialTensorShape(shapes[i], &out));
        c->set_output(static_cast<int>(i), out);
      }
      return absl::OkStatus();
    })
    .Doc("Waits for the next transfer on rdmadev channel `channel` and outputs each of its "
         "tensors (dtypes[i] of shapes[i], at offsets[i] in the payload), copied out of the slot.");

}  // namespace rdmadev_tf
