#include "registry.h"

#include <type_traits>

namespace rdmadev {

namespace {

struct RegionLease {
  std::weak_ptr<Domain> domain;
  uint64_t id;
  ~RegionLease() {
    if (auto d = domain.lock()) d->Release(id);  // never throws; no-op once the domain closed
  }
};

}  // namespace

std::shared_ptr<void> LeaseRegion(const std::shared_ptr<Domain>& domain,
                                  const std::shared_ptr<Region>& region) {
  auto lease = std::make_shared<RegionLease>();
  lease->domain = domain;
  lease->id = region->id();
  return lease;
}

ChannelRegistry& ChannelRegistry::Global() {
  static ChannelRegistry* registry = new ChannelRegistry();  // never destroyed: kernels may
  return *registry;                                          // outlive static destructors
}

namespace {
// A bound half's staging parts: the sender's stage, the receiver's reader of its peer's.
void Equip(ChannelRegistry::Sender& s) {
  if (!s.stage) s.stage = std::make_shared<Stage>(s.reader);
}
void Equip(ChannelRegistry::Receiver& r) {
  if (!r.staged) r.staged = std::make_shared<StageReader>();
}

// Keeps an unbound half's ring and leases until `graveyard` is destroyed, after unlocking:
// freeing a region deregisters it from its fabric, which must not run under the lock.
template <typename T>
void Bury(T&& entry, std::vector<std::shared_ptr<void>>* graveyard) {
  graveyard->push_back(std::make_shared<std::decay_t<T>>(std::forward<T>(entry)));
}

std::chrono::steady_clock::time_point After(double s) {
  return std::chrono::steady_clock::now() +
         std::chrono::duration_cast<std::chrono::steady_clock::duration>(
             std::chrono::duration<double>(s));
}
}  // namespace

void ChannelRegistry::Bind(const std::string& key, Sender s) {
  Equip(s);
  // A rebound key's previous half is parked (Unbind), or goes after unlocking. A sending
  // half is bound again only when its receiver set the pair up anew (open_pairs; reopen after
  // a connection broke, recovery.py), its own half replaced by then: no receive starts on the
  // old ring any more, so it is parked for kReleasedGraceS, as after the receiver's release
  // notice. (For kParkedGraceS, a pair set up twice after one break, once by each task that
  // saw it, kept the first new ring's memory for a minute.)
  std::vector<std::shared_ptr<void>> graveyard;
  Sender old;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto& slot = senders_[key];
    old = std::move(slot);
    if (old.ring && old.ring != s.ring) {
      old.ring->MarkUnbound();  // its waits give up
      RetireLocked(key, std::move(old), kReleasedGraceS, &graveyard);
    }
    slot = std::move(s);
    failed_.erase({key, kSend});
  }
  bound_.notify_all();
}

void ChannelRegistry::Bind(const std::string& key, Receiver r) {
  Equip(r);
  // A rebound key's previous half is retired (Unbind), or goes after unlocking.
  std::vector<std::shared_ptr<void>> graveyard;
  Receiver old;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto& slot = receivers_[key];
    old = std::move(slot);
    if (old.ring && old.ring != r.ring) {
      old.ring->MarkUnbound();  // its waits give up
      RetireLocked(key, std::move(old), kParkedGraceS, &graveyard);
    }
    slot = std::move(r);
    failed_.erase({key, kRecv});
  }
  bound_.notify_all();
}

template <typename T>
T ChannelRegistry::Find(std::map<std::string, T>& table, const std::string& key,
                        const Deadline& deadline, Half half, const Cancelled& cancelled) {
  const std::string no = std::string("No ") + (half == kSend ? "sender" : "receiver") +
                         " bound for channel '" + key + "'";
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    if (kept_on_tf_.count({key, half})) return T{};
    auto it = table.find(key);
    if (it != table.end()) return it->second;
    auto failed = failed_.find({key, half});
    const bool judging = failed != failed_.end() && failed->second.verdict_by &&
                         Clock::now() < *failed->second.verdict_by;
    if (failed != failed_.end() && (!judging || deadline.passed())) {
      const Failure& f = failed->second;
      throw Error(f.kind, no + ": " + f.why, 0, f.hint);
    }
    if (cancelled && cancelled()) {
      throw Error(ErrorKind::kClosed, no + ": the step was cancelled while waiting for it");
    }
    if (deadline.passed()) {
      throw Error(ErrorKind::kTimeout, no, ETIMEDOUT,
                  "the peer task never set up its side (is it running with rdmadev loaded?), "
                  "or the channel's instantiation was released");
    }
    bound_.wait_for(lock, std::chrono::milliseconds(deadline.remaining_ms(kFindPollMs)));
  }
}

