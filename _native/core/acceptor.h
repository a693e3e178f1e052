// The accepting side of rdmadev's TCP connections, shared by the tcp fabric (its data
// connections) and the verbs fabric (its connection-setup side channel): listen on
// host:port, accept on one thread, give each connection its own thread that runs the
// authenticated handshake (handshake.h) with the fabric's tag and then hands the socket
// and the peer's authenticated name to the fabric's handler.
#pragma once

#include <atomic>
#include <functional>
#include <list>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "common.h"

namespace rdmadev {

class Acceptor {
 public:
  // Runs on the connection's own thread once the peer has proved the secret; owns the
  // conversation on `fd` until it returns (Close ends it by shutting `fd` down, so the
  // handler must return when its socket reports end of file or an error). Never closes
  // `fd`. `peer` is the authenticated name, `where` the peer's "host:port".
  using Handler = std::function<void(int fd, const std::string& peer, const std::string& where)>;

  // Listens on `listen` ("host:port", port 0 = any free port) and starts accepting.
  // `fabric` prefixes log lines; `tag` and `secret` are the handshake's. Throws kConfig /
  // kFabric when it cannot listen.
  Acceptor(const std::string& listen, std::string fabric, std::string tag, std::string secret,
           Handler handler);
  ~Acceptor();
  Acceptor(const Acceptor&) = delete;
  Acceptor& operator=(const Acceptor&) = delete;

  // The bound "host:port" a peer dials.
  const std::string& reach() const { return reach_; }
  // Stops accepting, shuts every connection down (a peer mid-handshake included), joins
  // every thread. Idempotent; returns within the time a handler takes to see its socket
  // shut down.
  void Close();

 private:
  // A connection is handshaking until its peer proved the secret (then serving) or until
  // the loop dropped it for a newer one; whichever comes first wins the exchange.
  enum State : int { kHandshaking, kServing, kDropped };
  struct Conn {
    int fd = -1;
    std::thread thread;
    std::atomic<int> state{kHandshaking};
    std::atomic<bool> done{false};
  };
  void Loop();
  void Serve(Conn* c, const std::string& where);
  void Reap();  // joins finished connections; caller holds mu_
  // Admits a new connection from `where` under the budgets (see acceptor.cc); false if it
  // must be refused. Caller holds mu_.
  bool Admit(const std::string& where);

  std::string fabric_, tag_, secret_, reach_;
  Handler handler_;
  int listen_fd_ = -1, wake_fd_ = -1;
  std::mutex mu_;
  bool stopping_ = false;
  bool crowded_ = false;  // connections are being dropped in their handshake (logged once)
  LogBudget failed_handshakes_{fabric_ + ": failed handshakes"};  // after fabric_ (declared first)
  LogBudget refused_{fabric_ + ": refused connections"};
  std::list<std::unique_ptr<Conn>> conns_;
  std::thread thread_;
};

}  // namespace rdmadev
