// HMAC-SHA256 (RFC 2104 over FIPS 180-4), used only for the tcp fabric's handshake.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>

namespace rdmadev {

using Digest = std::array<uint8_t, 32>;

Digest Sha256(const void* data, size_t len);
Digest HmacSha256(const std::string& key, const std::string& message);
// Compares in time independent of where the inputs differ.
bool DigestEqual(const Digest& a, const Digest& b);

}  // namespace rdmadev
