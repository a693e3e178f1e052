#include "common.h"

#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <chrono>
#include <deque>
#include <mutex>

namespace rdmadev {

std::vector<std::pair<std::string, int>> ErrorKindTable() {
  return {
#define RDMADEV_KIND_ROW(id, value, name) {name, value},
      RDMADEV_ERROR_KINDS(RDMADEV_KIND_ROW)
#undef RDMADEV_KIND_ROW
  };
}

std::string ErrnoHint(int err) {
  if (err == EMFILE) {
    // A task holds about ten descriptors per peer task it exchanges tensors with
    // (docs/faults/errors.md, "Open files"), so a ps of a few hundred workers needs more
    // than the usual soft limit of 1024.
    return "raise this process's open-file limit (RLIMIT_NOFILE, `ulimit -n`), the hard one: "
           "nofile in /etc/security/limits.conf, LimitNOFILE= for systemd, --ulimit nofile= "
           "for docker; a task started by `rdmadev serve` or the grpc+rdmadev protocol raises "
           "its soft limit to the hard one, and `rdmadev doctor` shows both";
  }
  if (err == ENFILE) {
    return "the system's table of open files is full: raise fs.file-max (sysctl) or close "
           "files elsewhere on this host";
  }
  return "";
}

void ThrowErrno(ErrorKind kind, const std::string& what, int err, const std::string& hint) {
  throw Error(kind, what + ": " + std::strerror(err) + " (errno " + std::to_string(err) + ")",
              err, hint);
}

Deadline Deadline::After(double seconds) {
  Deadline d;
  if (seconds < 0) return d;
  d.infinite = false;
  d.at = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                            std::chrono::duration<double>(seconds));
  return d;
}

int Deadline::remaining_ms(int cap_ms) const {
  if (infinite) return cap_ms;
  auto left = std::chrono::duration_cast<std::chrono::milliseconds>(at - Clock::now()).count();
  if (left < 0) return 0;
  return left > cap_ms ? cap_ms : static_cast<int>(left);
}

namespace {
// Enough history to explain what happened in a test or a doctor run, small enough to ignore.
constexpr size_t kEventRing = 256;
std::mutex g_events_mu;
std::deque<std::string> g_events;

// `text` with every byte outside printable ASCII, and the backslash, written as \xNN.
std::string Printable(const std::string& text) {
  static const char kHex[] = "0123456789abcdef";
  std::string out;
  out.reserve(text.size());
  for (unsigned char c : text) {
    if (c >= 0x20 && c < 0x7f && c != '\\') {
      out += static_cast<char>(c);
    } else {
      out += "\\x";
      out += kHex[c >> 4];
      out += kHex[c & 15];
    }
  }
  return out;
}
}  // namespace

void LogEvent(const std::string& line) {
  std::string safe = Printable(line);
  std::fprintf(stderr, "rdmadev[%d]: %s\n", static_cast<int>(getpid()), safe.c_str());
  std::lock_guard<std::mutex> lock(g_events_mu);
  if (g_events.size() == kEventRing) g_events.pop_front();
  g_events.push_back(std::move(safe));
}

void LogBudget::Log(const std::string& line) {
  uint64_t was_left_out = 0;
  bool log = true, last = false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto now = std::chrono::steady_clock::now();
    if (now - start_ >= std::chrono::seconds(kWindowSeconds)) {
      was_left_out = left_out_;
      start_ = now;
      logged_ = 0;
      left_out_ = 0;
    }
    if (logged_ < kLinesPerWindow) {
      last = ++logged_ == kLinesPerWindow;
    } else {
      log = false;
      ++left_out_;
    }
  }
  if (was_left_out) LogEvent(what_ + ": " + std::to_string(was_left_out) + " more were left out");
  if (!log) return;
  LogEvent(line);
  if (last) {
    LogEvent(what_ + ": " + std::to_string(kLinesPerWindow) + " in " +
             std::to_string(kWindowSeconds) + " s; leaving out the rest for now");
  }
}

std::string RecentEvents() {
  std::lock_guard<std::mutex> lock(g_events_mu);
  std::string out;
  for (const auto& e : g_events) out += e + "\n";
  return out;
}

}  // namespace rdmadev
