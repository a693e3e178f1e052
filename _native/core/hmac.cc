#include "hmac.h"

#include <dlfcn.h>

#include "common.h"

namespace rdmadev {
namespace {

// The three libcrypto functions used, as documented in OpenSSL's HMAC(3), EVP_sha256(3) and
// CRYPTO_memcmp(3). The signatures are the same in OpenSSL 1.1 and 3.x; the EVP_MD is
// opaque here, so no header is needed.
struct CryptoLib {
  const void* (*evp_sha256)();
  unsigned char* (*hmac)(const void* md, const void* key, int key_len, const unsigned char* data,
                         size_t data_len, unsigned char* out, unsigned int* out_len);
  int (*memcmp)(const void* a, const void* b, size_t len);
  std::string why;  // empty once loaded
};

// Sonames tried in order: OpenSSL 3 (Debian/Ubuntu libssl3 / libssl3t64, RHEL 9), then 1.1.
constexpr const char* kSonames[] = {"libcrypto.so.3", "libcrypto.so.1.1"};

CryptoLib Load() {
  CryptoLib lib{};
  void* h = nullptr;
  std::string tried;
  for (const char* so : kSonames) {
    h = dlopen(so, RTLD_NOW | RTLD_LOCAL);
    if (h) break;
    const char* e = dlerror();
    tried += std::string(tried.empty() ? "" : "; ") + (e ? e : so);
  }
  if (!h) {
    lib.why = "OpenSSL's libcrypto (libcrypto.so.3) could not be loaded: " + tried;
    return lib;
  }
  lib.evp_sha256 = reinterpret_cast<const void* (*)()>(dlsym(h, "EVP_sha256"));
  lib.hmac = reinterpret_cast<decltype(lib.hmac)>(dlsym(h, "HMAC"));
  lib.memcmp = reinterpret_cast<decltype(lib.memcmp)>(dlsym(h, "CRYPTO_memcmp"));
  if (!lib.evp_sha256 || !lib.hmac || !lib.memcmp) {
    lib.why = "libcrypto lacks EVP_sha256, HMAC or CRYPTO_memcmp";
  }
  return lib;  // the handle is never closed: the table lives as long as the process
}

const CryptoLib& Lib() {
  static const CryptoLib lib = Load();  // loaded once, thread-safe (C++11 statics)
  return lib;
}

}  // namespace

void RequireCrypto() {
  const CryptoLib& lib = Lib();
  if (!lib.why.empty()) {
    throw Error(ErrorKind::kConfig,
                "Failed to authenticate peers: " + lib.why, 0,
                "install OpenSSL's libcrypto 3 (apt-get install libssl3, or libssl3t64 on "
                "Ubuntu 24.04+; dnf install openssl-libs)");
  }
}

Digest HmacSha256(const std::string& key, const std::string& message) {
  RequireCrypto();
  const CryptoLib& lib = Lib();
  Digest out{};
  unsigned int len = 0;
  if (!lib.hmac(lib.evp_sha256(), key.data(), static_cast<int>(key.size()),
                reinterpret_cast<const unsigned char*>(message.data()), message.size(),
                out.data(), &len) ||
      len != out.size()) {
    throw Error(ErrorKind::kConfig, "Failed to compute HMAC-SHA256 with libcrypto", 0,
                "check the installed OpenSSL (libcrypto.so.3)");
  }
  return out;
}

bool DigestEqual(const Digest& a, const Digest& b) {
  RequireCrypto();
  return Lib().memcmp(a.data(), b.data(), a.size()) == 0;
}

}  // namespace rdmadev
