#include "fabric.h"


#include <algorithm>
#include <cstdio>
#include <cstdlib>

namespace rdmadev {

void CheckRegionLive(const RegionDesc& d, uint64_t entry) {
  if (entry != d.id) {
    throw Error(ErrorKind::kPeerLost,
                "Failed to attach region " + std::to_string(d.id) +
                    ": its owner closed it (its chunk's directory no longer names it)",
                0, "ask the peer for a fresh descriptor");
  }
}

void CheckRemoteRange(const RegionDesc& d, uint64_t off, uint64_t len, const Signal* sig) {
  if (!RangeInside(off, len, d.size)) {
    throw Error(ErrorKind::kBounds,
                "Failed to access peer region " + std::to_string(d.id) + ": range [" +
                    std::to_string(off) + ", +" + std::to_string(len) + ") lies outside its " +
                    std::to_string(d.size) + " bytes",
                0, "keep offset + length within the remote region's size");
  }
  if (sig && (sig->off % 8 != 0 || !RangeInside(sig->off, kSignalBytes, d.size))) {
    throw Error(ErrorKind::kBounds,
                "Failed to signal peer region " + std::to_string(d.id) + ": signal at " +
                    std::to_string(sig->off) + " is unaligned or outside its " +
                    std::to_string(d.size) + " bytes",
                0, "place the 16-byte signal 8-byte aligned inside the region");
  }
}

bool Endpoint::Alive(std::string* why) {
  if (!PeerAlive(why)) return false;
  if (silent_.load(std::memory_order_acquire)) {  // said, never failed: TF waits for it too
    std::lock_guard<std::mutex> lock(silent_mu_);
    *why = silent_why_;
  }
  return true;
}

void Endpoint::SetSilent(const std::string& why) {
  std::lock_guard<std::mutex> lock(silent_mu_);
  silent_why_ = why;
  silent_.store(!why.empty(), std::memory_order_release);
}

std::string Endpoint::Silent() const {
  std::lock_guard<std::mutex> lock(silent_mu_);
  return silent_why_;
}

WaitPolicy PolicyFor(const WaitPolicy& base, const Endpoint* ep) {
  WaitPolicy p = base;
  if (ep && ep->delivered_by_local_thread()) p.spin_ns = 0;
  return p;
}

}  // namespace rdmadev

namespace rdmadev {
namespace {

struct Registry {
  std::vector<FabricFactory> factories;  // best first
  std::vector<std::string> names;        // the same order
};

// Filled by static initializers of the fabric libraries' factory files, read afterwards:
// a function-local static so that it exists before the first registration whatever the
// order in which the translation units are initialized.
Registry& TheRegistry() {
  static Registry r;
  return r;
}

std::string Choices() {
  std::string out;
  for (const auto& n : TheRegistry().names) out += (out.empty() ? "" : ", ") + n;
  return out;
}

}  // namespace

void RegisterFabric(FabricFactory factory) {
  Registry& r = TheRegistry();
  for (const auto& f : r.factories) {
    if (f.name == factory.name) {
      std::fprintf(stderr, "rdmadev: fabric '%s' is registered twice; the build links two "
                   "copies of its factory\n", factory.name.c_str());
      std::abort();
    }
  }
  auto at = std::find_if(r.factories.begin(), r.factories.end(),
                         [&](const FabricFactory& f) { return f.priority < factory.priority; });
  r.names.insert(r.names.begin() + (at - r.factories.begin()), factory.name);
  r.factories.insert(at, std::move(factory));
}

const std::vector<FabricFactory>& RegisteredFabrics() { return TheRegistry().factories; }

const std::vector<std::string>& FabricPriority() { return TheRegistry().names; }

const FabricFactory& FindFabric(const std::string& name) {
  for (const auto& f : TheRegistry().factories) {
    if (f.name == name) return f;
  }
  throw Error(ErrorKind::kConfig, "unknown fabric '" + name + "' (choose one of " + Choices() + ")",
              0, "set RDMADEV_FABRIC to auto or one of " + Choices());
}

std::string FabricUnviableReason(const std::string& name, const FabricOptions& options) {
  return FindFabric(name).viable(options);
}

void CheckFabricOptions(const FabricOptions& options) {
  for (const auto& kv : options) {
    size_t dot = kv.first.find('.');
    std::string fabric = kv.first.substr(0, dot);
    const auto& names = TheRegistry().names;
    if (dot == std::string::npos || std::find(names.begin(), names.end(), fabric) == names.end()) {
      throw Error(ErrorKind::kConfig,
                  "Failed to configure fabrics: option '" + kv.first +
                      "' names no fabric (keys are <fabric>.<key>, fabrics: " + Choices() + ")",
                  0, "remove the option or prefix it with a fabric name, e.g. verbs.device");
    }
  }
  for (const auto& f : TheRegistry().factories) f.check(options);
}

std::map<std::string, std::string> OptionsOf(const std::string& fabric,
                                             const FabricOptions& options,
                                             const std::vector<std::string>& known) {
  std::map<std::string, std::string> out;
  const std::string prefix = fabric + ".";
  for (const auto& kv : options) {
    if (kv.first.compare(0, prefix.size(), prefix) != 0) continue;
    std::string key = kv.first.substr(prefix.size());
    if (std::find(known.begin(), known.end(), key) == known.end()) {
      std::string keys;
      for (const auto& k : known) keys += (keys.empty() ? "" : ", ") + prefix + k;
      throw Error(ErrorKind::kConfig,
                  "Failed to configure the " + fabric + " fabric: unknown option '" + kv.first + "'",
                  0, keys.empty() ? "the " + fabric + " fabric takes no options; remove it"
                                  : "use one of " + keys);
    }
    out[key] = kv.second;
  }
  return out;
}

int OptionInt(const std::string& fabric, const std::string& key, const std::string& text,
              int low, int high) {
  char* end = nullptr;
  errno = 0;
  long v = std::strtol(text.c_str(), &end, 10);
  if (text.empty() || *end != '\0' || errno != 0 || v < low || v > high) {
    throw Error(ErrorKind::kConfig,
                "Failed to configure the " + fabric + " fabric: option " + fabric + "." + key +
                    "='" + text + "' is not an integer in [" + std::to_string(low) + ", " +
                    std::to_string(high) + "]",
                0, "set " + fabric + "." + key + " to an integer in [" + std::to_string(low) +
                       ", " + std::to_string(high) + "], or leave it unset to choose automatically");
  }
  return static_cast<int>(v);
}

}  // namespace rdmadev
