#include "domain.h"

#include <algorithm>

namespace rdmadev {

std::vector<std::pair<std::string, std::string>> ParseAddress(const std::string& address) {
  std::vector<std::pair<std::string, std::string>> out;
  size_t start = 0;
  while (start <= address.size() && !address.empty()) {
    size_t end = address.find(';', start);
    if (end == std::string::npos) end = address.size();
    std::string item = address.substr(start, end - start);
    size_t eq = item.find('=');
    if (eq == std::string::npos || eq == 0 || eq + 1 == item.size()) {
      throw Error(ErrorKind::kProtocol, "Failed to parse domain address '" + address +
                                            "': item '" + item + "' is not fabric=reach",
                  0, "pass the exact Domain.address string of the peer");
    }
    out.emplace_back(item.substr(0, eq), item.substr(eq + 1));
    start = end + 1;
  }
  if (out.empty()) {
    throw Error(ErrorKind::kProtocol, "Failed to parse domain address: it is empty", 0,
                "pass the exact Domain.address string of the peer");
  }
  return out;
}

Domain::Domain(const DomainOptions& options)
    : options_(options),
      arena_(options.name, [this](Chunk& c) { RegisterChunk(c); },
             [this](Chunk& c) { DeregisterChunk(c); }) {}

std::shared_ptr<Domain> Domain::Open(const DomainOptions& options) {
  std::shared_ptr<Domain> d(new Domain(options));
  if (options.fabrics.empty()) {
    throw Error(ErrorKind::kConfig, "Failed to open domain: no fabric requested", 0,
                "set RDMADEV_FABRIC to auto or one of the registered fabrics");
  }
  // Every request is checked before anything opens: names, then option keys.
  for (const auto& name : options.fabrics) FindFabric(name);
  CheckFabricOptions(options.fabric_options);
  FabricContext ctx{d.get(), options.name, options.secret, options.tcp_listen, options.wait};
  for (const auto& factory : RegisteredFabrics()) {  // best first: fabrics_ stays in that order
    const auto& want = options.fabrics;
    if (std::find(want.begin(), want.end(), factory.name) == want.end()) continue;
    std::string why = factory.viable(options.fabric_options);
    if (!why.empty()) {
      throw Error(ErrorKind::kFabric, "Failed to open fabric " + factory.name + ": " + why, 0,
                  "choose another fabric with RDMADEV_FABRIC, or RDMADEV_FABRIC=auto");
    }
    d->fabrics_.push_back(factory.create(ctx, options.fabric_options));
  }
  double quarantine_s = 0;
  for (const auto& f : d->fabrics_) quarantine_s = std::max(quarantine_s, f->late_write_window_s());
  d->arena_.set_quarantine_s(quarantine_s);
  d->progress_.reset(new Progress(options.wait));
  return d;
}

Domain::~Domain() { Close(); }

std::string Domain::address() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::string out;
  for (const auto& f : fabrics_) {
    if (!out.empty()) out += ";";
    out += f->name() + "=" + f->reach();
  }
  return out;
}

std::vector<std::string> Domain::fabric_names() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<std::string> out;
  for (const auto& f : fabrics_) out.push_back(f->name());
  return out;
}

void Domain::RegisterChunk(Chunk& chunk) {
  std::lock_guard<std::mutex> lock(mu_);
  if (closed_) throw Error(ErrorKind::kClosed, "Failed to allocate region: domain is closed");
  for (size_t i = 0; i < fabrics_.size(); ++i) {
    try {
      fabrics_[i]->RegisterChunk(chunk);
    } catch (...) {
      for (size_t j = 0; j < i; ++j) fabrics_[j]->DeregisterChunk(chunk);
      throw;
    }
  }
}

void Domain::DeregisterChunk(Chunk& chunk) {
  std::lock_guard<std::mutex> lock(mu_);
  for (auto& f : fabrics_) f->DeregisterChunk(chunk);
}

