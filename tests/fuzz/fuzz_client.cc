// Fuzz target "client": what the connecting side of the tcp fabric parses from a peer.
// The first input byte picks what the rest is:
//  even: the serving peer's answer to one READ (TcpEndpoint::Read in tcp/tcp.cc, reached by
//        including tcp.cc here: the endpoint class is internal to it). Two more bytes choose
//        the read's offset and length (within a 4096-byte remote region); the rest is written
//        to the other end of a socketpair that is then shut for writing, as a peer that sent
//        it and stopped would leave it.
//  odd:  a region descriptor a peer hands over (RegionDesc::Decode, region.cc).
//
// Oracles (besides AddressSanitizer and UBSan):
//  - READ: a READ outside the remote region throws kBounds before anything is sent; else
//    the request the endpoint sent is the READ asked for, and Read returns only when the
//    answer starts with a whole READ_RESPONSE header (magic, op, the read's region and
//    length, status 0: frame.h's `offset`) followed by `length` bytes, and then the
//    destination holds exactly those bytes (it is allocated at exactly `length` bytes, so
//    writing past it is caught); otherwise it throws kProtocol for a malformed header and
//    kPeerLost for an answer cut short, nothing else.
//  - Decode: only kProtocol is thrown, exactly for a record that is not 80 bytes with the
//    magic and version; a decoded descriptor encodes back to the same bytes (the reserved
//    ones as zeros).
#include <sys/socket.h>
#include <unistd.h>

#include <cstring>
#include <vector>

#include "tcp/tcp.cc"
#include "oracle.h"

using namespace rdmadev;
using fuzz::Fail;
using fuzz::KindName;

namespace {

constexpr uint64_t kRemoteSize = 4096;
constexpr uint64_t kRemoteId = 7;
constexpr uint64_t kRemoteKey = 0x6b6579206b657921;
// At most this much of an answer is written (the largest that matters is 64 + 4335 bytes):
// the socketpair's buffer takes it without blocking.
constexpr size_t kMaxAnswer = 16 * 1024;

void FuzzRead(const uint8_t* data, size_t size) {
  if (size < 2) return;
  const uint64_t roff = data[0] * 16;  // 0..4080
  const uint64_t len = data[1] * 17;   // 0..4335: past the end for some offsets
  data += 2;
  size = std::min(size - 2, kMaxAnswer);
  int sv[2];
  if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0, sv) != 0) {
    Fail("socketpair failed");
  }
  if (size && write(sv[1], data, size) != static_cast<ssize_t>(size)) Fail("short write");
  shutdown(sv[1], SHUT_WR);

  RegionDesc desc;
  desc.id = kRemoteId;
  desc.size = kRemoteSize;
  desc.rkey = kRemoteKey;
  RemoteRegion remote(desc);
  // Exactly `len` bytes on the heap (at least one, so the pointer is real).
  std::vector<uint8_t> dst(len ? len : 1, 0xee);
  std::string kind;
  {
    TcpEndpoint ep(sv[0], "fuzz-peer:1");  // owns and closes sv[0]
    try {
      ep.Read(remote, roff, dst.data(), len, Deadline::After(5));
    } catch (const Error& e) {
      kind = KindName(e.kind());
    } catch (const std::exception& e) {
      Fail(std::string("Read threw a non-rdmadev exception: ") + e.what());
    }
  }
  const bool in_range = RangeInside(roff, len, kRemoteSize);
  std::string want;
  FrameHeader resp{};
  if (size >= sizeof resp) std::memcpy(&resp, data, sizeof resp);
  if (!in_range) {
    want = "bounds";  // checked before anything is sent
  } else if (size < sizeof resp) {
    want = "peer_lost";
  } else if (resp.magic != kFrameMagic || resp.op != kOpReadResponse || resp.length != len ||
             resp.region != kRemoteId || resp.offset != 0) {
    want = "protocol";
  } else if (size < sizeof resp + len) {
    want = "peer_lost";
  }
  if (kind != want) {
    Fail("Read of [" + std::to_string(roff) + ", +" + std::to_string(len) + ") over a " +
         std::to_string(size) + "-byte answer " + (kind.empty() ? "returned" : "threw " + kind) +
         ", expected " + (want.empty() ? "a return" : want));
  }
  if (want.empty() && len && std::memcmp(dst.data(), data + sizeof resp, len) != 0) {
    Fail("Read returned bytes other than the response's payload");
  }
  // The request on the wire.
  FrameHeader req{};
  ssize_t n = read(sv[1], &req, sizeof req);
  if (!in_range) {
    if (n > 0) Fail("an out-of-range READ was sent");
  } else if (n != static_cast<ssize_t>(sizeof req) || req.magic != kFrameMagic ||
             req.op != kOpRead || req.flags != 0 || req.region != kRemoteId ||
             req.rkey != kRemoteKey || req.offset != roff || req.length != len) {
    Fail("the READ request sent is not the one asked for");
  }
  close(sv[1]);
}

void FuzzDecode(const uint8_t* data, size_t size) {
  std::string in(reinterpret_cast<const char*>(data), size);
  uint32_t magic = 0, version = 0;
  if (size >= 8) {
    std::memcpy(&magic, data, 4);
    std::memcpy(&version, data + 4, 4);
  }
  const bool valid = size == RegionDesc::kEncodedSize && magic == 0x524d4452 && version == 3;
  try {
    RegionDesc d = RegionDesc::Decode(in);
    if (!valid) Fail("Decode accepted a record that is not a version-3 descriptor");
    std::string want = in;
    std::memset(&want[68], 0, 4);  // reserved: encoded as zeros
    if (d.Encode() != want) Fail("a decoded descriptor does not encode back to its bytes");
  } catch (const Error& e) {
    if (e.kind() != ErrorKind::kProtocol || valid) {
      Fail("Decode threw " + KindName(e.kind()) + ": " + e.what());
    }
  } catch (const std::exception& e) {
    Fail(std::string("Decode threw a non-rdmadev exception: ") + e.what());
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  if (data[0] % 2 == 0) {
    FuzzRead(data + 1, size - 1);
  } else {
    FuzzDecode(data + 1, size - 1);
  }
  return 0;
}
