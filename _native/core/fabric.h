// The interface every fabric implements: a peer task seen as a device with a memory
// interface, and the registry through which fabrics are found (the way TensorPipe
// registers its transports: each names itself, gives a priority, says whether it is viable
// here and why not, and creates itself; nothing outside the fabric's folder names it).
//
// Every fabric lives in its own folder <name>/ with the same file set:
//   <name>.h          what the fabric is (the protocol, in prose) and its <Name>Backend: its
//                     name, priority, options type, UnviableReason() and Make()
//   <name>.cc         its Endpoint and Fabric classes, and the backend's functions
//   <name>_options.h  its typed options: the "<name>.<key>" keys it reads and how each is set
//   <name>_factory.cc its registry entry, one line: FabricFactoryOf<<Name>Backend>()
// plus what a fabric needs beyond them, each with a job of its own: tcp/frame.* (the frame
// format and its parser, fuzzable without sockets), verbs/ibv_lib.* (libibverbs loaded at run
// time) and one file pair per verbs object (verbs_{device,memory,qp,send_queue,endpoint}.*).
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "common.h"
#include "completion.h"
#include "region.h"

namespace rdmadev {

class Domain;

// Completion signal that travels with a write: after the payload is in place, the remote
// region gets `aux` at sig_off+8 and then, with release ordering, `seq` at sig_off. A
// reader that acquires `seq` sees the payload and `aux`. (verbs carries it as two more RDMA
// WRITEs on the same RC QP, aux then seq, ordered after the payload.)
struct Signal {
  uint64_t off = 0;
  uint64_t seq = 0;
  uint64_t aux = 0;
};
constexpr uint64_t kSignalBytes = 16;

// A region of the peer's, attached through an endpoint.
struct RemoteRegion {
  RemoteRegion() = default;
  explicit RemoteRegion(const RegionDesc& d) : desc(d) {}
  RegionDesc desc;
  uint8_t* mapped = nullptr;  // shm: byte 0 of the peer's region mapped here; others: null
  std::shared_ptr<void> mapping;  // shm: the mapping of the peer's chunk it lies in (shared)
};

// Throws kPeerLost unless `entry`, the directory word of `d`'s chunk that the attaching peer
// read (region.h), still names the region: the owner closed it.
void CheckRegionLive(const RegionDesc& d, uint64_t entry);

// Throws kBounds for a remote range outside the peer's region (checked by the sender;
// the receiving side checks again wherever it is a trust boundary).
void CheckRemoteRange(const RegionDesc& d, uint64_t off, uint64_t len, const Signal* sig);

class Endpoint {
 public:
  virtual ~Endpoint() = default;
  virtual std::string fabric() const = 0;
  virtual std::string peer() const = 0;  // the peer's address, for messages
  // Makes the peer's region (from its descriptor) addressable from here; throws kPeerLost
  // when the peer closed it (CheckRegionLive; tcp: its next frame is refused).
  virtual std::shared_ptr<RemoteRegion> Attach(const RegionDesc& desc) = 0;
  // One-sided write of len bytes from src into the peer's region at roff, then the signal.
  // Returns once src may be reused; the bytes may still be on their way (verbs posts a copy
  // and goes on), but an endpoint's writes land in the order they were made. A failure seen
  // after a write returned fails the endpoint's next call and its Alive.
  virtual void Write(const void* src, const RemoteRegion& dst, uint64_t roff, uint64_t len,
                     const Signal* sig, const Deadline& deadline) = 0;
  // One-sided read of len bytes at roff of the peer's region into dst.
  virtual void Read(const RemoteRegion& src, uint64_t roff, void* dst, uint64_t len,
                    const Deadline& deadline) = 0;
  // True when the bytes the peer writes into our regions are stored by a thread of this
  // process (tcp's receiver thread) rather than by the peer's CPU or a NIC: a waiter must
  // then not spin, or it takes the core that thread needs (2 vCPUs here).
  virtual bool delivered_by_local_thread() const { return false; }
  // True when a write that reaches one of the peer's regions after the peer released it
  // fails the connection (verbs: the peer's NIC refuses the key and the queue pair, which
  // every channel to that peer uses, goes to its error state). tcp drops such a write and
  // serves the next frame; on shm the writer's mapping outlives the release.
  virtual bool late_write_breaks() const { return false; }
  // Cheap, non-blocking: false (with the reason) once the peer is gone. What every wait on the
  // peer asks (WaitPolicy::liveness_every_ns). A silent peer is alive: true, with `why` set to
  // its silent mark, which a wait that times out quotes.
  bool Alive(std::string* why);
  // Cheap, non-blocking: false (with the reason) once the peer's process or connection is
  // known to be gone; it never comes back on this endpoint.
  virtual bool PeerAlive(std::string* why) = 0;
  // The task's heartbeats (rdmadev/cluster/liveness.py) mark the peer silent (`why`: since
  // when and how to fix it) when it stops answering, and heard (empty `why`) when it answers
  // again. A silent peer may be stopped, overloaded or cut off, and may resume: waits on it go
  // on, as TF's own waits on a task do (they end at their deadline, which then says why).
  void SetSilent(const std::string& why);
  std::string Silent() const;
  virtual void Close() = 0;

