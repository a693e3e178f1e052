// The process-wide table of channel halves by channel key. The Python control plane binds
// a channel once both ends have exchanged descriptors; the TF write/wait kernels look it up
// by the key in their attrs. It lives in librdmadev_core.so, which every consumer in a
// process links, so there is exactly one.
#pragma once

#include <condition_variable>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "channel.h"
#include "domain.h"

namespace rdmadev {

class ChannelRegistry {
 public:
  static ChannelRegistry& Global();

  struct Sender {
    std::shared_ptr<RingSender> ring;
    std::shared_ptr<Domain> domain;
  };
  struct Receiver {
    std::shared_ptr<RingReceiver> ring;
    std::shared_ptr<Domain> domain;
  };

  void Bind(const std::string& key, Sender s);
  void Bind(const std::string& key, Receiver r);
  // Waits until `key` is bound (the control plane may still be exchanging descriptors);
  // throws kTimeout naming the key at the deadline.
  Sender FindSender(const std::string& key, const Deadline& deadline);
  Receiver FindReceiver(const std::string& key, const Deadline& deadline);
  void Unbind(const std::string& key);
  std::vector<std::string> Keys() const;

 private:
  template <typename T>
  T Find(std::map<std::string, T>& table, const std::string& key, const Deadline& deadline,
         const char* half);
  mutable std::mutex mu_;
  std::condition_variable bound_;
  std::map<std::string, Sender> senders_;
  std::map<std::string, Receiver> receivers_;
};

}  // namespace rdmadev
