"""An independent verbs peer for rdmadev, written on Debian's python3-pyverbs (run it with
/usr/bin/python3 inside the Soft-RoCE guest; it shares no code with rdmadev).

It speaks the documented wire formats only: the region descriptor (region.h), the side
channel's HMAC handshake (handshake.h, tag "rdmadev-verbs-v1") and the 40-byte queue-pair
record (verbs_qp.h). Two modes, each printing one JSON line and exiting 0 on success:

  write ADDRESS DESC_HEX SECRET_HEX OFFSET LENGTH SEQ
      connects to the rdmadev task at ADDRESS (its Domain.address), RDMA-WRITEs LENGTH
      pattern bytes at OFFSET of the region DESC_HEX names, then the signal as rdmadev
      defines it: aux (= LENGTH) at byte 8, then SEQ at byte 0, as two ordered writes.
  serve SECRET_HEX SIZE OFFSET LENGTH SEQ TIMEOUT
      registers an MR laid out as a chunk (region.h: a directory page naming region 1, then
      its SIZE bytes), prints {"address", "descriptor"} for rdmadev to connect to and attach,
      accepts one connection, then waits until the word at byte 0 of the region is SEQ and
      checks the pattern at OFFSET and aux (= LENGTH) at byte 8.
  mute SECRET_HEX SIZE OFFSET LENGTH SEQ TIMEOUT
      serve's checks, then destroys its queue pair and prints {"muted": true}: rdmadev's later
      writes are never acknowledged (a host gone silent), while the side channel stays open
      until rdmadev closes it (or TIMEOUT).
"""
import hashlib
import hmac
import ipaddress
import json
import os
import socket
import struct
import sys
import time

try:
    import pyverbs.libibverbs_enums as E  # rdma-core >= 50
except ImportError:
    import pyverbs.enums as E  # rdma-core 44 (Debian bookworm)
from pyverbs.addr import GID, AHAttr, GlobalRoute
from pyverbs.cq import CQ
from pyverbs.device import Context
from pyverbs.mr import MR
from pyverbs.pd import PD
from pyverbs.qp import QP, QPAttr, QPCap, QPInitAttr
from pyverbs.wr import SGE, SendWR

DEVICE = os.environ.get("RDMADEV_DEVICE", "rxe0")
PORT = 1
TAG = b"rdmadev-verbs-v1"
HELLO = struct.Struct("<II32s")                     # "RDMH", version 1, server nonce
QPINFO = struct.Struct("<IIIHBB16sII")              # "RDMQ", qpn, psn, lid, mtu, ethernet, gid, gid index, 0
DESC = struct.Struct("<IIQQQIiQQQI4xQ")            # descriptor v3: ..., verbs addr, verbs rkey, offset
DESC_MAGIC, HELLO_MAGIC, QPINFO_MAGIC = 0x524D4452, 0x48444D52, 0x51444D52
PAGE = 4096
ACCESS = E.IBV_ACCESS_LOCAL_WRITE | E.IBV_ACCESS_REMOTE_WRITE | E.IBV_ACCESS_REMOTE_READ


def pattern(n):
    return bytes((i * 131 + 17) & 0xFF for i in range(n))


def mac(secret, role, a, b, name):
    return hmac.new(secret, TAG + b" " + role + b"|" + a + b"|" + b + b"|" + name,
                    hashlib.sha256).digest()


def recv_exact(s, n):
    out = b""
    while len(out) < n:
        chunk = s.recv(n - len(out))
        if not chunk:
            raise ConnectionError("side channel closed")
        out += chunk
    return out


def best_gid(ctx):
    """Index and value of the first RoCE v2 GID holding an IPv4 address (as rdmadev picks)."""
    for i in range(ctx.query_port(PORT).gid_tbl_len):
        try:
            g = ctx.query_gid(PORT, i)
        except Exception:
            continue
        path = f"/sys/class/infiniband/{DEVICE}/ports/{PORT}/gid_attrs/types/{i}"
        try:
            kind = open(path).read().strip()
        except OSError:
            continue
        if kind == "RoCE v2" and ipaddress.IPv6Address(str(g)).ipv4_mapped:
            return i, g
    raise SystemExit("no RoCE v2 IPv4 GID on " + DEVICE)


