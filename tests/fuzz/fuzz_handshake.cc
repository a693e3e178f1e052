// Fuzz target "handshake": rdmadev's one handshake (_native/core/handshake.cc), the first
// thing any connection to a tcp fabric, a verbs side channel or the control service reaches,
// before the peer has proved anything. The first input byte chooses:
//   bit 0      role: 0 = AcceptHandshake fed the rest as the client's messages,
//                    1 = ClientHandshake fed the rest as the server's
//   bits 1-2   tag: "rdmadev-tcp-v1", "rdmadev-control-v1", "rdmadev-verbs-v1"
//   bit 3      put the right proof in (see below)
//   bit 4      the fuzzing side closes its socket once it has written (sends then fail)
//   bits 5-6   the client's name (ClientHandshake): "worker:0", "", 300 bytes, odd bytes
// The rest is written to the other end of a socketpair, which is then shut for writing.
//
// The nonces this side draws are fixed (RandomBytes is defined here, not taken from
// region.cc), so the harness knows them; with bit 3 set it overwrites the proof field of the
// input (when the input is long enough to have one) with the right HMAC, so the paths past
// the proof check are reached too. A handshake can therefore only pass with bit 3 set (or a
// forged HMAC-SHA256).
//
// Oracles (besides AddressSanitizer and UBSan): a model of the protocol (handshake.h) over the
// same bytes says how it must end, and it ends so: the authenticated name returned (server) or
// a return (client) only for the right proof; otherwise kAuth, kProtocol or kPeerLost as the
// model says, never another kind, another exception, or a hang (the deadline is 2 s, the
// input is all there or the stream has ended). What the harness side then reads back is what
// the protocol says the handshake sent: the hello, and the acceptance with the right proof
// or the refusal with 32 zero bytes (server); the name, nonce and right proof (client).
#include <sys/socket.h>
#include <unistd.h>

#include <cstring>

#include "handshake.h"
#include "region.h"
#include "oracle.h"

using namespace rdmadev;
using fuzz::Fail;
using fuzz::KindName;

namespace rdmadev {
// This side's nonces: a fixed pattern (the harness must know them to forge proofs).
void RandomBytes(void* dst, size_t n) {
  auto* p = static_cast<uint8_t*>(dst);
  for (size_t i = 0; i < n; ++i) p[i] = static_cast<uint8_t>(0xa5 ^ i);
}
}  // namespace rdmadev

