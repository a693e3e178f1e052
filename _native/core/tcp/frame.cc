#include "frame.h"

#include <algorithm>
#include <atomic>

namespace rdmadev {

namespace {
std::string Truncated(uint64_t length) {
  return "truncated frame: connection ended inside a " + std::to_string(length) + "-byte payload";
}
}  // namespace

std::string CheckFrame(const FrameHeader& h, const std::string& peer, const RegionLookup& find,
                       std::shared_ptr<Region>* region, bool* late) {
  if (h.magic != kFrameMagic) return "bad magic (not an rdmadev frame)";
  if (h.op != kOpWrite && h.op != kOpRead) return "unknown op " + std::to_string(h.op);
  if ((h.flags & ~uint16_t(kFlagSignal)) != 0) return "unknown flags " + std::to_string(h.flags);
  if (h.op == kOpRead && h.flags != 0) return "a READ cannot carry a signal";
  bool retired = false;
  *region = find(h.region, &retired);
  const Region* r = region->get();
  *late = false;
  if (!r && retired && h.op == kOpWrite) {
    *late = true;
    return "";
  }
  if (!r || r->closed()) return "no region " + std::to_string(h.region);
  if (h.rkey != r->desc().rkey) return "wrong key for region " + std::to_string(h.region);
  if (!r->Granted(peer)) return "region " + std::to_string(h.region) + " is not granted to it";
  if (!RangeInside(h.offset, h.length, r->size())) {
    return "range [" + std::to_string(h.offset) + ", +" + std::to_string(h.length) +
           ") outside region " + std::to_string(h.region) + " of " + std::to_string(r->size()) +
           " bytes";
  }
  if ((h.flags & kFlagSignal) && (h.sig_off % 8 != 0 || !RangeInside(h.sig_off, 16, r->size()))) {
    return "signal at " + std::to_string(h.sig_off) + " unaligned or outside region " +
           std::to_string(h.region);
  }
  return "";
}

ServeResult ServeFrames(ByteStream& stream, const std::string& peer, const RegionLookup& find) {
  ServeResult out;
  for (;;) {
    FrameHeader h;
    size_t got = stream.Recv(&h, sizeof h, /*next_frame=*/true);
    if (got == 0) return out;  // end of stream between frames: the peer left cleanly
    if (got < sizeof h) {
      out.rejected = "truncated frame: connection ended after " + std::to_string(got) + " of the " +
                     std::to_string(sizeof h) + " header bytes";
      return out;
    }
    std::shared_ptr<Region> region;  // keeps the memory mapped while we fill it
    bool late = false;
    std::string why = CheckFrame(h, peer, find, &region, &late);
    if (!why.empty()) {
      out.rejected = why;
      return out;
    }
    if (late) {  // its region is gone: read the payload past, apply nothing
      uint8_t sink[4096];
      for (uint64_t left = h.length; left > 0;) {
        size_t n = static_cast<size_t>(std::min<uint64_t>(left, sizeof sink));
        if (stream.Recv(sink, n, /*next_frame=*/false) < n) {
          out.rejected = Truncated(h.length);
          return out;
        }
        left -= n;
      }
      continue;
    }
    uint8_t* base = region->base();
    if (h.op == kOpWrite) {
      if (h.length && stream.Recv(base + h.offset, h.length, /*next_frame=*/false) < h.length) {
        out.rejected = Truncated(h.length);
        return out;
      }
      if (h.flags & kFlagSignal) {
        auto* words = reinterpret_cast<uint64_t*>(base + h.sig_off);
        __atomic_store_n(&words[1], h.sig_aux, __ATOMIC_RELAXED);
        __atomic_store_n(&words[0], h.sig_seq, __ATOMIC_RELEASE);
      }
    } else {
      FrameHeader resp{};
      resp.magic = kFrameMagic;
      resp.op = kOpReadResponse;
      resp.region = h.region;
      resp.length = h.length;
      __atomic_thread_fence(__ATOMIC_ACQUIRE);
      if (!stream.SendAll(&resp, sizeof resp, base + h.offset, h.length)) return out;
    }
    ++out.frames;
  }
}

}  // namespace rdmadev