ChannelRegistry::Sender ChannelRegistry::FindSender(const std::string& key, const Deadline& d,
                                                    Sender* moving_from,
                                                    const Cancelled& cancelled) {
  Sender s = Find(senders_, key, d, kSend, cancelled);
  if (moving_from == nullptr || !s.ring) return s;  // no ring: kept on TF's path
  std::lock_guard<std::mutex> lock(mu_);
  auto current = senders_.find(key);
  if (current == senders_.end()) return s;  // unbound meanwhile: the send fails on its own
  auto next = next_senders_.find(key);
  if (next != next_senders_.end()) {
    Sender& replaced = moving_senders_[key];  // a pending marker's ring stays the one to mark
    if (!replaced.ring) replaced = current->second;
    current->second = std::move(next->second);
    current->second.prior = replaced.lease;
    next_senders_.erase(next);
  }
  auto moving = moving_senders_.find(key);
  if (moving != moving_senders_.end()) *moving_from = moving->second;
  return current->second;
}

void ChannelRegistry::Moved(const std::string& key) {
  Sender old;  // goes after unlocking
  std::lock_guard<std::mutex> lock(mu_);
  auto it = moving_senders_.find(key);
  if (it == moving_senders_.end()) return;
  old = std::move(it->second);
  moving_senders_.erase(it);
}

void ChannelRegistry::BindSuccessor(const std::string& key, Sender s) {
  Equip(s);
  Sender old;
  std::lock_guard<std::mutex> lock(mu_);
  old = std::move(next_senders_[key]);
  next_senders_[key] = std::move(s);
}

void ChannelRegistry::BindSuccessor(const std::string& key, Receiver r) {
  Equip(r);
  Receiver old;
  std::lock_guard<std::mutex> lock(mu_);
  old = std::move(next_receivers_[key]);
  next_receivers_[key] = std::move(r);
  CountGrown();
}

ChannelRegistry::Receiver ChannelRegistry::AdvanceReceiver(const std::string& key) {
  // Goes after unlocking: dropping its lease deregisters the old ring, at once: the marker
  // taken from it was its sender's last write there.
  Receiver old;
  std::lock_guard<std::mutex> lock(mu_);
  auto next = next_receivers_.find(key);
  auto current = receivers_.find(key);
  if (next == next_receivers_.end() || current == receivers_.end()) {
    throw Error(ErrorKind::kProtocol,
                "Channel '" + key + "' moved to a larger ring that is not bound here", 0,
                "the channel was released while it grew; the next instantiation sets it up again");
  }
  old = std::move(current->second);
  current->second = std::move(next->second);
  next_receivers_.erase(next);
  return current->second;
}

std::vector<ChannelRegistry::Growth> ChannelRegistry::Growing(const Domain* domain) const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<Growth> out;
  for (const auto& kv : receivers_) {
    const auto& ring = *kv.second.ring;
    if (kv.second.domain.get() != domain || ring.wanted() <= ring.layout().capacity ||
        next_receivers_.count(kv.first)) {
      continue;
    }
    out.push_back(Growth{kv.first, kv.second.peer, ring.wanted(), ring.layout()});
  }
  return out;
}

ChannelRegistry::Receiver ChannelRegistry::FindReceiver(const std::string& key,
                                                        const Deadline& d,
                                                        const Cancelled& cancelled) {
  return Find(receivers_, key, d, kRecv, cancelled);
}

