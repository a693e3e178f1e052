// What rdmadev's two kernels (send_op.cc, recv_op.cc) share: the liveness and status of a
// wait on a channel half, the step a kernel runs in, the steps known failed in this task, and
// how a kernel reads its settings from the node it was built for (an RdmadevSend/RdmadevRecv
// or one of TF's own _Send/_Recv labelled by the pass, labelled.h).
#pragma once

#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_set>

#include "tensorflow/core/framework/cancellation.h"
#include "tensorflow/core/framework/op_kernel.h"

#include "labelled.h"
#include "registry.h"
#include "tf_status.h"

namespace rdmadev_tf {

// Whether a wait on `ring` (a channel half whose peer is task `peer`) may go on: the half is
// still bound here and the peer still there; the reason names what went (WaitStatus).
template <typename Ring>
rdmadev::Liveness AliveOf(const std::shared_ptr<Ring>& ring, const std::string& peer) {
  return [ring, peer](std::string* why) {
    if (ring->unbound()) {
      *why = "the channel was unbound";
      return false;
    }
    if (ring->endpoint()->Alive(why)) return true;
    if (!peer.empty()) *why = "task " + peer + ": " + *why;
    return false;
  };
}

// The status of a failed wait on `ring`, a half of `channel`. One that ended because the
// control plane unbound the half says why that happens, instead of "peer lost".
template <typename Ring>
absl::Status WaitStatus(const rdmadev::Status& st, const Ring& ring, const std::string& channel) {
  if (st.kind != rdmadev::ErrorKind::kPeerLost || !ring.unbound()) return ToStatus(st);
  return tensorflow::errors::Unavailable(
      "rdmadev channel ", channel, " was unbound in this task while this step waited on it: ",
      "its function was released, its peer task failed or restarted, or the connection to it "
      "broke (a running peer's channels are then set up again), so the transfer will not "
      "come. This step was cut short by a failure elsewhere; run it again once the cluster "
      "is whole");
}

// The step tag of this execution (channel.h): from TF's step id, which the tasks of one
// multi-task step share.
inline uint32_t StepTagOf(tensorflow::OpKernelContext* ctx) {
  return rdmadev::StepTag(static_cast<uint64_t>(ctx->step_id()));
}

// Whether TF cancelled the kernel's step: a wait for a half pair to be bound (TF1 sessions)
// ends then, instead of at its deadline (ChannelRegistry::FindSender/FindReceiver).
inline rdmadev::ChannelRegistry::Cancelled StepCancelled(tensorflow::OpKernelContext* ctx) {
  tensorflow::CancellationManager* cm = ctx->cancellation_manager();
  if (cm == nullptr) return nullptr;
  return [cm] { return cm->IsCancelled(); };
}

// The tags of steps an rdmadev kernel failed in, in this task (timed out, cancelled,
// superseded, its half gone): a transfer tagged so that arrives later is a failed step's,
// and a receive discards it at once. The last kRemembered, the failures of many steps; a
// later step whose 24-bit tag equals a remembered one only goes without the wait that
// LeaveForItsStep gives a transfer it cannot place. One per process, shared by both kernels'
// files: Global() is inline in a named namespace (never move this into an anonymous one).
class FailedSteps {
 public:
  static constexpr size_t kRemembered = 4096;
  static FailedSteps& Global() {
    static FailedSteps* steps = new FailedSteps;  // never destroyed: kernels outlive statics
    return *steps;
  }
  void Add(uint32_t tag) {
    if (!tag) return;
    std::lock_guard<std::mutex> lock(mu_);
    if (!known_.insert(tag).second) return;
    order_.push_back(tag);
    if (order_.size() > kRemembered) {
      known_.erase(order_.front());
      order_.pop_front();
    }
  }
  bool Has(uint32_t tag) const {
    std::lock_guard<std::mutex> lock(mu_);
    return known_.count(tag) > 0;
  }

 private:
  mutable std::mutex mu_;
  std::unordered_set<uint32_t> known_;
  std::deque<uint32_t> order_;
};

// The sooner of two deadlines.
inline rdmadev::Deadline Sooner(const rdmadev::Deadline& a, const rdmadev::Deadline& b) {
  if (a.infinite) return b;
  if (b.infinite) return a;
  return a.at <= b.at ? a : b;
}

// The setting that bounds one dynamic tensor (rdmadev/config.py), for messages.
constexpr char kMaxTensorSetting[] = "RDMADEV_MAX_TENSOR_BYTES";

// The pass swaps a pair whose tensor may be dead (a half in a branch of a conditional) by
// labelling TF's own _Send/_Recv nodes for these kernels instead of replacing them with
// RdmadevSend/RdmadevRecv (labelled.h): TF's executor runs a transfer node even when its input
// is dead, and lets a receiving one output a dead tensor, which it allows no other op.
// Whether `c` builds a kernel for one of TF's own transfer nodes.
inline bool IsTransferNode(tensorflow::OpKernelConstruction* c) { return c->def().op()[0] == '_'; }

// The attr that holds setting `name` on the node `c` builds a kernel for.
inline std::string Setting(tensorflow::OpKernelConstruction* c, const std::string& name) {
  return IsTransferNode(c) ? kSettingPrefix + name : name;
}

}  // namespace rdmadev_tf
