// Completion by sequence words: blocking waits and a progress engine for many waits.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "common.h"

namespace rdmadev {

// How a waiter trades CPU for latency. Measured on these 2-vCPU machines: a spin-polled
// shm word is seen 0.2 us after the release store, while anything that sleeps and is
// woken across vCPUs pays ~30 us (up to 300 us under load). So: spin, then yield the
// core to whoever needs it (a fabric's receiver thread on the same core), then sleep.
struct WaitPolicy {
  uint64_t spin_ns = 20000;    // pure spin (RDMADEV_SPIN_US, default 20 us)
  uint64_t yield_ns = 200000;  // sched_yield phase after the spin (RDMADEV_YIELD_US)
  // Longest single sleep once both phases are over: bounds how late a long wait is seen
  // (100 us costs one wakeup per 100 us, ~1% of a core).
  uint64_t max_sleep_ns = 100000;
  // How often a waiter asks the fabric whether the peer is still alive.
  uint64_t liveness_every_ns = 2000000;
};

// Answers whether the peer a wait depends on is alive; sets *why when it is not.
using Liveness = std::function<bool(std::string* why)>;

// Blocks the calling thread until *word >= target (acquire load) and returns the value.
// Throws kTimeout at the deadline and kPeerLost as soon as `alive` says the peer is gone.
uint64_t WaitWord(const std::atomic<uint64_t>* word, uint64_t target, const Deadline& deadline,
                  const WaitPolicy& policy, const Liveness& alive, const std::string& what);

// Outcome handed to a progress callback.
struct Status {
  ErrorKind kind = ErrorKind::kConfig;
  bool ok = true;
  std::string message;
  static Status Ok() { return Status{}; }
  static Status Fail(ErrorKind k, std::string m) { return Status{k, false, std::move(m)}; }
};

// One thread that completes many waits: each Submit()ted wait ends exactly once, with its
// callback run on the progress thread (success, deadline, dead peer, cancellation or
// shutdown). This is what an asynchronous TF kernel hangs its done() on: never a thread
// per wait.
class Progress {
 public:
  using Callback = std::function<void(const Status&, uint64_t value)>;
  explicit Progress(WaitPolicy policy);
  ~Progress();  // fails outstanding waits with kClosed, then joins the thread

  // Keep `keepalive` (the region owning `word`) alive until the callback has run.
  uint64_t Submit(const std::atomic<uint64_t>* word, uint64_t target, Deadline deadline,
                  Liveness alive, Callback done, std::shared_ptr<void> keepalive,
                  std::string what);
  // Ends the wait with kClosed ("cancelled") if it has not completed yet; true if it did.
  bool Cancel(uint64_t ticket);
  size_t pending() const;
  void Close();

 private:
  struct Wait {
    const std::atomic<uint64_t>* word;
    uint64_t target;
    Deadline deadline;
    Liveness alive;
    Callback done;
    std::shared_ptr<void> keepalive;
    std::string what;
    Clock::time_point next_liveness;
  };
  void Loop();

  WaitPolicy policy_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::map<uint64_t, Wait> waits_;
  uint64_t next_ticket_ = 1;
  bool stopping_ = false;
  std::thread thread_;
};

}  // namespace rdmadev