namespace {

// Erases the entries of `table` (senders or receivers) for which pred(key, entry) holds,
// marking each ring unbound (a kernel waiting on it gives up) and handing each entry (ring,
// leases) to sink(key, entry), which keeps it or passes it to the caller's graveyard (Bury).
template <typename Table, typename Pred, typename Sink>
size_t EraseWhere(Table& table, Pred pred, Sink sink) {
  size_t n = 0;
  for (auto it = table.begin(); it != table.end();) {
    if (!pred(it->first, it->second)) {
      ++it;
      continue;
    }
    if (it->second.ring) it->second.ring->MarkUnbound();
    sink(it->first, std::move(it->second));
    it = table.erase(it);
    ++n;
  }
  return n;
}

// Moves the entries of `kept` that `done(entry)`, whose time is up or whose Domain closed
// (its regions went with it) into `graveyard`.
template <typename T, typename Done>
void ReleaseKept(std::vector<T>* kept, Done done, std::vector<std::shared_ptr<void>>* graveyard) {
  const auto now = std::chrono::steady_clock::now();
  for (auto it = kept->begin(); it != kept->end();) {
    const bool gone = it->half.domain && it->half.domain->closed();
    if (gone || it->until <= now || done(it->half)) {
      Bury(std::move(it->half), graveyard);
      it = kept->erase(it);
    } else {
      ++it;
    }
  }
}
}  // namespace

void ChannelRegistry::RetireLocked(const std::string& key, Sender&& s, double park_s,
                                   std::vector<std::shared_ptr<void>>* graveyard) {
  // Nothing in flight: the credit region's span may be taken again at once (region.h).
  if (park_s <= 0 && s.ring && s.ring->credit_region()) s.ring->credit_region()->Quiet();
  if (!s.ring || s.ring->Drained() || park_s <= 0) return Bury(std::move(s), graveyard);
  parked_.push_back({key, std::move(s), After(park_s)});
}

void ChannelRegistry::RetireLocked(const std::string& key, Receiver&& r, double park_s,
                                   std::vector<std::shared_ptr<void>>* graveyard) {
  const bool late_writes_break =
      r.ring && r.ring->endpoint() && r.ring->endpoint()->late_write_breaks();
  if (park_s <= 0 && r.ring && r.ring->ring_region()) r.ring->ring_region()->Quiet();
  if (!late_writes_break || park_s <= 0) return Bury(std::move(r), graveyard);
  retired_.push_back({key, std::move(r), After(std::min(park_s, kLateWriteGraceS))});
}

void ChannelRegistry::ReleaseKeptLocked(std::vector<std::shared_ptr<void>>* graveyard) {
  ReleaseKept(&parked_, [](const Sender& s) { return s.ring->Drained(); }, graveyard);
  ReleaseKept(&retired_, [](const Receiver&) { return false; }, graveyard);
}

size_t ChannelRegistry::ReleaseDrained() {
  std::vector<std::shared_ptr<void>> graveyard;  // destroyed after the lock is released
  std::lock_guard<std::mutex> lock(mu_);
  ReleaseKeptLocked(&graveyard);
  return graveyard.size();
}

template <typename Pred>
size_t ChannelRegistry::UnbindWhere(Half half, Pred pred, double park_s, const std::string* lost) {
  std::vector<std::shared_ptr<void>> graveyard;  // destroyed after the lock is released
  std::lock_guard<std::mutex> lock(mu_);
  // A half its peer may still use is parked or retired, not buried.
  auto retire = [&](const std::string& key, auto&& entry) {
    if (lost) {
      constexpr bool sending = std::is_same_v<std::decay_t<decltype(entry)>, Sender>;
      failed_[{key, sending ? kSend : kRecv}] = {
          ErrorKind::kPeerLost, *lost,
          "run the step again: once the peer task runs again or its connection is set up "
          "again, the next step finds its channels",
          entry.domain.get(), entry.peer, After(kVerdictWaitS)};
    }
    RetireLocked(key, std::move(entry), park_s, &graveyard);
  };
  auto shorten = [&](auto& kept) {
    const auto until = After(park_s);
    for (auto& k : kept) {
      if (pred(k.key, k.half)) k.until = std::min(k.until, until);
    }
  };
  if (half != kRecv) shorten(parked_);
  if (half != kSend) shorten(retired_);
  size_t n = 0;
  if (half != kRecv) n += EraseWhere(senders_, pred, retire);
  if (half != kSend) n += EraseWhere(receivers_, pred, retire);
  // Successors are not counted: they belong to the halves that went. One that never sent
  // is drained; a replaced half whose marker is pending is parked like the half itself; a
  // receiving successor may be written to (its sender moved first) and is retired.
  if (half != kRecv) EraseWhere(next_senders_, pred, retire);
  if (half != kRecv) EraseWhere(moving_senders_, pred, retire);
  if (half != kSend) EraseWhere(next_receivers_, pred, retire);
  ReleaseKeptLocked(&graveyard);
  if (lost) bound_.notify_all();  // kernels waiting in Find fail now
  return n;
}