class Peer:
    def __init__(self, size):
        self.ctx = Context(name=DEVICE)
        self.pd = PD(self.ctx)
        self.mr = MR(self.pd, size, ACCESS)
        self.cq = CQ(self.ctx, 16)
        cap = QPCap(max_send_wr=16, max_recv_wr=1, max_send_sge=1, max_recv_sge=1)
        self.qp = QP(self.pd, QPInitAttr(qp_type=E.IBV_QPT_RC, scq=self.cq, rcq=self.cq, cap=cap))
        self.gid_index, self.gid = best_gid(self.ctx)
        self.psn = int.from_bytes(os.urandom(3), "little")

    def info(self):
        port = self.ctx.query_port(PORT)
        gid = ipaddress.IPv6Address(str(self.gid)).packed
        return QPINFO.pack(QPINFO_MAGIC, self.qp.qp_num, self.psn, 0, port.active_mtu, 1, gid,
                           self.gid_index, 0)

    def connect(self, record):
        magic, qpn, psn, _lid, mtu, _eth, gid, _gidx, _ = QPINFO.unpack(record)
        assert magic == QPINFO_MAGIC, "not a queue-pair record"
        attr = QPAttr(port_num=PORT, path_mtu=min(mtu, self.ctx.query_port(PORT).active_mtu))
        attr.qp_access_flags = ACCESS
        attr.dest_qp_num, attr.rq_psn, attr.sq_psn = qpn, psn, self.psn
        attr.max_dest_rd_atomic = attr.max_rd_atomic = 1
        # rdmadev's queue pairs' values (verbs_qp.h), with its ACK timeout where the tier sets one.
        attr.min_rnr_timer, attr.retry_cnt, attr.rnr_retry = 12, 6, 6
        attr.timeout = int(os.environ.get("RDMADEV_ACK_TIMEOUT", 16))
        route = GlobalRoute(dgid=GID(ipaddress.IPv6Address(gid).exploded), sgid_index=self.gid_index)
        attr.ah_attr = AHAttr(gr=route, is_global=1, port_num=PORT)
        self.qp.to_rts(attr)

    def rdma_write(self, local_off, length, addr, rkey):
        wr = SendWR(wr_id=length, opcode=E.IBV_WR_RDMA_WRITE, num_sge=1,
                    sg=[SGE(self.mr.buf + local_off, length, self.mr.lkey)],
                    send_flags=E.IBV_SEND_SIGNALED)
        wr.set_wr_rdma(rkey, addr)
        self.qp.post_send(wr)
        end = time.monotonic() + 30
        while time.monotonic() < end:
            n, wcs = self.cq.poll()
            if n:
                if wcs[0].status != E.IBV_WC_SUCCESS:
                    raise SystemExit(f"RDMA WRITE failed: wc status {wcs[0].status}")
                return
        raise SystemExit("RDMA WRITE: no completion in 30 s")


