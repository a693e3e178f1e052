#include "verbs_qp.h"

#include <algorithm>
#include <cstring>

#include "../common.h"
#include "../region.h"

namespace rdmadev {

#if RDMADEV_HAVE_VERBS

RcQp::~RcQp() {
  // Children before parents: the QP refers to the CQ.
  if (qp) lib->destroy_qp(qp);
  if (cq) lib->destroy_cq(cq);
}

std::unique_ptr<RcQp> CreateRcQp(const VerbsDevice& dev, ibv_pd* pd, int depth) {
  auto q = std::make_unique<RcQp>();
  q->lib = dev.lib;
  q->cq = dev.lib->create_cq(dev.ctx, depth, nullptr, nullptr, 0);
  if (!q->cq) {
    ThrowErrno(ErrorKind::kFabric, "Failed to create completion queue on " + dev.name, errno,
               "the device is out of resources; close unused endpoints");
  }
  ibv_qp_init_attr ia{};
  ia.send_cq = q->cq;
  ia.recv_cq = q->cq;
  ia.qp_type = IBV_QPT_RC;
  ia.sq_sig_all = 0;
  ia.cap.max_send_wr = static_cast<uint32_t>(depth);
  ia.cap.max_recv_wr = 1;  // one-sided only: nothing is ever received
  ia.cap.max_send_sge = 1;
  ia.cap.max_recv_sge = 1;
  q->qp = dev.lib->create_qp(pd, &ia);
  if (!q->qp) {
    ThrowErrno(ErrorKind::kFabric, "Failed to create queue pair on " + dev.name, errno,
               "the device is out of resources; close unused endpoints");
  }
  q->psn = static_cast<uint32_t>(RandomU64() & 0xffffff);
  ibv_qp_attr a{};
  a.qp_state = IBV_QPS_INIT;
  a.pkey_index = 0;
  a.port_num = static_cast<uint8_t>(dev.port);
  a.qp_access_flags = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ;
  int rc = dev.lib->modify_qp(q->qp, &a,
                              IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS);
  if (rc != 0) ThrowErrno(ErrorKind::kFabric, "Failed to move queue pair to INIT", rc);
  return q;
}

QpInfo LocalQpInfo(const VerbsDevice& dev, const RcQp& qp) {
  QpInfo i{};
  i.magic = kQpInfoMagic;
  i.qpn = qp.qp->qp_num;
  i.psn = qp.psn;
  i.lid = dev.lid;
  i.mtu = static_cast<uint8_t>(dev.mtu);
  i.ethernet = dev.ethernet ? 1 : 0;
  std::memcpy(i.gid, dev.gid.raw, 16);
  i.gid_index = static_cast<uint32_t>(dev.gid_index);
  return i;
}

void ConnectRcQp(const VerbsDevice& dev, RcQp* q, const QpInfo& r) {
  if (r.magic != kQpInfoMagic || r.mtu < IBV_MTU_256 || r.mtu > IBV_MTU_4096) {
    throw Error(ErrorKind::kProtocol, "Failed to connect queue pair: the peer sent a malformed "
                                      "connection record", EPROTO,
                "run the same rdmadev version in every task");
  }
  if ((r.ethernet != 0) != dev.ethernet) {
    throw Error(ErrorKind::kFabric, "Failed to connect queue pair: one side is RoCE, the other "
                                    "InfiniBand", EPROTO,
                "choose devices on the same kind of network with RDMADEV_DEVICE");
  }
  ibv_qp_attr a{};
  a.qp_state = IBV_QPS_RTR;
  a.path_mtu = static_cast<ibv_mtu>(std::min<int>(r.mtu, dev.mtu));
  a.dest_qp_num = r.qpn;
  a.rq_psn = r.psn;
  a.max_dest_rd_atomic = static_cast<uint8_t>(dev.max_dest_rd_atom);
  a.min_rnr_timer = kQpMinRnrTimer;
  a.ah_attr.port_num = static_cast<uint8_t>(dev.port);
  a.ah_attr.dlid = r.lid;
  a.ah_attr.sl = 0;
  if (dev.ethernet) {
    // RoCE has no LIDs: every packet carries a GRH (an IPv6/UDP-IP header for v2).
    a.ah_attr.is_global = 1;
    std::memcpy(a.ah_attr.grh.dgid.raw, r.gid, 16);
    a.ah_attr.grh.sgid_index = static_cast<uint8_t>(dev.gid_index);
    a.ah_attr.grh.hop_limit = kHopLimit;
  }
  int rc = dev.lib->modify_qp(q->qp, &a,
                              IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN |
                                  IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER);
  if (rc != 0) {
    ThrowErrno(ErrorKind::kFabric,
               "Failed to move queue pair to RTR towards GID " + GidText(r.gid) + " (local GID " +
                   std::to_string(dev.gid_index) + " " + GidText(dev.gid.raw) + ")",
               rc,
               "the GIDs must be reachable from each other: pick a RoCE v2 IPv4 GID on a "
               "routed interface (RDMADEV_GID_INDEX), see `rdmadev doctor`");
  }
  std::memset(&a, 0, sizeof a);
  a.qp_state = IBV_QPS_RTS;
  a.timeout = dev.ack_timeout;
  a.retry_cnt = kQpRetryCount;
  a.rnr_retry = kQpRnrRetry;
  a.sq_psn = q->psn;
  a.max_rd_atomic = static_cast<uint8_t>(dev.max_rd_atom);
  rc = dev.lib->modify_qp(q->qp, &a,
                          IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY |
                              IBV_QP_SQ_PSN | IBV_QP_MAX_QP_RD_ATOMIC);
  if (rc != 0) ThrowErrno(ErrorKind::kFabric, "Failed to move queue pair to RTS", rc);
}

void FailRcQp(RcQp* q) {
  ibv_qp_attr a{};
  a.qp_state = IBV_QPS_ERR;
  q->lib->modify_qp(q->qp, &a, IBV_QP_STATE);
}

#endif

}  // namespace rdmadev
