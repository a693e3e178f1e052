// The process-wide table of channel halves by channel key. The Python control plane binds
// a channel once both ends have exchanged descriptors; the TF write/wait kernels look it up
// by the key in their attrs. It lives in librdmadev_core.so, which every consumer in a
// process links, so there is exactly one.
//
// Lifetime: a bound half holds its ring, endpoint and a lease on the region it owns (the
// receiver's ring region, the sender's credit region, and its stage); a region is released
// from its Domain when the last half holding its lease is unbound, except that a sending half
// whose receiver has not credited all it sent is parked until it has, and a receiving half
// whose sender may still write is retired for a grace before its ring goes (Unbind). Halves are
// unbound by the control plane: when the process that planned them saw TF drop the function
// (rdmadev.cluster.instances), when their peer task died, or with their Domain. TF kernels do
// not own an instantiation's halves: TF destroys and re-creates the kernels of functions it
// still runs (_native/tf/kernels/ops.cc). A half pair's kernels (TF1 sessions) hold theirs, and the last one
// unbinds it (Hold/LetGo).
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
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
// How long a kernel that finds its half lost to a broken connection (UnbindPeer) waits for
// the control plane's verdict on the peer (PeerVerdict) before failing without it. The
// verdict is one control round trip (rdmadev/cluster/recovery.py pings the peer): refused
// at once by a dead task's host, answered at once by a running task; a stopped or
// unreachable one answers neither, and the step then fails as a transient one.
constexpr double kVerdictWaitS = 3;

