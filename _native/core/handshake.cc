#include "handshake.h"

#include <fcntl.h>

#include <cstring>

#include "hmac.h"
#include "region.h"
#include "sockio.h"

namespace rdmadev {
namespace {

constexpr uint32_t kHelloMagic = 0x48444d52;  // "RDMH"
constexpr uint32_t kHelloVersion = 1;
constexpr size_t kNonce = 32;     // bytes of challenge per side: the HMAC-SHA256 block of security
constexpr size_t kMaxName = 255;  // longest task name a peer may claim

std::string Tagged(const std::string& tag, const char* role, const std::string& a,
                   const std::string& b, const std::string& name) {
  return tag + " " + role + "|" + a + "|" + b + "|" + name;
}

// Runs `fn` with `fd` non-blocking (so that every step is bound by a deadline), restoring
// the flags afterwards.
template <typename Fn>
auto NonBlocking(int fd, Fn fn) -> decltype(fn()) {
  int flags = fcntl(fd, F_GETFL);
  fcntl(fd, F_SETFL, flags | O_NONBLOCK);
  try {
    auto r = fn();
    fcntl(fd, F_SETFL, flags);
    return r;
  } catch (...) {
    fcntl(fd, F_SETFL, flags);
    throw;
  }
}

}  // namespace

void ClientHandshake(int fd, const std::string& tag, const std::string& secret,
                     const std::string& name_in, const std::string& peer, const Deadline& deadline) {
  uint8_t hello[8 + kNonce];
  RecvFully(fd, hello, sizeof hello, deadline, peer);
  uint32_t magic, version;
  std::memcpy(&magic, hello, 4);
  std::memcpy(&version, hello + 4, 4);
  if (magic != kHelloMagic || version != kHelloVersion) {
    throw Error(ErrorKind::kProtocol, "Peer " + peer + " is not an rdmadev peer (handshake v" +
                                          std::to_string(kHelloVersion) + ")",
                0, "check the peer address and run the same rdmadev version everywhere");
  }
  std::string ns(reinterpret_cast<char*>(hello + 8), kNonce), nc(kNonce, '\0');
  RandomBytes(&nc[0], kNonce);
  std::string name = name_in.substr(0, kMaxName);
  Digest mac = HmacSha256(secret, Tagged(tag, "client", ns, nc, name));
  std::string msg;
  uint16_t nl = static_cast<uint16_t>(name.size());
  msg.append(reinterpret_cast<char*>(&nl), 2);
  msg += name + nc;
  msg.append(reinterpret_cast<char*>(mac.data()), mac.size());
  iovec iov[1] = {{&msg[0], msg.size()}};
  SendFully(fd, iov, 1, deadline, peer);
  uint8_t reply[1 + 32];
  try {
    RecvFully(fd, reply, sizeof reply, deadline, peer);
  } catch (const Error& e) {
    if (e.kind() == ErrorKind::kTimeout) throw;
    reply[0] = 1;  // a server that hangs up here refused us
  }
  if (reply[0] != 0) {
    throw Error(ErrorKind::kAuth, "Peer " + peer + " rejected this task's credentials", EACCES,
                "every task must share the same cluster secret (RDMADEV_SECRET)");
  }
  Digest expect = HmacSha256(secret, Tagged(tag, "server", nc, ns, name)), got;
  std::memcpy(got.data(), reply + 1, 32);
  if (!DigestEqual(expect, got)) {
    throw Error(ErrorKind::kAuth, "Peer " + peer + " failed authentication", EACCES,
                "every task must share the same cluster secret (RDMADEV_SECRET)");
  }
}

std::string ServerHandshake(int fd, const std::string& tag, const std::string& secret,
                            const std::string& where, const std::string& fabric) {
  Deadline deadline = Deadline::After(kHandshakeSeconds);
  try {
    return NonBlocking(fd, [&]() -> std::string {
      uint8_t hello[8 + kNonce];
      std::memcpy(hello, &kHelloMagic, 4);
      std::memcpy(hello + 4, &kHelloVersion, 4);
      RandomBytes(hello + 8, kNonce);
      std::string ns(reinterpret_cast<char*>(hello + 8), kNonce);
      iovec iov[1] = {{hello, sizeof hello}};
      SendFully(fd, iov, 1, deadline, where);
      uint16_t nl = 0;
      RecvFully(fd, &nl, 2, deadline, where);
      if (nl > kMaxName) {
        LogEvent(fabric + ": peer at " + where + " sent a malformed handshake; disconnected");
        return "";
      }
      std::string name(nl, '\0'), nc(kNonce, '\0');
      Digest mac;
      if (nl) RecvFully(fd, &name[0], nl, deadline, where);
      RecvFully(fd, &nc[0], kNonce, deadline, where);
      RecvFully(fd, mac.data(), mac.size(), deadline, where);
      if (!DigestEqual(mac, HmacSha256(secret, Tagged(tag, "client", ns, nc, name)))) {
        uint8_t no[1 + 32] = {1};
        iovec nv[1] = {{no, sizeof no}};
        try {
          SendFully(fd, nv, 1, deadline, where);
        } catch (const Error&) {
        }
        LogEvent(fabric + ": peer at " + where + " (claiming '" + name +
                 "') failed authentication: wrong cluster secret; disconnected");
        return "";
      }
      Digest ours = HmacSha256(secret, Tagged(tag, "server", nc, ns, name));
      uint8_t yes[1 + 32] = {0};
      std::memcpy(yes + 1, ours.data(), 32);
      iovec yv[1] = {{yes, sizeof yes}};
      SendFully(fd, yv, 1, deadline, where);
      return name.empty() ? std::string("?") : name;
    });
  } catch (const Error& e) {
    LogEvent(fabric + ": peer at " + where + " sent a truncated handshake (" + e.what() +
             "); disconnected");
    return "";
  }
}

}  // namespace rdmadev