 private:
  std::atomic<bool> silent_{false};  // Alive's fast path: no lock while the peer answers
  mutable std::mutex silent_mu_;
  std::string silent_why_;
};

class Fabric {
 public:
  virtual ~Fabric() = default;
  virtual std::string name() const = 0;
  // This process's reach on the fabric, as text inside a domain address ("<name>=<reach>").
  virtual std::string reach() const = 0;
  // Whether this process can reach a peer that advertises `peer_reach` on this fabric.
  virtual bool CanReach(const std::string& peer_reach) const = 0;
  virtual std::shared_ptr<Endpoint> Connect(const std::string& peer_reach,
                                            const Deadline& deadline) = 0;
  // How long after a release a peer's write posted before it may still land in the
  // released memory, when the fabric writes into it directly (shm: a copy already past its
  // credit wait; verbs: a work request in flight); 0 when the owner checks every write against
  // its live regions (tcp). A released region's span is quarantined that long (arena.h).
  virtual double late_write_window_s() const { return 0; }
  // Called by the Domain's arena before a new chunk holds any region: a fabric whose
  // hardware must know the memory (verbs: one memory registration per chunk) registers it
  // here and records in the chunk what a peer needs to address it (each region's descriptor
  // carries it). Throws kRegion.
  virtual void RegisterChunk(Chunk& chunk) {}
  // Called when an idle chunk goes (no region left in it): peers lose access. Never throws.
  virtual void DeregisterChunk(Chunk& chunk) {}
  virtual void Close() = 0;
};

// The wait policy for data coming from `ep`'s peer: no pure spin phase when a local
// thread delivers it (see Endpoint::delivered_by_local_thread).
WaitPolicy PolicyFor(const WaitPolicy& base, const Endpoint* ep);

// ---- The registry ----

// Fabric-specific settings, "<fabric>.<key>" -> text (e.g. "verbs.port" -> "1"). Each
// fabric parses and validates its own keys; rdmadev.Config fills them from the environment.
using FabricOptions = std::map<std::string, std::string>;

// What a fabric gets from the domain that opens it.
struct FabricContext {
  Domain* domain = nullptr;  // serves the domain's regions (tcp looks them up by id)
  std::string name;          // this task's identity, presented to peers
  std::string secret;        // cluster secret for authenticated connections
  std::string listen;        // "host:port" of DomainOptions::tcp_listen
  WaitPolicy wait;
};

// One registry entry per fabric (registered by its <name>_factory.cc at load time).
struct FabricFactory {
  std::string name;
  // Higher is preferred when two tasks can reach each other over several fabrics.
  int priority = 0;
  // Validates this fabric's "<name>.*" options without touching hardware; throws kConfig
  // naming the key. Run for every registered fabric whenever a domain opens.
  std::function<void(const FabricOptions&)> check;
  // "" when the fabric can open here with these options, else why not. Never opens the
  // fabric; throws kConfig when an option of this fabric is malformed.
  std::function<std::string(const FabricOptions&)> viable;
  // Opens the fabric; throws kConfig / kFabric.
  std::function<std::unique_ptr<Fabric>(const FabricContext&, const FabricOptions&)> create;
};

// Adds `factory` to the registry; a static FabricRegistration in each <name>_factory.cc
// (of FabricFactoryOf, below) calls it. Registering a name twice aborts the load with a message (a build error).
void RegisterFabric(FabricFactory factory);
struct FabricRegistration {
  explicit FabricRegistration(FabricFactory factory) { RegisterFabric(std::move(factory)); }
};

// Every registered fabric, best first (highest priority).
const std::vector<FabricFactory>& RegisteredFabrics();
// The entry named `name`; throws kConfig naming the registered choices.
const FabricFactory& FindFabric(const std::string& name);
// Fabric names, best first: the order in which two tasks pick a common fabric.
const std::vector<std::string>& FabricPriority();
// Why fabric `name` cannot run in this process ("" when it can), without opening it.
// Throws kConfig for an unknown fabric or a malformed option of that fabric.
std::string FabricUnviableReason(const std::string& name, const FabricOptions& options);
// Throws kConfig for a key whose "<fabric>." prefix names no registered fabric, or that
// its fabric refuses (every fabric's check, opened or not: a typo is never ignored).
void CheckFabricOptions(const FabricOptions& options);

// For the options parsers: the "<fabric>.<key>" entries of `options` as key -> text,
// prefix removed; throws kConfig naming an entry whose key is not in `known`.
std::map<std::string, std::string> OptionsOf(const std::string& fabric,
                                             const FabricOptions& options,
                                             const std::vector<std::string>& known);
// `text` as an integer in [low, high]; throws kConfig naming "<fabric>.<key>".
int OptionInt(const std::string& fabric, const std::string& key, const std::string& text,
              int low, int high);

// The options of a fabric that reads none: its parser still runs, so that a misspelt
// "<name>.<key>" is an error naming it rather than silently ignored.
struct NoFabricOptions {
  static std::vector<std::string> Keys() { return {}; }
  void Set(const std::string& key, const std::string& text) {}
};

// A backend's options from the "<name>.*" entries of `options`: OptionsOf refuses a key that
// B::Options::Keys() does not list, and Options::Set reads each of the others (throwing
// kConfig naming a malformed one).
template <typename B>
typename B::Options ParseFabricOptions(const FabricOptions& options) {
  typename B::Options parsed;
  for (const auto& kv : OptionsOf(B::kName, options, B::Options::Keys())) {
    parsed.Set(kv.first, kv.second);
  }
  return parsed;
}

// The registry entry of backend B (a <Name>Backend of <name>.h): the part every fabric's
// factory shares, so that a <name>_factory.cc is one line. B gives kName, kPriority, Options
// (NoFabricOptions, or a struct with Keys() and Set()), UnviableReason(const Options&) and
// Make(const FabricContext&, const Options&); every call parses the options first.
template <typename B>
FabricFactory FabricFactoryOf() {
  return {B::kName, B::kPriority,
          [](const FabricOptions& options) { ParseFabricOptions<B>(options); },
          [](const FabricOptions& options) {
            return B::UnviableReason(ParseFabricOptions<B>(options));
          },
          [](const FabricContext& ctx, const FabricOptions& options) {
            return B::Make(ctx, ParseFabricOptions<B>(options));
          }};
}

}  // namespace rdmadev
