// Fuzz target "frames": the tcp fabric's serving side, ServeFrames (_native/core/tcp/frame.cc),
// the code every byte an authenticated peer sends reaches. Each input is the byte stream of one
// connection from peer "fuzzer", served against real regions (Region::Allocate, so in this
// AddressSanitizer build every byte outside a region's `size` is poisoned, guard pages included):
//   id 1  3001 bytes granted to "fuzzer"          id 2  100 bytes granted to someone else
//   id 3  retired (released: a late WRITE to it is read past and dropped)
//   id 4  0 bytes granted to any peer             id 5  64 bytes granted to "fuzzer", closed
//   id 6  20 bytes granted to "fuzzer" (its edges are in reach of short inputs)
//   id 0, 7 and up: never existed
// (sizes that are not multiples of 8 put an edge inside an ASan granule: still exact).
// To reach the paths behind the key check, a header whose rkey is below 8 has it replaced by
// the real key of region <rkey> when the stream hands the header to the parser (rkey 1 on
// region 1 is right, rkey 2 on region 1 is another region's key); the parser still sees a
// whole, real header.
//
// Oracles, after every input:
//  - AddressSanitizer / UBSan: no access outside a region, no undefined behaviour;
//  - a reference model of the protocol (frame.h, written here independently of CheckFrame)
//    run over the same input gives the same number of applied frames, the same clean end or
//    rejection, every region's bytes exactly (payloads and signals where accepted frames put
//    them, a truncated payload's bytes that arrived, nothing else: the regions not granted to
//    the peer byte-for-byte unchanged), and the same READ responses from the same addresses;
//  - every payload the parser receives goes inside a region granted to the peer, or off every
//    region (the sink of a late WRITE).
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "tcp/frame.h"
#include "oracle.h"

using namespace rdmadev;
using fuzz::Fail;

namespace {

constexpr char kPeer[] = "fuzzer";
// Ids below this were handed out: one of them that is not live (3) was released, as
// Domain::Find reports it.
constexpr uint64_t kNextId = 7;

struct Fixture {
  std::map<uint64_t, std::shared_ptr<Region>> live;
  Fixture() {
    auto add = [this](uint64_t id, uint64_t size, const char* peer) {
      auto r = Region::Allocate(id, size, "fuzz");
      r->Grant(peer);
      live[id] = r;
      return r.get();
    };
    add(1, 3001, kPeer);
    add(2, 100, "someone-else");
    add(4, 0, kAnyPeer);
    add(5, 64, kPeer)->Close();
    add(6, 20, kPeer);
  }
  // Every region's bytes as they are before each input.
  static std::string Initial(const Region& r) {
    std::string s(r.size(), '\0');
    for (size_t i = 0; i < s.size(); ++i) s[i] = static_cast<char>(r.id() * 37 + i * 131);
    return s;
  }
  void Reset() const {
    for (const auto& kv : live) {
      std::string s = Initial(*kv.second);
      std::memcpy(kv.second->base(), s.data(), s.size());
    }
  }
  std::shared_ptr<Region> Find(uint64_t id, bool* retired) const {
    auto it = live.find(id);
    *retired = it == live.end() && id != 0 && id < kNextId;
    return it == live.end() ? nullptr : it->second;
  }
  // The header as the parser gets it: a small rkey replaced by that region's real key.
  void Substitute(FrameHeader* h) const {
    auto it = live.find(h->rkey);
    if (h->rkey < 8 && it != live.end()) h->rkey = it->second->desc().rkey;
  }
  // Fails unless [p, p+n) lies inside the bytes of a live region granted to the peer, or
  // away from every region's mapping and guard pages (a local buffer).
  void CheckPayloadTarget(const uint8_t* p, size_t n) const {
    for (const auto& kv : live) {
      const Region* r = kv.second.get();
      const uint8_t* lo = r->base() - kPageSize;
      const uint8_t* hi = r->base() + RoundUp(r->size() ? r->size() : 1, kPageSize) + kPageSize;
      if (p >= hi || p + n <= lo) continue;
      if (p >= r->base() && p + n <= r->base() + r->size() && !r->closed() && r->Granted(kPeer)) {
        return;
      }
      Fail("a payload of " + std::to_string(n) + " bytes was received at offset " +
           std::to_string(p - r->base()) + " of region " + std::to_string(r->id()) + " (" +
           std::to_string(r->size()) + " bytes" + (r->Granted(kPeer) ? ")" : ", not granted)"));
    }
  }
};

struct Read {
  FrameHeader header;
  std::string bytes;
  const uint8_t* from;
};

// The parser's connection: the input as a socket would deliver it, READ responses recorded.
class TestStream : public ByteStream {
 public:
  TestStream(const Fixture& f, const uint8_t* data, size_t size)
      : f_(f), data_(data), size_(size) {}
  size_t Recv(void* dst, size_t n, bool next_frame) override {
    auto* p = static_cast<uint8_t*>(dst);
    size_t got = std::min(n, size_ - pos_);
    if (!next_frame) f_.CheckPayloadTarget(p, n);
    std::memcpy(p, data_ + pos_, got);
    pos_ += got;
    if (next_frame && n == sizeof(FrameHeader) && got == n) {
      f_.Substitute(static_cast<FrameHeader*>(dst));
    }
    return got;
  }
  bool SendAll(const void* a, size_t na, const void* b, size_t nb) override {
    if (na != sizeof(FrameHeader)) Fail("a READ response header of " + std::to_string(na));
    Read r;
    std::memcpy(&r.header, a, na);
    r.bytes.assign(static_cast<const char*>(b), nb);
    r.from = static_cast<const uint8_t*>(b);
    reads.push_back(r);
    return true;
  }
  std::vector<Read> reads;

