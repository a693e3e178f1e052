// Mutual authentication of two tasks over a fresh TCP connection: each proves it knows the
// cluster secret (HMAC-SHA256 challenge-response, both directions) before anything else
// crosses. Used by the tcp fabric and by the verbs fabric's connection-setup side channel;
// `tag` ("rdmadev-tcp-v1", "rdmadev-verbs-v1") keeps a proof for one from passing as the other.
//
// Wire: server -> {u32 magic "RDMH", u32 version, 32-byte nonce Ns}
//       client -> {u16 name length, name, 32-byte nonce Nc, HMAC(tag " client|" Ns "|" Nc "|" name)}
//       server -> {u8 0 = accepted / 1 = refused, HMAC(tag " server|" Nc "|" Ns "|" name)}
#pragma once

#include <string>

#include "common.h"

namespace rdmadev {

// Seconds a peer may take to complete the handshake before it is dropped.
constexpr int kHandshakeSeconds = 10;

// The connecting side; throws kAuth / kProtocol / kPeerLost / kTimeout.
void ClientHandshake(int fd, const std::string& tag, const std::string& secret,
                     const std::string& name, const std::string& peer, const Deadline& deadline);

// The accepting side. Returns the peer's authenticated name ("?" if it sent none), or ""
// after logging (prefixed with `fabric`) why the peer was refused.
std::string ServerHandshake(int fd, const std::string& tag, const std::string& secret,
                            const std::string& where, const std::string& fabric);

}  // namespace rdmadev
