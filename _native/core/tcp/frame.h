// Wire format of the tcp fabric and the receiving side's frame loop, kept apart from the
// sockets so that the exact code that guards a region can be fuzzed from a byte buffer.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "../region.h"

namespace rdmadev {

enum FrameOp : uint16_t { kOpWrite = 1, kOpRead = 2, kOpReadResponse = 3 };
enum FrameFlags : uint16_t { kFlagSignal = 1 };
constexpr uint32_t kFrameMagic = 0x464d4452;  // "RDMF"

// Every frame starts with this 64-byte little-endian header; a WRITE carries `length`
// payload bytes after it. A READ_RESPONSE reuses `offset` as its status (0 = ok) and
// carries `length` bytes.
struct FrameHeader {
  uint32_t magic;
  uint16_t op;
  uint16_t flags;
  uint64_t region;
  uint64_t rkey;
  uint64_t offset;
  uint64_t length;
  uint64_t sig_off;
  uint64_t sig_seq;
  uint64_t sig_aux;
};
static_assert(sizeof(FrameHeader) == 64, "frame header is 64 bytes on the wire");

// Where a serving loop gets bytes from and sends replies to (a socket, or a buffer in tests).
class ByteStream {
 public:
  virtual ~ByteStream() = default;
  // Reads n bytes; returns how many arrived, fewer than n only when the stream ended or
  // failed first (the connection is then over). `next_frame`: the read waits for the start
  // of the next frame, which may be long in coming; otherwise the rest of a frame whose
  // header arrived, which is already on its way.
  virtual size_t Recv(void* dst, size_t n, bool next_frame) = 0;
  virtual bool SendAll(const void* a, size_t na, const void* b, size_t nb) = 0;
};

// Looks up a region by id: the live region, or null, with *retired set when the id named a
// region this side has since released (Domain::Find).
using RegionLookup = std::function<std::shared_ptr<Region>(uint64_t id, bool* retired)>;

// Checks one header from `peer` and returns "" if it may be applied, else why not;
// *region is set to the target region when found. A WRITE to a retired region passes with
// *region null and *late set: it was on its way when the region went (a receiving half
// unbound while its sender's last write was in flight), so its payload is dropped and the
// connection, which the pair's other channels share, carries on.
std::string CheckFrame(const FrameHeader& h, const std::string& peer, const RegionLookup& find,
                       std::shared_ptr<Region>* region, bool* late);

struct ServeResult {
  uint64_t frames = 0;     // frames applied
  std::string rejected;    // why the stream was cut ("" = clean end of stream)
};

// Applies frames until the stream ends or a frame is rejected. Never writes a byte outside
// a region granted to `peer`; never reads outside one either.
ServeResult ServeFrames(ByteStream& stream, const std::string& peer, const RegionLookup& find);

}  // namespace rdmadev
