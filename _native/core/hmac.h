// HMAC-SHA256 from OpenSSL's libcrypto, loaded at run time (dlopen, like verbs/ibv_lib.h
// loads libibverbs): rdmadev has no build-time dependency on OpenSSL's headers, and
// `import rdmadev` works without libcrypto; only authenticated fabrics then fail to open,
// with an error naming the library and the package that provides it.
#pragma once

#include <array>
#include <cstdint>
#include <string>

namespace rdmadev {

using Digest = std::array<uint8_t, 32>;

// HMAC-SHA256 (RFC 2104, FIPS 180-4) of `message` under `key`. Throws kConfig if libcrypto
// cannot be loaded.
Digest HmacSha256(const std::string& key, const std::string& message);
// Compares in time independent of where the inputs differ (CRYPTO_memcmp).
bool DigestEqual(const Digest& a, const Digest& b);
// Loads libcrypto now; throws kConfig naming the library and the fix if it cannot.
void RequireCrypto();

}  // namespace rdmadev
