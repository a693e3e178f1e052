// The contract between the pass (pass.cc ApplyLabelled) and the kernels (send_op.cc,
// recv_op.cc) for a pair whose tensor may be dead (a half in a branch of a conditional): the
// pass keeps TF's own _Send/_Recv node and labels it `_kernel: kTransferLabel`, which makes TF
// pick rdmadev's kernel for it, and writes the settings the RdmadevSend/RdmadevRecv ops take
// as attrs under kSettingPrefix (a node's attrs outside its op's definition must start with "_").
//
// A half pair's RdmadevSend/RdmadevRecv (TF1: each task plans its own half) keeps the rendezvous
// attrs of the _Send/_Recv it replaces (kRendezvousAttrs) under kRendezvousPrefix: with them its
// kernel carries the tensor on TF's own path when the two tasks could not set the pair up
// (kernels/tf_path.h). A labelled node has TF's own.
#pragma once

namespace rdmadev_tf {

constexpr char kTransferLabel[] = "rdmadev";
constexpr char kSettingPrefix[] = "_rdmadev_";
constexpr char kRendezvousPrefix[] = "_rdmadev_tf_";
constexpr const char* kRendezvousAttrs[] = {"send_device", "send_device_incarnation", "recv_device",
                                            "tensor_name"};

}  // namespace rdmadev_tf
