// Shared vocabulary of the remote-device core: errors, deadlines, layout constants.
#pragma once

#include <cerrno>
#include <chrono>
#include <cstdint>
#include <stdexcept>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

namespace rdmadev {

// What went wrong, coarse enough for Python to pick an exception class. Each kind is listed
// once, here: (enumerator, value, name). Python reads the table through
// rdmadev._core.error_kinds() and maps the names to classes (rdmadev/errors.py).
#define RDMADEV_ERROR_KINDS(X)                                             \
  X(kConfig, 1, "config")       /* bad option or environment */            \
  X(kFabric, 2, "fabric")       /* a fabric could not be opened or used */ \
  X(kRegion, 3, "region")       /* allocating or mapping a region failed */ \
  X(kBounds, 4, "bounds")       /* offset/length outside a region */       \
  X(kTimeout, 5, "timeout")     /* a deadline passed */                    \
  X(kPeerLost, 6, "peer_lost")  /* the peer died or closed its connection */ \
  X(kAuth, 7, "auth")           /* the peer failed authentication */       \
  X(kProtocol, 8, "protocol")   /* malformed descriptor or frame */        \
  X(kClosed, 9, "closed")       /* the object was closed */

enum class ErrorKind : int {
#define RDMADEV_KIND_ENUMERATOR(id, value, name) id = value,
  RDMADEV_ERROR_KINDS(RDMADEV_KIND_ENUMERATOR)
#undef RDMADEV_KIND_ENUMERATOR
};

// Every kind as (name, value), in declaration order.
std::vector<std::pair<std::string, int>> ErrorKindTable();

// The fix-it hint for an errno that says what to fix whatever failed (out of file descriptors:
// EMFILE, ENFILE), else "". Error uses it in place of the hint it was given.
std::string ErrnoHint(int err);

// Every failure in the core is an Error: a kind, the errno (0 if none) and a fix-it hint.
class Error : public std::runtime_error {
 public:
  Error(ErrorKind kind, const std::string& what, int err = 0, std::string hint = "")
      : std::runtime_error(what), kind_(kind), errno_(err), hint_(std::move(hint)) {
    std::string own = ErrnoHint(err);
    if (!own.empty()) hint_ = std::move(own);
  }
  ErrorKind kind() const { return kind_; }
  int err() const { return errno_; }
  const std::string& hint() const { return hint_; }

 private:
  ErrorKind kind_;
  int errno_;
  std::string hint_;
};

// "Failed to <verb> <object>: strerror(errno)" with the errno attached.
[[noreturn]] void ThrowErrno(ErrorKind kind, const std::string& what, int err,
                             const std::string& hint = "");

// Cache line: sequence words and slot headers are aligned to it so that a writer's
// payload and a reader's polled word never share a line.
constexpr uint64_t kCacheLine = 64;
constexpr uint64_t kPageSize = 4096;

inline uint64_t RoundUp(uint64_t n, uint64_t to) { return (n + to - 1) / to * to; }

using Clock = std::chrono::steady_clock;

// A point in time after which an operation fails with kTimeout. Zero means "no deadline".
struct Deadline {
  Clock::time_point at;
  bool infinite = true;
  static Deadline After(double seconds);
  static Deadline Never() { return Deadline{}; }
  bool passed() const { return !infinite && Clock::now() >= at; }
  // Milliseconds left, clamped to [0, cap_ms]; cap_ms when infinite.
  int remaining_ms(int cap_ms) const;
};

// How an error names the peer task it came from, in the words of TF's gRPC: " (GRPC error
// information from remote target /job:ps/replica:0/task:0)". TF's ClusterCoordinator reads
// them to tell a lost parameter server (PSUnavailableError, raised to the user, who restores
// the variables) from a lost worker (its closure runs again once the worker is back):
// tensorflow/python/distribute/coordinator/cluster_coordinator.py, _RPC_ERROR_FROM_PS. ""
// when `task` is.
inline std::string FromRemoteTarget(const std::string& task) {
  return task.empty() ? std::string() : " (GRPC error information from remote target " + task + ")";
}

// Logs one line to stderr ("rdmadev[pid]: ...") and keeps it in a bounded in-memory ring
// that tests and `rdmadev doctor` can read back. Lines carry text peers chose (the name a
// peer claims, its error text), so every byte outside printable ASCII is written as \xNN
// (the backslash too, as \x5c): a peer can neither start a forged line nor put raw bytes on
// stderr.
void LogEvent(const std::string& line);
std::string RecentEvents();  // newline-separated, oldest first

// LogEvent for lines a peer can cause at will (failed handshakes, rejected frames, refused
// connections), budgeted per service and kind: at most kLinesPerWindow per kWindowSeconds.
// Past that one line says the rest are left out, and the next window's first line says how
// many were: a flood of hostile connections cannot flood the log.
class LogBudget {
 public:
  static constexpr int kLinesPerWindow = 10;
  static constexpr int kWindowSeconds = 10;
  explicit LogBudget(std::string what) : what_(std::move(what)) {}  // "tcp: failed handshakes"
  void Log(const std::string& line);

 private:
  std::string what_;
  std::mutex mu_;
  std::chrono::steady_clock::time_point start_;
  int logged_ = 0;
  uint64_t left_out_ = 0;
};

}  // namespace rdmadev