size_t ChannelRegistry::Unbind(const std::string& key, Half half, double park_s) {
  return UnbindWhere(half, [&](const std::string& k, const auto&) { return k == key; }, park_s);
}

size_t ChannelRegistry::UnbindDomain(const Domain* domain) {
  return UnbindWhere(kBoth, [&](const std::string&, const auto& e) {
    return e.domain.get() == domain;
  }, /*park_s=*/0);
}

size_t ChannelRegistry::UnbindPeer(const Domain* domain, const std::string& peer,
                                   const std::string& why, const Endpoint* via) {
  return UnbindWhere(kBoth, [&](const std::string&, const auto& e) {
    return e.domain.get() == domain && e.peer == peer &&
           (via == nullptr || e.ring->endpoint().get() == via);
  }, /*park_s=*/0, &why);
}

size_t ChannelRegistry::PeerVerdict(const Domain* domain, const std::string& peer,
                                     const std::string& gone) {
  size_t n = 0;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto& [_, f] : failed_) {
      if (f.kind != ErrorKind::kPeerLost || f.domain != domain || f.peer != peer) continue;
      f.verdict_by.reset();
      if (!gone.empty()) {
        f.why = gone + FromRemoteTarget(peer);
        f.hint = "the task is gone with what it held: TF's ClusterCoordinator raises a lost "
                 "parameter server to the caller (restore the variables from a checkpoint) "
                 "and runs a lost worker's closures again once it is back";
      }
      ++n;
    }
  }
  bound_.notify_all();  // kernels waiting in Find for the verdict
  return n;
}

void ChannelRegistry::Hold(const std::string& key, Half half) {
  std::lock_guard<std::mutex> lock(mu_);
  ++holders_[{key, half}];
}

void ChannelRegistry::LetGo(const std::string& key, Half half) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = holders_.find({key, half});
    if (it == holders_.end() || --it->second > 0) return;
    holders_.erase(it);
    failed_.erase({key, half});
  }
  Unbind(key, half);
}

bool ChannelRegistry::Held(const std::string& key, Half half) const {
  std::lock_guard<std::mutex> lock(mu_);
  return holders_.count({key, half}) > 0;
}

bool ChannelRegistry::Lost(const std::string& key, Half half) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = failed_.find({key, half});
  return it != failed_.end() && it->second.kind == ErrorKind::kPeerLost;
}

void ChannelRegistry::Fail(const std::string& key, Half half, const std::string& why,
                           const std::string& hint) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    failed_[{key, half}] = {ErrorKind::kConfig, why, hint};
  }
  bound_.notify_all();  // waiters fail now
}

void ChannelRegistry::KeepOnTf(const std::string& key, Half half) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    kept_on_tf_.insert({key, half});
  }
  bound_.notify_all();  // waiters take TF's path now
}

bool ChannelRegistry::KeptOnTf(const std::string& key, Half half) const {
  std::lock_guard<std::mutex> lock(mu_);
  return kept_on_tf_.count({key, half}) > 0;
}

void ChannelRegistry::Unfail(const std::string& key, Half half) {
  std::lock_guard<std::mutex> lock(mu_);
  failed_.erase({key, half});
}

ChannelRegistry::Counts ChannelRegistry::CountsFor(const Domain* domain) const {
  std::lock_guard<std::mutex> lock(mu_);
  Counts c;
  for (const auto& kv : senders_) {
    if (domain && kv.second.domain.get() != domain) continue;
    ++c.senders;
  }
  for (const auto& p : parked_) {
    if (domain && p.half.domain.get() != domain) continue;
    ++c.parked;
  }
  for (const auto& r : retired_) {
    if (domain && r.half.domain.get() != domain) continue;
    ++c.retired;
  }
  for (const auto& kv : receivers_) {
    if (domain && kv.second.domain.get() != domain) continue;
    ++c.receivers;
  }
  return c;
}

std::vector<std::string> ChannelRegistry::Keys() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<std::string> out;
  for (const auto& kv : senders_) out.push_back("send:" + kv.first);
  for (const auto& kv : receivers_) out.push_back("recv:" + kv.first);
  return out;
}

}  // namespace rdmadev