def write_mode(address, desc_hex, secret_hex, offset, length, seq):
    reach = dict(item.split("=", 1) for item in address.split(";"))["verbs"]
    host, port = reach.rsplit("/", 1)[0].rsplit(":", 1)
    magic, version, _id, size, _k, _pid, _fd, _ino, _dev, addr, rkey, _off = DESC.unpack(
        bytes.fromhex(desc_hex))
    assert magic == DESC_MAGIC and version == 3 and rkey, "not a verbs-registered v3 descriptor"
    assert offset + length <= size
    secret = bytes.fromhex(secret_hex)
    s = socket.create_connection((host, int(port)), timeout=30)
    m, v, ns = HELLO.unpack(recv_exact(s, HELLO.size))
    assert m == HELLO_MAGIC and v == 1
    nc, name = os.urandom(32), b"pyverbs-peer"
    s.sendall(struct.pack("<H", len(name)) + name + nc + mac(secret, b"client", ns, nc, name))
    reply = recv_exact(s, 33)
    assert reply[0] == 0 and hmac.compare_digest(reply[1:], mac(secret, b"server", nc, ns, name))
    peer = Peer(max(length, 16) + 16)
    s.sendall(peer.info())
    peer.connect(recv_exact(s, QPINFO.size))
    peer.mr.write(pattern(length), length, 16)
    peer.mr.write(struct.pack("<QQ", seq, length), 16, 0)
    if length:
        peer.rdma_write(16, length, addr + offset, rkey)
    peer.rdma_write(8, 8, addr + 8, rkey)   # aux first ...
    peer.rdma_write(0, 8, addr, rkey)       # ... then the sequence word
    print(json.dumps({"ok": True, "wrote": length}), flush=True)
    s.close()


def serve_mode(secret_hex, size, offset, length, seq, timeout, mute=False):
    secret = bytes.fromhex(secret_hex)
    # The MR is a chunk as region.h lays one out: a directory page, whose word for the region's
    # page names the region (a peer attaching it reads that word), then region 1 on page 1.
    peer = Peer(PAGE + size)
    peer.mr.write(bytes(PAGE + size), PAGE + size, 0)
    peer.mr.write(struct.pack("<Q", 1), 8, 8)
    ls = socket.socket()
    ls.bind(("127.0.0.1", 0))
    ls.listen(1)
    gid = str(ipaddress.IPv6Address(str(peer.gid)))
    desc = DESC.pack(DESC_MAGIC, 3, 1, size, 0, os.getpid(), -1, 0, 0, peer.mr.buf + PAGE,
                     peer.mr.rkey, PAGE)
    print(json.dumps({"address": f"verbs=127.0.0.1:{ls.getsockname()[1]}/{gid}",
                      "descriptor": desc.hex()}), flush=True)
    ls.settimeout(timeout)
    s, _ = ls.accept()
    s.settimeout(30)
    ns = os.urandom(32)
    s.sendall(HELLO.pack(HELLO_MAGIC, 1, ns))
    (nl,) = struct.unpack("<H", recv_exact(s, 2))
    name, nc, their = recv_exact(s, nl), recv_exact(s, 32), recv_exact(s, 32)
    if not hmac.compare_digest(their, mac(secret, b"client", ns, nc, name)):
        s.sendall(b"\x01" + bytes(32))
        raise SystemExit("rdmadev failed authentication")
    s.sendall(b"\x00" + mac(secret, b"server", nc, ns, name))
    record = recv_exact(s, QPINFO.size)
    peer.connect(record)          # ready before rdmadev learns our QP number
    s.sendall(peer.info())
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if struct.unpack("<Q", peer.mr.read(8, PAGE))[0] == seq:
            break
        time.sleep(0.001)
    else:
        raise SystemExit(f"sequence word never reached {seq}")
    aux = struct.unpack("<Q", peer.mr.read(8, PAGE + 8))[0]
    ok = peer.mr.read(length, PAGE + offset) == pattern(length) and aux == length
    print(json.dumps({"ok": ok, "seq": seq, "aux": aux}), flush=True)
    if mute:
        peer.qp.close()           # packets for it are dropped unanswered from now on
        print(json.dumps({"muted": True}), flush=True)
        s.settimeout(timeout)
        while s.recv(64):         # until rdmadev hangs up its side channel
            pass
    s.close()
    return ok


if __name__ == "__main__":
    mode, args = sys.argv[1], sys.argv[2:]
    if mode == "write":
        write_mode(args[0], args[1], args[2], *map(int, args[3:6]))
    elif mode in ("serve", "mute"):
        sys.exit(0 if serve_mode(args[0], *map(int, args[1:5]), float(args[5]), mode == "mute")
                 else 1)
    else:
        sys.exit(f"unknown mode {mode}")
