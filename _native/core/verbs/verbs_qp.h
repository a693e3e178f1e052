// Reliable-connected queue pairs: creation, the INIT -> RTR -> RTS walk, and the record two
// tasks swap over the side channel to connect a pair.
#pragma once

#include <cstdint>
#include <memory>

#include "verbs_device.h"

namespace rdmadev {

#if RDMADEV_HAVE_VERBS

// The local ACK timeout: 4.096 us * 2^16 = 268 ms by default (RDMADEV_ACK_TIMEOUT sets the
// exponent), retried kQpRetryCount times, so a peer that vanished (its QP destroyed, its host down)
// fails the outstanding request with IBV_WC_RETRY_EXC_ERR after (1 + 6) * 268 ms ~= 1.9 s: "within
// seconds", and 268 ms is far above an ACK's round trip on a NIC, where the hardware answers.
// Soft-RoCE (rxe) answers from the peer's kernel instead (ib_write_lat on rxe in a TCG guest on a
// loaded 2-core host: 14 us typical, 9.4 ms at the 99.9th percentile), and on a loaded host its
// ACKs can come later still than 268 ms: every timeout then resends the whole unacknowledged window
// (go-back-N), which loads the peer further: in the two-guest Soft-RoCE tier (TCG guests on a
// loaded 2-core host) a write once saw 65 retransmissions in 30 s and never completed
// (docs/testing.md). RDMADEV_ACK_TIMEOUT raises it there. A peer process that dies is seen sooner,
// through its side-channel socket (see verbs.cc); the retries catch a peer whose host or link went
// silent.
constexpr uint8_t kQpTimeout = 16;
// 6, not 7: rxe reads a retry count of 7 as "retry forever" (as the IB spec has it for the
// RNR retry count only), so a write whose ACKs never came waited out the whole transfer
// deadline instead of failing in seconds.
constexpr uint8_t kQpRetryCount = 6;
// RNR retries never happen (no SEND/receive is used) but the field must be set: 7 = forever
// would be wrong if one did, so keep it finite.
constexpr uint8_t kQpRnrRetry = 6;
// Receive-not-ready timer code 12 = 0.64 ms (IB spec table), irrelevant for one-sided ops.
constexpr uint8_t kQpMinRnrTimer = 12;
// Hop limit of the GRH on RoCE v2 (an IP TTL): 64 as for any IP packet.
constexpr uint8_t kHopLimit = 64;

// What a side tells its peer to connect an RC QP pair (40 bytes, little-endian).
struct QpInfo {
  uint32_t magic;      // "RDMQ"
  uint32_t qpn;        // queue pair number
  uint32_t psn;        // first packet sequence number (24 bits, random)
  uint16_t lid;        // InfiniBand LID (0 on RoCE)
  uint8_t mtu;         // ibv_mtu enum of the port's active MTU
  uint8_t ethernet;    // 1 = RoCE (address by GID)
  uint8_t gid[16];     // the chosen GID
  uint32_t gid_index;  // informational
  uint32_t reserved;
};
static_assert(sizeof(QpInfo) == 40, "QpInfo is 40 bytes on the wire");
constexpr uint32_t kQpInfoMagic = 0x51444d52;  // "RDMQ"

// A QP and its own completion queue; destroys them (QP first) when it goes.
struct RcQp {
  const IbvLib* lib = nullptr;
  ibv_cq* cq = nullptr;
  ibv_qp* qp = nullptr;
  uint32_t psn = 0;
  ~RcQp();
};

// Creates an RC QP in INIT with room for `depth` outstanding send work requests.
std::unique_ptr<RcQp> CreateRcQp(const VerbsDevice& dev, ibv_pd* pd, int depth);
QpInfo LocalQpInfo(const VerbsDevice& dev, const RcQp& qp);
// Walks the QP to RTR then RTS towards `remote`, with the device's ACK timeout; throws
// kFabric / kProtocol.
void ConnectRcQp(const VerbsDevice& dev, RcQp* qp, const QpInfo& remote);
// Moves the QP to the error state: every outstanding work request completes (flushed).
void FailRcQp(RcQp* qp);

#endif

}  // namespace rdmadev
