#include "sockio.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <unistd.h>

namespace rdmadev {

void SplitHostPort(const std::string& hp, std::string* host, std::string* port) {
  size_t colon = hp.rfind(':');
  if (colon == std::string::npos || colon == 0 || colon + 1 == hp.size()) {
    throw Error(ErrorKind::kConfig, "Failed to parse tcp address '" + hp + "': expected host:port",
                0, "set RDMADEV_TCP_ADDR to host:port, e.g. 10.0.0.5:0");
  }
  *host = hp.substr(0, colon);
  *port = hp.substr(colon + 1);
  if (host->size() > 2 && host->front() == '[' && host->back() == ']') {
    *host = host->substr(1, host->size() - 2);
  }
}

std::string PeerText(const sockaddr_storage& ss) {
  char host[INET6_ADDRSTRLEN] = "?";
  int port = 0;
  if (ss.ss_family == AF_INET) {
    auto* a = reinterpret_cast<const sockaddr_in*>(&ss);
    inet_ntop(AF_INET, &a->sin_addr, host, sizeof host);
    port = ntohs(a->sin_port);
    return std::string(host) + ":" + std::to_string(port);
  }
  if (ss.ss_family == AF_INET6) {
    auto* a = reinterpret_cast<const sockaddr_in6*>(&ss);
    inet_ntop(AF_INET6, &a->sin6_addr, host, sizeof host);
    port = ntohs(a->sin6_port);
    return "[" + std::string(host) + "]:" + std::to_string(port);
  }
  return "?:0";
}

int ListenTcp(const std::string& listen, std::string* reach) {
  std::string host, port;
  SplitHostPort(listen, &host, &port);
  addrinfo hints{}, *res = nullptr;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE;
  int rc = getaddrinfo(host.c_str(), port.c_str(), &hints, &res);
  if (rc != 0) {
    throw Error(ErrorKind::kConfig, "Failed to resolve tcp listen address '" + listen +
                                        "': " + gai_strerror(rc),
                0, "set RDMADEV_TCP_ADDR to an address of this host");
  }
  int fd = socket(res->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
  int one = 1;
  if (fd >= 0) setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  if (fd < 0 || bind(fd, res->ai_addr, res->ai_addrlen) != 0 || ::listen(fd, 64) != 0) {
    int err = errno;
    freeaddrinfo(res);
    if (fd >= 0) close(fd);
    ThrowErrno(ErrorKind::kFabric, "Failed to listen on " + listen, err,
               "pick a free port or an address of this host in RDMADEV_TCP_ADDR");
  }
  freeaddrinfo(res);
  sockaddr_storage ss{};
  socklen_t len = sizeof ss;
  getsockname(fd, reinterpret_cast<sockaddr*>(&ss), &len);
  *reach = PeerText(ss);
  return fd;
}

int ConnectTcp(const std::string& host_port, const Deadline& deadline) {
  std::string host, port;
  SplitHostPort(host_port, &host, &port);
  addrinfo hints{}, *res = nullptr;
  hints.ai_socktype = SOCK_STREAM;
  int rc = getaddrinfo(host.c_str(), port.c_str(), &hints, &res);
  if (rc != 0) {
    throw Error(ErrorKind::kFabric, "Failed to resolve peer " + host_port + ": " + gai_strerror(rc));
  }
  int fd = socket(res->ai_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (fd < 0) {
    freeaddrinfo(res);
    ThrowErrno(ErrorKind::kFabric, "Failed to create socket", errno);
  }
  rc = connect(fd, res->ai_addr, res->ai_addrlen);
  freeaddrinfo(res);
  try {
    if (rc != 0 && errno != EINPROGRESS) {
      ThrowErrno(ErrorKind::kPeerLost, "Failed to connect to " + host_port, errno,
                 "the peer task is not running or not listening there");
    }
    WaitFd(fd, POLLOUT, deadline, host_port);
    int err = 0;
    socklen_t elen = sizeof err;
    getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &elen);
    if (err) {
      ThrowErrno(ErrorKind::kPeerLost, "Failed to connect to " + host_port, err,
                 "the peer task is not running or not listening there");
    }
  } catch (...) {
    close(fd);
    throw;
  }
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  return fd;
}

void WaitFd(int fd, short events, const Deadline& deadline, const std::string& peer) {
  for (;;) {
    pollfd p{fd, events, 0};
    int n = poll(&p, 1, deadline.remaining_ms(1000));
    if (n > 0) return;
    if (n < 0 && errno != EINTR) ThrowErrno(ErrorKind::kFabric, "Failed to poll socket", errno);
    if (deadline.passed()) {
      throw Error(ErrorKind::kTimeout, "Timed out on the tcp connection to " + peer, ETIMEDOUT,
                  "the peer is overloaded or unreachable; raise RDMADEV_DEADLINE_S");
    }
  }
}

void SendFully(int fd, iovec* iov, int cnt, const Deadline& deadline, const std::string& peer) {
  int first = 0;
  while (first < cnt) {
    msghdr m{};
    m.msg_iov = iov + first;
    m.msg_iovlen = cnt - first;
    ssize_t sent = sendmsg(fd, &m, MSG_NOSIGNAL);
    if (sent < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN) {
        WaitFd(fd, POLLOUT, deadline, peer);
        continue;
      }
      ThrowErrno(ErrorKind::kPeerLost, "Failed to send to " + peer, errno,
                 "the peer task died or closed the connection");
    }
    size_t left = static_cast<size_t>(sent);
    while (first < cnt && left >= iov[first].iov_len) left -= iov[first++].iov_len;
    if (first < cnt) {
      iov[first].iov_base = static_cast<uint8_t*>(iov[first].iov_base) + left;
      iov[first].iov_len -= left;
    }
  }
}

void RecvFully(int fd, void* dst, size_t n, const Deadline& deadline, const std::string& peer) {
  auto* p = static_cast<uint8_t*>(dst);
  while (n > 0) {
    ssize_t got = recv(fd, p, n, 0);
    if (got > 0) {
      p += got;
      n -= static_cast<size_t>(got);
    } else if (got == 0) {
      throw Error(ErrorKind::kPeerLost, "Connection to " + peer + " closed by the peer",
                  ECONNRESET, "the peer task died, or rejected a request (see its log)");
    } else if (errno == EAGAIN) {
      WaitFd(fd, POLLIN, deadline, peer);
    } else if (errno != EINTR) {
      ThrowErrno(ErrorKind::kPeerLost, "Failed to receive from " + peer, errno,
                 "the peer task died or closed the connection");
    }
  }
}

bool PeerHungUp(int fd) {
  pollfd p{fd, POLLIN | POLLRDHUP, 0};
  return poll(&p, 1, 0) > 0 && (p.revents & (POLLIN | POLLRDHUP | POLLHUP | POLLERR));
}

}  // namespace rdmadev
