#include "common.h"

#include <unistd.h>

#include <cstdio>
#include <cstring>
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

std::string RecentEvents() {
  std::lock_guard<std::mutex> lock(g_events_mu);
  std::string out;
  for (const auto& e : g_events) out += e + "\n";
  return out;
}

}  // namespace rdmadev
