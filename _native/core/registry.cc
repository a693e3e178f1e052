#include "registry.h"

namespace rdmadev {

ChannelRegistry& ChannelRegistry::Global() {
  static ChannelRegistry* registry = new ChannelRegistry();  // never destroyed: kernels may
  return *registry;                                          // outlive static destructors
}

void ChannelRegistry::Bind(const std::string& key, Sender s) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    senders_[key] = std::move(s);
  }
  bound_.notify_all();
}

void ChannelRegistry::Bind(const std::string& key, Receiver r) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    receivers_[key] = std::move(r);
  }
  bound_.notify_all();
}

template <typename T>
T ChannelRegistry::Find(std::map<std::string, T>& table, const std::string& key,
                        const Deadline& deadline, const char* half) {
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    auto it = table.find(key);
    if (it != table.end()) return it->second;
    if (deadline.passed()) {
      throw Error(ErrorKind::kTimeout,
                  std::string("No ") + half + " bound for channel '" + key + "'", ETIMEDOUT,
                  "the peer task never set up its side: is it running with rdmadev loaded?");
    }
    bound_.wait_for(lock, std::chrono::milliseconds(deadline.remaining_ms(100)));
  }
}

ChannelRegistry::Sender ChannelRegistry::FindSender(const std::string& key, const Deadline& d) {
  return Find(senders_, key, d, "sender");
}

ChannelRegistry::Receiver ChannelRegistry::FindReceiver(const std::string& key,
                                                        const Deadline& d) {
  return Find(receivers_, key, d, "receiver");
}

void ChannelRegistry::Unbind(const std::string& key) {
  std::lock_guard<std::mutex> lock(mu_);
  senders_.erase(key);
  receivers_.erase(key);
}

std::vector<std::string> ChannelRegistry::Keys() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<std::string> out;
  for (const auto& kv : senders_) out.push_back("send:" + kv.first);
  for (const auto& kv : receivers_) out.push_back("recv:" + kv.first);
  return out;
}

}  // namespace rdmadev
