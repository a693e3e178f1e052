// Mutual authentication of two tasks over a fresh TCP connection: each proves it knows the
// cluster secret (HMAC-SHA256 challenge-response, both directions) before anything else
// crosses. The one handshake of rdmadev: used by the tcp fabric, the verbs fabric's
// connection-setup side channel, and (through rdmadev._core.client_handshake /
// server_handshake) the Python control service. `tag` ("rdmadev-tcp-v1", "rdmadev-verbs-v1",
// "rdmadev-control-v1") keeps a proof for one service from passing as another.
//
// Protocol definition (version 1; integers little-endian):
//   server -> client  {u32 magic 0x48444d52 ("RDMH"), u32 version 1, 32-byte nonce Ns}
//   client -> server  {u16 name length (<= 255), name, 32-byte nonce Nc,
//                      32-byte proof HMAC-SHA256(secret, tag " client|" Ns "|" Nc "|" name)}
//   server -> client  {u8 0 = accepted / 1 = refused,
//                      32-byte proof HMAC-SHA256(secret, tag " server|" Nc "|" Ns "|" name)}
//                     (a refusal carries 32 zero bytes)
// The client checks the server's proof, so neither side can be impersonated without the
// secret, and fresh nonces on both sides make a recorded exchange useless.
//
// Known answer (checked by tests/test_handshake.py): secret "rdmadev-test-secret", tag
// "rdmadev-control-v1", Ns = bytes 0..31, Nc = bytes 32..63, name "worker:0" give
//   client proof eea03600fd74c617be9ae68442d89ee6dcc5702fc61968d442671d6b37c641b8
//   server proof e14ec8bd816da8cdaf0762c2e350c0427dd5f4824265b90905ba25c1c9bf62b2
#pragma once

#include <string>

#include "common.h"
#include "hmac.h"

namespace rdmadev {

// Seconds a peer may take to complete the whole handshake before the fabrics drop it.
constexpr int kHandshakeSeconds = 10;

// The proof of `role` ("client" or "server"): HMAC-SHA256(secret, tag " " role "|" first "|"
// second "|" name), with (first, second) = (Ns, Nc) for the client and (Nc, Ns) for the server.
Digest HandshakeProof(const std::string& tag, const std::string& role, const std::string& secret,
                      const std::string& first, const std::string& second,
                      const std::string& name);

// The connecting side. The deadline bounds the whole exchange. Throws kAuth / kProtocol /
// kPeerLost / kTimeout (and kConfig without libcrypto).
void ClientHandshake(int fd, const std::string& tag, const std::string& secret,
                     const std::string& name, const std::string& peer, const Deadline& deadline);

// The accepting side, throwing like ClientHandshake. Returns the peer's authenticated name
// ("?" if it sent none). A peer with the wrong secret is told so before kAuth is thrown.
std::string AcceptHandshake(int fd, const std::string& tag, const std::string& secret,
                            const std::string& where, const Deadline& deadline);

}  // namespace rdmadev
