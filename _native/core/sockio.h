// Deadline-bound TCP socket helpers shared by the fabrics that talk over TCP: the tcp
// fabric itself and the verbs fabric's connection-setup side channel.
#pragma once

#include <sys/socket.h>
#include <sys/uio.h>

#include <string>

#include "common.h"

namespace rdmadev {

// "host:port" (host may be "[v6]") split in two; throws kConfig naming `hp`.
void SplitHostPort(const std::string& hp, std::string* host, std::string* port);
// "a.b.c.d:port" or "[v6]:port" of a socket address.
std::string PeerText(const sockaddr_storage& ss);

// Listens on `listen` ("host:port", port 0 = any); returns the fd and sets *reach to the
// bound "host:port" a peer can dial. Throws kConfig/kFabric.
int ListenTcp(const std::string& listen, std::string* reach);
// Connects a non-blocking TCP socket (TCP_NODELAY) to "host:port" before the deadline.
int ConnectTcp(const std::string& host_port, const Deadline& deadline);

// Waits until `fd` is ready for `events` (poll flags); throws kTimeout at the deadline.
void WaitFd(int fd, short events, const Deadline& deadline, const std::string& peer);
// Sends every byte of iov[0..cnt) on a non-blocking socket; throws kPeerLost / kTimeout.
void SendFully(int fd, iovec* iov, int cnt, const Deadline& deadline, const std::string& peer);
// Receives exactly n bytes on a non-blocking socket; throws kPeerLost / kTimeout.
void RecvFully(int fd, void* dst, size_t n, const Deadline& deadline, const std::string& peer);

// True when a socket whose peer never speaks unprompted has become readable or hung up:
// the peer closed it or died.
bool PeerHungUp(int fd);

}  // namespace rdmadev
