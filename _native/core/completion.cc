#include "completion.h"

#include <immintrin.h>
#include <sched.h>
#include <time.h>

#include <vector>

namespace rdmadev {
namespace {

uint64_t NowNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now().time_since_epoch())
      .count();
}

void SleepNs(uint64_t ns) {
  timespec ts{static_cast<time_t>(ns / 1000000000), static_cast<long>(ns % 1000000000)};
  nanosleep(&ts, nullptr);
}

// Spin iterations between clock reads: a clock read costs ~20 ns, a pause ~40 ns here.
constexpr int kSpinBatch = 64;

// What a timed-out wait adds about its peer: the heartbeats' silent mark, when the peer is
// alive but has not answered them (Endpoint::Alive), which is why it never wrote.
std::string SilentNote(const Liveness& alive) {
  std::string why;
  if (!alive || !alive(&why) || why.empty()) return "";
  return ": " + why;
}

}  // namespace

uint64_t WaitWord(const std::atomic<uint64_t>* word, uint64_t target, const Deadline& deadline,
                  const WaitPolicy& policy, const Liveness& alive, const std::string& what) {
  uint64_t v = word->load(std::memory_order_acquire);
  if (v >= target) return v;
  const uint64_t start = NowNs();
  uint64_t next_liveness = start + policy.liveness_every_ns;
  uint64_t sleep_ns = 1000;
  for (;;) {
    for (int i = 0; i < kSpinBatch; ++i) {
      v = word->load(std::memory_order_acquire);
      if (v >= target) return v;
      _mm_pause();
    }
    uint64_t now = NowNs();
    uint64_t waited = now - start;
    if (waited >= policy.spin_ns) {
      if (waited < policy.spin_ns + policy.yield_ns) {
        sched_yield();
      } else {
        SleepNs(sleep_ns);
        sleep_ns = std::min<uint64_t>(sleep_ns * 2, policy.max_sleep_ns);
      }
      if (deadline.passed()) {
        v = word->load(std::memory_order_acquire);
        if (v >= target) return v;
        throw Error(ErrorKind::kTimeout,
                    "Timed out waiting for " + what + " (sequence " + std::to_string(target) +
                        ", last seen " + std::to_string(v) + ")" + SilentNote(alive),
                    ETIMEDOUT,
                    "the peer never wrote it: check that the sending task is running the same "
                    "step, or raise RDMADEV_DEADLINE_S");
      }
      if (alive && now >= next_liveness) {
        next_liveness = now + policy.liveness_every_ns;
        std::string why;
        if (!alive(&why)) {
          v = word->load(std::memory_order_acquire);
          if (v >= target) return v;
          // A cause that carries its own fix (the heartbeats' "this task could not ping it:
          // ... Fix: raise the open-file limit") says more than the peer's usual fate.
          std::string hint = "the peer task died, stopped or was cut off (see its log); "
                             "restart or resume it, then run the step again";
          const size_t own_fix = why.find(". Fix: ");
          if (own_fix != std::string::npos) {
            hint = why.substr(own_fix + 7);
            why.resize(own_fix);
          }
          throw Error(ErrorKind::kPeerLost, "Peer lost while waiting for " + what + ": " + why,
                      ECONNRESET, hint);
        }
      }
    }
  }
}

Progress::Progress(WaitPolicy policy) : policy_(policy) {
  thread_ = std::thread([this] { Loop(); });
}

Progress::~Progress() { Close(); }

void Progress::Close() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stopping_) return;
    stopping_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

uint64_t Progress::Submit(const std::atomic<uint64_t>* word, uint64_t target, Deadline deadline,
                          Liveness alive, Callback done, std::shared_ptr<void> keepalive,
                          std::string what) {
  uint64_t ticket;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stopping_) throw Error(ErrorKind::kClosed, "Failed to submit wait: progress engine closed");
    ticket = next_ticket_++;
    waits_.emplace(ticket, Wait{word, target, deadline, std::move(alive), std::move(done),
                                std::move(keepalive), std::move(what),
                                Clock::now() + std::chrono::nanoseconds(policy_.liveness_every_ns)});
  }
  cv_.notify_one();
  return ticket;
}

bool Progress::Cancel(uint64_t ticket) {
  Wait w;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = waits_.find(ticket);
    if (it == waits_.end()) return false;
    w = std::move(it->second);
    waits_.erase(it);
  }
  w.done(Status::Fail(ErrorKind::kClosed, "Wait for " + w.what + " was cancelled"), 0);
  return true;
}

size_t Progress::pending() const {
  std::lock_guard<std::mutex> lock(mu_);
  return waits_.size();
}

void Progress::Loop() {
  uint64_t idle_since = NowNs();
  uint64_t sleep_ns = 1000;
  std::vector<std::pair<Wait, Status>> finished;
  std::vector<uint64_t> values;
  for (;;) {
    finished.clear();
    values.clear();
    {
      std::unique_lock<std::mutex> lock(mu_);
      if (waits_.empty() && !stopping_) {
        cv_.wait(lock, [this] { return stopping_ || !waits_.empty(); });
        idle_since = NowNs();
        sleep_ns = 1000;
      }
      if (stopping_) {
        for (auto& kv : waits_) {
          finished.emplace_back(std::move(kv.second),
                                Status::Fail(ErrorKind::kClosed, "rdmadev is shutting down"));
          values.push_back(0);
        }
        waits_.clear();
      } else {
        auto now = Clock::now();
        for (auto it = waits_.begin(); it != waits_.end();) {
          Wait& w = it->second;
          uint64_t v = w.word->load(std::memory_order_acquire);
          Status st;
          bool done = v >= w.target;
          if (!done && w.deadline.passed()) {
            done = true;
            st = Status::Fail(ErrorKind::kTimeout,
                              "Timed out waiting for " + w.what + " (sequence " +
                                  std::to_string(w.target) + ", last seen " +
                                  std::to_string(v) + ")" + SilentNote(w.alive));
          } else if (!done && w.alive && now >= w.next_liveness) {
            w.next_liveness = now + std::chrono::nanoseconds(policy_.liveness_every_ns);
            std::string why;
            if (!w.alive(&why)) {
              done = true;
              st = Status::Fail(ErrorKind::kPeerLost,
                                "Peer lost while waiting for " + w.what + ": " + why);
            }
          }
          if (done) {
            finished.emplace_back(std::move(w), st);
            values.push_back(v);
            it = waits_.erase(it);
          } else {
            ++it;
          }
        }
      }
    }
    for (size_t i = 0; i < finished.size(); ++i) {
      finished[i].first.done(finished[i].second, values[i]);
    }
    if (!finished.empty()) {
      idle_since = NowNs();
      sleep_ns = 1000;
      finished.clear();  // drop keepalives outside the lock
      std::lock_guard<std::mutex> lock(mu_);
      if (stopping_ && waits_.empty()) return;
      continue;
    }
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (stopping_ && waits_.empty()) return;
    }
    uint64_t waited = NowNs() - idle_since;
    if (waited < policy_.spin_ns) {
      for (int i = 0; i < kSpinBatch; ++i) _mm_pause();
    } else if (waited < policy_.spin_ns + policy_.yield_ns) {
      sched_yield();
    } else {
      SleepNs(sleep_ns);
      sleep_ns = std::min<uint64_t>(sleep_ns * 2, policy_.max_sleep_ns);
    }
  }
}

}  // namespace rdmadev