 private:
  const Fixture& f_;
  const uint8_t* data_;
  size_t size_;
  size_t pos_ = 0;
};

// What the protocol says the input does (frame.h), computed on copies of the regions.
struct Expected {
  uint64_t frames = 0;
  bool clean = false;
  std::map<uint64_t, std::string> bytes;  // every region's bytes afterwards, by id
  std::vector<Read> reads;
};

Expected Model(const Fixture& f, const uint8_t* data, size_t size) {
  Expected e;
  for (const auto& kv : f.live) e.bytes[kv.first] = Fixture::Initial(*kv.second);
  size_t pos = 0;
  for (;;) {
    size_t left = size - pos;
    if (left == 0) {
      e.clean = true;
      return e;
    }
    if (left < sizeof(FrameHeader)) return e;
    FrameHeader h;
    std::memcpy(&h, data + pos, sizeof h);
    pos += sizeof h;
    left -= sizeof h;
    f.Substitute(&h);
    if (h.magic != kFrameMagic || (h.op != kOpWrite && h.op != kOpRead)) return e;
    if (h.flags > kFlagSignal || (h.op == kOpRead && h.flags)) return e;
    bool retired = false;
    auto region = f.Find(h.region, &retired);
    if (!region && retired && h.op == kOpWrite) {  // late: read past, nothing applied
      if (left < h.length) return e;
      pos += h.length;
      continue;
    }
    if (!region || region->closed() || h.rkey != region->desc().rkey ||
        !region->Granted(kPeer)) {
      return e;
    }
    const unsigned __int128 size_r = region->size();
    if (static_cast<unsigned __int128>(h.offset) + h.length > size_r) return e;
    bool sig = h.flags & kFlagSignal;
    if (sig && (h.sig_off % 8 || static_cast<unsigned __int128>(h.sig_off) + 16 > size_r)) return e;
    std::string& bytes = e.bytes[h.region];
    if (h.op == kOpWrite) {
      size_t n = static_cast<size_t>(std::min<uint64_t>(h.length, left));
      bytes.replace(h.offset, n, reinterpret_cast<const char*>(data + pos), n);
      pos += n;
      if (n < h.length) return e;  // truncated: what arrived stays, the stream is cut
      if (sig) {
        bytes.replace(h.sig_off, 8, reinterpret_cast<const char*>(&h.sig_seq), 8);
        bytes.replace(h.sig_off + 8, 8, reinterpret_cast<const char*>(&h.sig_aux), 8);
      }
    } else {
      Read r{};
      r.header.magic = kFrameMagic;
      r.header.op = kOpReadResponse;
      r.header.region = h.region;
      r.header.length = h.length;
      r.bytes = bytes.substr(h.offset, h.length);
      r.from = region->base() + h.offset;
      e.reads.push_back(r);
    }
    ++e.frames;
  }
}

const Fixture& TheFixture() {
  static const Fixture* f = new Fixture();  // lives for the whole run
  return *f;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const Fixture& f = TheFixture();
  f.Reset();
  Expected want = Model(f, data, size);
  TestStream stream(f, data, size);
  ServeResult got = ServeFrames(stream, kPeer, [&f](uint64_t id, bool* retired) {
    return f.Find(id, retired);
  });

  if (got.frames != want.frames) {
    Fail("applied " + std::to_string(got.frames) + " frames, the model " +
         std::to_string(want.frames) + " (rejected: '" + got.rejected + "')");
  }
  if (got.rejected.empty() != want.clean) {
    Fail(want.clean ? "rejected a valid stream: " + got.rejected : "accepted an invalid stream");
  }
  for (const auto& kv : f.live) {
    const Region& r = *kv.second;
    const std::string& w = want.bytes[kv.first];
    if (std::memcmp(r.base(), w.data(), w.size()) == 0) continue;
    size_t i = 0;
    while (r.base()[i] == static_cast<uint8_t>(w[i])) ++i;
    Fail("region " + std::to_string(r.id()) + (r.Granted(kPeer) ? "" : " (not granted)") +
         " differs from the model at byte " + std::to_string(i));
  }
  if (stream.reads.size() != want.reads.size()) Fail("READ responses differ in number");
  for (size_t i = 0; i < want.reads.size(); ++i) {
    const Read& a = stream.reads[i];
    const Read& b = want.reads[i];
    if (std::memcmp(&a.header, &b.header, sizeof a.header) != 0 || a.from != b.from ||
        a.bytes != b.bytes) {
      Fail("READ response " + std::to_string(i) + " differs from the model");
    }
  }
  return 0;
}
