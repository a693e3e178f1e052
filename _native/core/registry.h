// The process-wide table of channel halves by channel key. The Python control plane binds
// a channel once both ends have exchanged descriptors; the TF write/wait kernels look it up
// by the key in their attrs. It lives in librdmadev_core.so, which every consumer in a
// process links, so there is exactly one.
//
// Lifetime: a bound half holds its ring, endpoint and a lease on the region it owns (the
// receiver's ring region, the sender's credit region); a region is released from its Domain
// when the last half holding its lease is unbound. Halves are unbound by the control plane:
// when the process that planned them saw TF drop the function (rdmadev.cluster.instances),
// when their peer task died, or with their Domain. TF kernels do not own an instantiation's
// halves: TF destroys and re-creates the kernels of functions it still runs (ops.cc). A half
// pair's kernels (TF1 sessions) hold theirs, and the last one unbinds it (Hold/LetGo).
#pragma once

#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "channel.h"
#include "domain.h"
#include "stage.h"

namespace rdmadev {

// A lease on a region of `domain`: the region is released (peers lose access; memory goes
// with the last reference) when the last copy of the returned pointer is dropped.
std::shared_ptr<void> LeaseRegion(const std::shared_ptr<Domain>& domain,
                                  const std::shared_ptr<Region>& region);

// How long a wait for a half to be bound sleeps between looks at its step's cancellation.
constexpr int kFindPollMs = 100;

class ChannelRegistry {
 public:
  static ChannelRegistry& Global();

  enum Half { kSend = 0, kRecv = 1, kBoth = 2 };
  struct Sender {
    std::shared_ptr<RingSender> ring;
    std::shared_ptr<Domain> domain;
    std::shared_ptr<void> lease;  // the pair's credit region
    std::string peer;             // the receiving task (for release notices)
    // The credit region of the ring this one succeeded: the receiver may still write a
    // credit into it until it takes the marker, so it stays registered meanwhile.
    std::shared_ptr<void> prior;
    // Where tensors larger than a slot are staged (dynamic channels; Bind makes it).
    std::shared_ptr<Stage> stage;
    std::string reader;  // the receiving task's identity: the only peer granted the stage
  };
  struct Receiver {
    std::shared_ptr<RingReceiver> ring;
    std::shared_ptr<Domain> domain;
    std::shared_ptr<void> lease;  // the pair's ring region
    std::string peer;             // the sending task
    std::shared_ptr<StageReader> staged;  // reads staged tensors (Bind makes it)
  };
  struct Counts {
    uint64_t senders = 0, receivers = 0;
  };
  // A receiving half whose tensors outgrew its slots (RingReceiver::wanted), with no
  // successor yet: what the control plane needs to set one up.
  struct Growth {
    std::string key, peer;
    uint64_t wanted = 0;
    RingLayout layout;
  };

  void Bind(const std::string& key, Sender s);
  void Bind(const std::string& key, Receiver r);
  // Waits until `key` is bound (the control plane may still be exchanging descriptors);
  // throws kTimeout naming the key at the deadline, kConfig once the half was given up on
  // (Fail), and kClosed once `cancelled` (asked at least every kFindPollMs; a TF kernel's:
  // its step was cancelled) returns true.
  // With `moving_from`, a sending successor bound for `key` replaces the half first, and
  // the replaced half, until Moved(key), is put in *moving_from: its ring must carry the
  // marker before anything goes on the successor (a send whose marker failed leaves it for
  // the next one). Otherwise *moving_from is left empty.
  using Cancelled = std::function<bool()>;
  Sender FindSender(const std::string& key, const Deadline& deadline,
                    Sender* moving_from = nullptr, const Cancelled& cancelled = nullptr);
  // The marker is on the replaced ring of `key`: its sending half goes.
  void Moved(const std::string& key);
  Receiver FindReceiver(const std::string& key, const Deadline& deadline,
                        const Cancelled& cancelled = nullptr);

  // Binds the successor of `key`'s half (growth); it replaces the half when the sender moves.
  void BindSuccessor(const std::string& key, Sender s);
  void BindSuccessor(const std::string& key, Receiver r);
  // The receiver of `key` took the marker: its successor replaces it and is returned.
  // Throws kProtocol when there is none (it was released meanwhile).
  Receiver AdvanceReceiver(const std::string& key);
  // The receiving halves of `domain` that want a larger ring.
  std::vector<Growth> Growing(const Domain* domain) const;

  // Unbinds `half` of `key` (kBoth: both); returns how many halves went.
  size_t Unbind(const std::string& key, Half half = kBoth);
  // Unbinds every half bound with `domain` (its task is shutting down).
  size_t UnbindDomain(const Domain* domain);
  // Unbinds every half of `domain` whose peer is task `peer` (it died or restarted).
  size_t UnbindPeer(const Domain* domain, const std::string& peer);

  // A half pair the control plane gave up on (its peer task runs without rdmadev, refused
  // the setup, ...): a kernel waiting for `half` of `key` fails at once with kConfig, `why`
  // and `hint`, instead of at its deadline. A Bind of that half, Unfail (the control plane
  // tries again) or the last holder letting go clears it.
  void Fail(const std::string& key, Half half, const std::string& why, const std::string& hint);
  void Unfail(const std::string& key, Half half);

  // A half pair's kernels (the TF ops' `owned` attr) hold `half` of `key` while they live:
  // several graphs of one session, or two sessions of one graph, share a pair's channel. The
  // half is unbound when its last holder lets go.
  void Hold(const std::string& key, Half half);
  void LetGo(const std::string& key, Half half);

  Counts CountsFor(const Domain* domain) const;
  std::vector<std::string> Keys() const;

 private:
  template <typename T>
  T Find(std::map<std::string, T>& table, const std::string& key, const Deadline& deadline,
         Half half, const Cancelled& cancelled);
  // Unbinds the halves (of `half`) whose (key, entry) satisfy `pred`; returns how many.
  template <typename Pred>
  size_t UnbindWhere(Half half, Pred pred);

  mutable std::mutex mu_;
  std::condition_variable bound_;
  std::map<std::pair<std::string, int>, int> holders_;  // (key, half) -> kernels holding it
  // (key, half) -> (why, hint) of a half pair given up on (Fail)
  std::map<std::pair<std::string, int>, std::pair<std::string, std::string>> failed_;
  std::map<std::string, Sender> senders_;
  std::map<std::string, Receiver> receivers_;
  std::map<std::string, Sender> next_senders_;  // successors (growth)
  std::map<std::string, Receiver> next_receivers_;
  std::map<std::string, Sender> moving_senders_;  // replaced, their marker not yet written
};

}  // namespace rdmadev
