// Swapped transfers on TensorFlow's profiler timeline (tf.profiler, TraceMe).
//
// Each RdmadevSend / RdmadevRecv execution becomes one event spanning the kernel, from
// ComputeAsync to done(), named "rdmadev.send" / "rdmadev.recv" with the channel, the peer
// task, the bytes and the chunks as stats, and its phases as events inside it:
//   rdmadev.wait_credit  the sender waits for the receiver to give a slot back
//   rdmadev.write        the one-sided write (a memcpy into the peer's mapping on shm, a
//                        socket send on tcp, a posted RDMA WRITE on verbs)
//   rdmadev.wait_data    the receiver waits for the sequence word (includes the progress
//                        thread's wake-up: the wait ends when that thread sees the word)
//   rdmadev.copy         the receiver copies the slot into TF's tensor (absent: zero-copy)
// The events of one execution are recorded together when it ends, on the thread that ends
// it, so they nest on one line of the trace viewer whichever threads ran the phases.
//
// Cost: with no profiler session recording in this process, Begin() is one acquire load of
// TF's trace level and every other call one branch on a zero. Recording costs a few string
// formats per execution (rdmadev/profile.py reads these events back).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "tsl/profiler/lib/traceme.h"
#include "tsl/profiler/lib/traceme_encode.h"

namespace rdmadev_tf {

class TransferTrace {
 public:
  // The TraceMe level of rdmadev's events: 2 (kInfo) is recorded by the profiler's
  // default options (host_tracer_level 2), like TF's own per-op events.
  static constexpr int kLevel = 2;

  // Starts the kernel's span when a profiler session is recording; else the trace stays off.
  void Begin() {
    if (tsl::profiler::TraceMe::Active(kLevel)) start_ = tsl::profiler::GetCurrentTimeNanos();
  }
  bool on() const { return start_ != 0; }

  // The start of a phase (0 when off), to hand back to Phase() when it ends.
  int64_t Mark() const { return on() ? tsl::profiler::GetCurrentTimeNanos() : 0; }
  // Ends a phase that began at `since` (a Mark()).
  void Phase(const char* name, int64_t since) {
    if (since) phases_.push_back({name, since, tsl::profiler::GetCurrentTimeNanos()});
  }

  // Records the kernel's span (`kind`: "rdmadev.send" or "rdmadev.recv") and its phases.
  void End(const char* kind, const std::string& channel, const std::string& peer,
           uint64_t bytes, uint64_t chunks) {
    if (!on()) return;
    if (!tsl::profiler::TraceMe::Active(kLevel)) {  // the session stopped meanwhile
      start_ = 0;
      phases_.clear();
      return;
    }
    const int64_t end = tsl::profiler::GetCurrentTimeNanos();
    using tsl::profiler::TraceMeEncode;
    using Recorder = tsl::profiler::TraceMeRecorder;
    Recorder::Record({TraceMeEncode(kind, {{"channel", channel},
                                           {"peer", peer},
                                           {"bytes", bytes},
                                           {"chunks", chunks}}),
                      start_, end});
    for (const auto& p : phases_) {
      Recorder::Record({TraceMeEncode(p.name, {{"channel", channel}}), p.start, p.end});
    }
    start_ = 0;
    phases_.clear();
  }

 private:
  struct PhaseSpan {
    const char* name;
    int64_t start, end;
  };
  int64_t start_ = 0;
  std::vector<PhaseSpan> phases_;
};

}  // namespace rdmadev_tf
