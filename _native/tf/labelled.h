// The contract between the pass (pass.cc ApplyLabelled) and the kernels (send_op.cc,
// recv_op.cc) for a pair whose tensor may be dead (a half in a branch of a conditional): the
// pass keeps TF's own _Send/_Recv node and labels it `_kernel: kTransferLabel`, which makes TF
// pick rdmadev's kernel for it, and writes the settings the RdmadevSend/RdmadevRecv ops take
// as attrs under kSettingPrefix (a node's attrs outside its op's definition must start with "_").
#pragma once

namespace rdmadev_tf {

constexpr char kTransferLabel[] = "rdmadev";
constexpr char kSettingPrefix[] = "_rdmadev_";

}  // namespace rdmadev_tf