// How long a sending half unbound before its receiver credited all it sent stays parked at
// most (ChannelRegistry::Unbind). A receiver reads a stage or writes a credit within the
// receive that took the transfer, so a transfer not credited by then was abandoned (its step
// failed and its function was released) and only its memory is left to free:
// - kParkedGraceS when the receiving half may still be bound (the sender's own release came
//   first): a receive may yet start and take the transfer. The largest staged read
//   (RDMADEV_MAX_TENSOR_BYTES, 2 GiB by default) takes ~10 s at 200 MB/s.
// - kReleasedGraceS once the receiving task says its half is unbound (its release notice,
//   channels.py), or has set the pair up anew (the sending half bound again: Bind): no
//   receive starts any more, and one already reading is in its last copy.
constexpr double kParkedGraceS = 60;
constexpr double kReleasedGraceS = 5;
// How long a receiving half unbound while its sender may still write stays retired, its ring
// registered, when a write reaching a released ring would break the connection
// (Endpoint::late_write_breaks: verbs). A write posted before the unbind lands, or fails, within
// the queue pair's retry budget (~1.9 s by default, at most 7.5 s: verbs_qp.h); one posted after it
// comes from a send already past its credit wait on the sender, whose half goes with the same
// release (the planner tells every task) or with this task's notice (channels.py), one control
// round trip later. 10 s (kLateWriteGraceS, region.h) covers both on a loaded host. Once the ring's
// region goes, its span of the chunk stays registered and is quarantined as long again before
// another region takes it (Chunk::Give); a write later still lands in whatever region took it then,
// or, once its chunk went, breaks the connection: the control plane then unbinds the channels it
// carried, as for a lost peer, and connects afresh for the next instantiation (channels.py).

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
    uint64_t parked = 0;  // sending halves unbound, their memory kept for their receiver
    uint64_t retired = 0;  // receiving halves unbound, their ring kept for late writes
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
  // Waits until `key` is bound (the control plane may still be exchanging descriptors), or
  // kept on TF's path (KeepOnTf: an empty half, no ring, is returned, and kept wins over a
  // half bound meanwhile); throws kTimeout naming the key at the deadline, kConfig once the
  // half was given up on (Fail), and kClosed once `cancelled` (asked at least every
  // kFindPollMs; a TF kernel's: its step was cancelled) returns true.
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

  // Unbinds `half` of `key` (kBoth: both); returns how many halves went. A sending half
  // whose receiver has not credited all it sent is parked rather than released, for at
  // most `park_s` (a half of `key` parked earlier gets at most that much more): the
  // receiver may still read the tensor it staged (stage.h) or write a credit, and freeing
  // that memory under it would fail the read and, on tcp and verbs, break the connection
  // every channel to that peer shares. ReleaseDrained frees it. A receiving half whose
  // fabric breaks on a late write (verbs) is retired likewise, its ring kept registered for
  // min(park_s, kLateWriteGraceS) (a half of `key` retired earlier gets at most that much
  // more): its sender's last write may still be on its way.
  // `park_s` <= 0 says that nothing is in flight on the halves (their last step ended
  // cleanly, their peer is gone, or their Domain closes): their regions' spans are not
  // quarantined for late writes (Region::Quiet) and may be taken again at once.
  size_t Unbind(const std::string& key, Half half = kBoth, double park_s = kParkedGraceS);
  // Unbinds every half bound with `domain` (its task is shutting down), parked ones too.
  size_t UnbindDomain(const Domain* domain);
  // Unbinds every half of `domain` whose peer is task `peer` (it died or restarted, or the
  // connection to it broke), parked ones too: that peer reads and credits nothing more.
  // `via` (not null): only the halves on that endpoint, the one that broke. A peer restarted
  // at once may already have halves on a new endpoint, set up for its new instantiations. A
  // kernel that then looks for one of those halves fails at once with kPeerLost and `why`
  // (Unavailable: TF's retrying callers run the step again), until the half is bound again:
  // the control plane sets a running peer's pairs up again (rdmadev/cluster/recovery.py),
  // and a step that began before then must not take halves meant for the steps after it.
  size_t UnbindPeer(const Domain* domain, const std::string& peer, const std::string& why,
                    const Endpoint* via = nullptr);
  // The control plane's verdict on task `peer`, whose halves on `domain` UnbindPeer marked
  // lost: `gone` empty, it still runs (its channels are set up again: a step finding one of
  // them lost fails as a transient one, and runs again); else it does not (`gone` says why:
  // it died, restarted or does not answer), and a step finding one of them lost fails with
  // `gone`, naming the task as TF's gRPC names a remote target (FromRemoteTarget), so that
  // TF's ClusterCoordinator takes it for what it is: a lost ps is raised to the user, a lost
  // worker's closure runs again. Until the verdict (at most kVerdictWaitS), such a step
  // waits for it. Returns how many lost halves it judged.
  size_t PeerVerdict(const Domain* domain, const std::string& peer, const std::string& gone);
  // Releases the parked sending halves whose receiver has credited all they sent, and the
  // parked or retired halves whose time is up or whose Domain closed; returns how many went.
  // Every unbind does it too, and the control plane's watcher every WATCH_INTERVAL_S
  // (channels.py).
  size_t ReleaseDrained();

  // A half pair the control plane gave up on (its peer task runs without rdmadev, refused
  // the setup, ...): a kernel waiting for `half` of `key` fails at once with kConfig, `why`
  // and `hint`, instead of at its deadline. A Bind of that half, Unfail (the control plane
  // tries again) or the last holder letting go clears it.
  void Fail(const std::string& key, Half half, const std::string& why, const std::string& hint);
  void Unfail(const std::string& key, Half half);

  // A half pair the control plane could not set up (its peer task runs without rdmadev, the
  // receiving task has no room within its budget, the peer never planned its half): a kernel
  // looking for `half` of `key` finds an empty half (no ring) and carries the tensor on TF's
  // own path instead, through its step's rendezvous (_native/tf/kernels/tf_path.h). Kept for
  // as long as this process lives, and on both tasks (rdmadev/cluster/half_pairs.py tells the
  // peer): a pair met again on one side only would carry one step's tensor on two paths.
  void KeepOnTf(const std::string& key, Half half);
  bool KeptOnTf(const std::string& key, Half half) const;

  // A half pair's kernels (the TF ops' `owned` attr) hold `half` of `key` while they live:
  // several graphs of one session, or two sessions of one graph, share a pair's channel. The
  // half is unbound when its last holder lets go.
  void Hold(const std::string& key, Half half);
  void LetGo(const std::string& key, Half half);
  // Whether a kernel holds `half` of `key` (a half pair its graph still runs: the control
  // plane sets such a half up again after its connection broke).
  bool Held(const std::string& key, Half half) const;
  // Whether `half` of `key` is unbound because its connection broke (UnbindPeer), bound
  // again since by no one and let go by no kernel: a half pair the control plane sets up
  // again even when no kernel holds it yet (its graph's kernels are being created).
  bool Lost(const std::string& key, Half half) const;

  Counts CountsFor(const Domain* domain) const;
  std::vector<std::string> Keys() const;

 private:
  template <typename T>
  T Find(std::map<std::string, T>& table, const std::string& key, const Deadline& deadline,
         Half half, const Cancelled& cancelled);
  // Unbinds the halves (of `half`) whose (key, entry) satisfy `pred`, parking or retiring
  // them for at most `park_s` (Unbind), and gives parked and retired halves satisfying
  // `pred` at most that much more (0: their peer reads and writes nothing more, they go
  // now); returns how many went.
  // `lost` (not null): each half unbound is marked lost with that reason (UnbindPeer).
  template <typename Pred>
  size_t UnbindWhere(Half half, Pred pred, double park_s, const std::string* lost = nullptr);
  using Clock = std::chrono::steady_clock;
  // An unbound half whose memory its peer may still use.
  template <typename T>
  struct Kept {
    std::string key;
    T half;
    Clock::time_point until;  // released then at the latest
  };
  // Under mu_: `s` is parked when its receiver has not credited all it sent, else goes to
  // `graveyard`; `r` is retired when late writes break its fabric and `park_s` > 0, else
  // goes to `graveyard`.
  void RetireLocked(const std::string& key, Sender&& s, double park_s,
                    std::vector<std::shared_ptr<void>>* graveyard);
  void RetireLocked(const std::string& key, Receiver&& r, double park_s,
                    std::vector<std::shared_ptr<void>>* graveyard);
  // Under mu_: moves the parked halves that drained, and the kept ones whose time is up or
  // whose Domain closed, into `graveyard`.
  void ReleaseKeptLocked(std::vector<std::shared_ptr<void>>* graveyard);

  mutable std::mutex mu_;
  std::condition_variable bound_;
  std::map<std::pair<std::string, int>, int> holders_;  // (key, half) -> kernels holding it
  // Why a kernel looking for an unbound half fails at once: given up on (Fail: kConfig), or
  // its peer lost (UnbindPeer: kPeerLost, on `domain` with task `peer`, which until
  // `verdict_by` awaits the control plane's verdict: PeerVerdict).
  struct Failure {
    ErrorKind kind;
    std::string why, hint;
    const Domain* domain = nullptr;
    std::string peer;
    std::optional<Clock::time_point> verdict_by;
  };
  std::map<std::pair<std::string, int>, Failure> failed_;  // (key, half) -> why
  std::set<std::pair<std::string, int>> kept_on_tf_;     // (key, half): KeepOnTf
  std::map<std::string, Sender> senders_;
  std::map<std::string, Receiver> receivers_;
  std::map<std::string, Sender> next_senders_;  // successors (growth)
  std::map<std::string, Receiver> next_receivers_;
  std::map<std::string, Sender> moving_senders_;  // replaced, their marker not yet written
  std::vector<Kept<Sender>> parked_;     // unbound sending halves their receiver may still use
  std::vector<Kept<Receiver>> retired_;  // unbound receiving halves their sender may write to
};

}  // namespace rdmadev