std::shared_ptr<Region> Domain::Allocate(uint64_t size, const std::string& label,
                                         const std::string& peer) {
  uint64_t id;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (closed_) throw Error(ErrorKind::kClosed, "Failed to allocate region: domain is closed");
    id = next_region_++;
  }
  std::shared_ptr<Region> r;
  {
    std::lock_guard<std::mutex> lock(arena_mu_);
    r = arena_.Place(id, size, peer, options_.max_registered_bytes);
  }
  r->Grant(peer);
  std::lock_guard<std::mutex> lock(mu_);
  // Close may have come meanwhile: its fabrics no longer serve the chunk.
  if (closed_) throw Error(ErrorKind::kClosed, "Failed to allocate region: domain is closed");
  regions_[id] = r;
  return r;
}

std::shared_ptr<Region> Domain::Find(uint64_t id, bool* retired) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = regions_.find(id);
  // Ids are handed out in order and never reused, so an id below the next one that is not
  // live was released (or failed to register).
  if (retired) *retired = it == regions_.end() && id != 0 && id < next_region_;
  return it == regions_.end() ? nullptr : it->second;
}

void Domain::Release(uint64_t id) {
  std::shared_ptr<Region> r;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = regions_.find(id);
    if (it == regions_.end()) return;
    r = it->second;
    regions_.erase(it);
  }
  // Its span stays in its chunk, registered, until the last reference to it goes (a TF
  // tensor may alias a slot) and any quarantine ends; Trim then lets an idle chunk go.
  r->Close();
}

std::pair<uint64_t, uint64_t> Domain::RegionStats() const {
  std::lock_guard<std::mutex> lock(mu_);
  uint64_t bytes = 0;
  for (const auto& kv : regions_) bytes += kv.second->size();
  return {regions_.size(), bytes};
}

ChunkCounts Domain::ChunkStats() {
  std::lock_guard<std::mutex> lock(arena_mu_);
  arena_.Trim();
  return arena_.Stats();
}

void Domain::Trim() {
  std::lock_guard<std::mutex> lock(arena_mu_);
  arena_.Trim();
}

std::string Domain::Choose(const std::string& peer_address, const std::string& fabric) const {
  auto peer = ParseAddress(peer_address);
  std::lock_guard<std::mutex> lock(mu_);
  for (const auto& f : fabrics_) {
    if (fabric != "auto" && f->name() != fabric) continue;
    for (const auto& p : peer) {
      if (p.first == f->name() && f->CanReach(p.second)) return f->name();
    }
  }
  std::string mine;
  for (const auto& f : fabrics_) mine += (mine.empty() ? "" : ", ") + f->name();
  throw Error(ErrorKind::kFabric,
              "Failed to choose a fabric (" + fabric + ") to peer '" + peer_address +
                  "': this task offers [" + mine + "] and can reach none the peer offers",
              0,
              "open a common fabric in both tasks (RDMADEV_FABRIC=auto opens every viable one); "
              "shm needs both tasks on one host");
}

std::shared_ptr<Endpoint> Domain::Connect(const std::string& peer_address,
                                          const std::string& fabric, const Deadline& deadline) {
  std::string chosen = Choose(peer_address, fabric);
  Fabric* f = nullptr;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (closed_) throw Error(ErrorKind::kClosed, "Failed to connect: domain is closed");
    for (const auto& x : fabrics_) if (x->name() == chosen) f = x.get();
  }
  for (const auto& p : ParseAddress(peer_address)) {
    if (p.first == chosen) return f->Connect(p.second, deadline);
  }
  throw Error(ErrorKind::kFabric, "Failed to connect: peer address lost fabric " + chosen);
}

void Domain::Close() {
  std::vector<std::unique_ptr<Fabric>> fabrics;
  std::map<uint64_t, std::shared_ptr<Region>> regions;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (closed_) return;
    closed_ = true;
    fabrics.swap(fabrics_);
    regions.swap(regions_);
  }
  // Children before parents: stop serving peers, then finish waits, then regions.
  for (auto& f : fabrics) f->Close();
  if (progress_) progress_->Close();
  for (auto& kv : regions) kv.second->Close();
  std::lock_guard<std::mutex> lock(arena_mu_);
  arena_.Clear();
}

bool Domain::closed() const {
  std::lock_guard<std::mutex> lock(mu_);
  return closed_;
}

}  // namespace rdmadev