namespace {

constexpr char kSecret[] = "rdmadev-fuzz-secret";
const char* const kTags[] = {"rdmadev-tcp-v1", "rdmadev-control-v1", "rdmadev-verbs-v1",
                             "rdmadev-tcp-v1"};
constexpr uint32_t kMagic = 0x48444d52;
constexpr size_t kNonce = 32, kMaxName = 255;
constexpr size_t kMaxInput = 16 * 1024;  // the socketpair's buffer takes it without blocking

std::string OurNonce() {
  std::string n(kNonce, '\0');
  RandomBytes(&n[0], kNonce);
  return n;
}

std::string Str(const Digest& d) {
  return std::string(reinterpret_cast<const char*>(d.data()), d.size());
}

std::string ClientName(int pick) {
  switch (pick) {
    case 0: return "worker:0";
    case 1: return "";
    case 2: return std::string(300, 'w');  // sent as its first 255 bytes
    default: return std::string("\xff\x00\n\x1b[2Jps:1", 11);  // NUL, newline, escape
  }
}

// Reads what the handshake sent to the harness's end (non-blocking: it is all there).
std::string Drain(int fd) {
  std::string out;
  char buf[4096];
  ssize_t n;
  while ((n = read(fd, buf, sizeof buf)) > 0) out.append(buf, static_cast<size_t>(n));
  return out;
}

// Runs one side; returns "" when it passed, else the error kind's name.
template <typename Fn>
std::string Outcome(Fn fn) {
  try {
    fn();
    return "";
  } catch (const Error& e) {
    return KindName(e.kind());
  } catch (const std::exception& e) {
    Fail(std::string("a non-rdmadev exception: ") + e.what());
  }
}

void Check(const std::string& got, const std::string& want, const std::string& what) {
  if (got != want) {
    Fail(what + " " + (got.empty() ? "passed" : "ended in " + got) + ", the model says " +
         (want.empty() ? "it passes" : want));
  }
}

// AcceptHandshake against `in` as the client's bytes.
void FuzzServer(const std::string& tag, std::string in, bool forge, bool hang_up, int sv[2]) {
  const std::string ns = OurNonce();
  // The client's message: u16 name length, name, nonce, proof.
  uint16_t nl = 0;
  if (in.size() >= 2) std::memcpy(&nl, in.data(), 2);
  const size_t proof_at = 2 + nl + kNonce, end = proof_at + 32;
  const bool whole = in.size() >= end && nl <= kMaxName;
  std::string name = whole ? in.substr(2, nl) : "", nc = whole ? in.substr(2 + nl, kNonce) : "";
  const std::string right = whole ? Str(HandshakeProof(tag, "client", kSecret, ns, nc, name)) : "";
  if (whole && forge) in.replace(proof_at, 32, right);
  const bool proved = whole && in.compare(proof_at, 32, right) == 0;

  if (!in.empty() && write(sv[1], in.data(), in.size()) != static_cast<ssize_t>(in.size())) {
    Fail("short write");
  }
  shutdown(sv[1], SHUT_WR);
  if (hang_up) close(sv[1]);
  std::string got_name;
  std::string got = Outcome([&] {
    got_name = AcceptHandshake(sv[0], tag, kSecret, "fuzz-client:1", Deadline::After(2));
  });
  std::string want;
  if (hang_up) want = "peer_lost";  // the hello cannot be sent
  else if (in.size() < 2) want = "peer_lost";
  else if (nl > kMaxName) want = "protocol";
  else if (!whole) want = "peer_lost";
  else if (!proved) want = "auth";
  Check(got, want, "AcceptHandshake");
  if (want.empty() && got_name != (name.empty() ? "?" : name)) {
    Fail("AcceptHandshake returned another name than the client sent");
  }
  if (hang_up) return;
  // What the server sent: its hello, then (once the whole message was read) its answer.
  std::string sent = Drain(sv[1]), hello(8, '\0');
  uint32_t version = 1;
  std::memcpy(&hello[0], &kMagic, 4);
  std::memcpy(&hello[4], &version, 4);
  hello += ns;
  if (whole) {
    hello += proved ? '\0' + Str(HandshakeProof(tag, "server", kSecret, nc, ns, name))
                    : '\1' + std::string(32, '\0');
  }
  if (sent != hello) Fail("AcceptHandshake sent other bytes than the protocol says");
}

// ClientHandshake against `in` as the server's bytes.
void FuzzClient(const std::string& tag, std::string in, bool forge, bool hang_up,
                const std::string& name_in, int sv[2]) {
  const std::string nc = OurNonce(), name = name_in.substr(0, kMaxName);
  uint32_t magic = 0, version = 0;
  if (in.size() >= 8) {
    std::memcpy(&magic, in.data(), 4);
    std::memcpy(&version, in.data() + 4, 4);
  }
  const bool hello = in.size() >= 8 + kNonce, ours = magic == kMagic && version == 1;
  const std::string ns = hello ? in.substr(8, kNonce) : "";
  const size_t reply_at = 8 + kNonce, end = reply_at + 1 + 32;
  const std::string right = hello ? Str(HandshakeProof(tag, "server", kSecret, nc, ns, name)) : "";
  if (forge && in.size() >= end) in.replace(reply_at + 1, 32, right);
  const bool proved =
      in.size() >= end && in[reply_at] == 0 && in.compare(reply_at + 1, 32, right) == 0;

  if (!in.empty() && write(sv[1], in.data(), in.size()) != static_cast<ssize_t>(in.size())) {
    Fail("short write");
  }
  shutdown(sv[1], SHUT_WR);
  if (hang_up) close(sv[1]);
  std::string got = Outcome([&] {
    ClientHandshake(sv[0], tag, kSecret, name_in, "fuzz-server:1", Deadline::After(2));
  });
  std::string want;
  if (!hello) want = "peer_lost";
  else if (!ours) want = "protocol";
  else if (hang_up) want = "peer_lost";  // its message cannot be sent
  else if (!proved) want = "auth";       // a refusal, a wrong proof, or a server that hung up
  Check(got, want, "ClientHandshake");
  if (hang_up || !hello || !ours) return;
  // What the client sent: its name, nonce and proof.
  uint16_t nl = static_cast<uint16_t>(name.size());
  std::string msg(reinterpret_cast<const char*>(&nl), 2);
  msg += name + nc + Str(HandshakeProof(tag, "client", kSecret, ns, nc, name));
  if (Drain(sv[1]) != msg) Fail("ClientHandshake sent other bytes than the protocol says");
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const uint8_t mode = data[0];
  const std::string tag = kTags[(mode >> 1) & 3];
  const bool forge = mode & 8, hang_up = mode & 16;
  std::string in(reinterpret_cast<const char*>(data + 1), std::min(size - 1, kMaxInput));
  int sv[2];
  if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0, sv) != 0) {
    Fail("socketpair failed");
  }
  if (mode & 1) {
    FuzzClient(tag, in, forge, hang_up, ClientName((mode >> 5) & 3), sv);
  } else {
    FuzzServer(tag, in, forge, hang_up, sv);
  }
  close(sv[0]);
  if (!hang_up) close(sv[1]);
  return 0;
}
