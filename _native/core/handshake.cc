#include "handshake.h"

#include <fcntl.h>

#include <cstring>

#include "region.h"
#include "sockio.h"

namespace rdmadev {
namespace {

constexpr uint32_t kHelloMagic = 0x48444d52;  // "RDMH"
constexpr uint32_t kHelloVersion = 1;
constexpr size_t kNonce = 32;     // bytes of challenge per side: the HMAC-SHA256 block of security
constexpr size_t kMaxName = 255;  // longest task name a peer may claim
constexpr size_t kReply = 1 + 32;  // accepted/refused byte + the server's proof

const char kSecretHint[] = "every task must share the same cluster secret (RDMADEV_SECRET)";

// Runs `fn` with `fd` non-blocking (so that every step is bound by the deadline), restoring
// the flags afterwards.
template <typename Fn>
auto NonBlocking(int fd, Fn fn) -> decltype(fn()) {
  int flags = fcntl(fd, F_GETFL);
  if (flags < 0) ThrowErrno(ErrorKind::kConfig, "Failed to use handshake socket", errno);
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

void Send(int fd, void* data, size_t n, const Deadline& deadline, const std::string& peer) {
  iovec iov[1] = {{data, n}};
  SendFully(fd, iov, 1, deadline, peer);
}

}  // namespace

Digest HandshakeProof(const std::string& tag, const std::string& role, const std::string& secret,
                      const std::string& first, const std::string& second,
                      const std::string& name) {
  return HmacSha256(secret, tag + " " + role + "|" + first + "|" + second + "|" + name);
}

void ClientHandshake(int fd, const std::string& tag, const std::string& secret,
                     const std::string& name_in, const std::string& peer, const Deadline& deadline) {
  RequireCrypto();
  NonBlocking(fd, [&]() -> int {
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
    Digest mac = HandshakeProof(tag, "client", secret, ns, nc, name);
    std::string msg;
    uint16_t nl = static_cast<uint16_t>(name.size());
    msg.append(reinterpret_cast<char*>(&nl), 2);
    msg += name + nc;
    msg.append(reinterpret_cast<char*>(mac.data()), mac.size());
    Send(fd, &msg[0], msg.size(), deadline, peer);
    uint8_t reply[kReply];
    try {
      RecvFully(fd, reply, sizeof reply, deadline, peer);
    } catch (const Error& e) {
      if (e.kind() == ErrorKind::kTimeout) throw;
      reply[0] = 1;  // a server that hangs up here refused us
    }
    if (reply[0] != 0) {
      throw Error(ErrorKind::kAuth, "Peer " + peer + " rejected this task's credentials", EACCES,
                  kSecretHint);
    }
    Digest got;
    std::memcpy(got.data(), reply + 1, got.size());
    if (!DigestEqual(HandshakeProof(tag, "server", secret, nc, ns, name), got)) {
      throw Error(ErrorKind::kAuth, "Peer " + peer + " failed authentication", EACCES, kSecretHint);
    }
    return 0;
  });
}

std::string AcceptHandshake(int fd, const std::string& tag, const std::string& secret,
                            const std::string& where, const Deadline& deadline) {
  RequireCrypto();
  return NonBlocking(fd, [&]() -> std::string {
    uint8_t hello[8 + kNonce];
    std::memcpy(hello, &kHelloMagic, 4);
    std::memcpy(hello + 4, &kHelloVersion, 4);
    RandomBytes(hello + 8, kNonce);
    std::string ns(reinterpret_cast<char*>(hello + 8), kNonce);
    Send(fd, hello, sizeof hello, deadline, where);
    uint16_t nl = 0;
    RecvFully(fd, &nl, 2, deadline, where);
    if (nl > kMaxName) {
      throw Error(ErrorKind::kProtocol, "Peer at " + where + " sent a malformed handshake (name of " +
                                            std::to_string(nl) + " bytes)",
                  0, "only rdmadev peers may connect to this port");
    }
    std::string name(nl, '\0'), nc(kNonce, '\0');
    Digest mac;
    if (nl) RecvFully(fd, &name[0], nl, deadline, where);
    RecvFully(fd, &nc[0], kNonce, deadline, where);
    RecvFully(fd, mac.data(), mac.size(), deadline, where);
    if (!DigestEqual(mac, HandshakeProof(tag, "client", secret, ns, nc, name))) {
      uint8_t no[kReply] = {1};
      try {
        Send(fd, no, sizeof no, deadline, where);
      } catch (const Error&) {
      }
      throw Error(ErrorKind::kAuth, "Peer at " + where + " (claiming '" + name +
                                        "') failed authentication: wrong cluster secret",
                  EACCES, kSecretHint);
    }
    Digest ours = HandshakeProof(tag, "server", secret, nc, ns, name);
    uint8_t yes[kReply] = {0};
    std::memcpy(yes + 1, ours.data(), ours.size());
    Send(fd, yes, sizeof yes, deadline, where);
    return name.empty() ? std::string("?") : name;
  });
}

}  // namespace rdmadev
