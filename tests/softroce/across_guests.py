"""rdmadev between two kernels: this process in Soft-RoCE guest a, every test's other end in
guest b, the two joined by one virtual Ethernet wire with an rxe0 on each end
(run-two-vms.sh; two_hosts.py serves b's end). Not a test module of the default suite (its
name does not start with test_): two_guests.sh runs it in guest a.

The project's own fabric tests run here unchanged, with fixtures whose peer is in guest b:
- one-sided writes of 0 B to 16 MiB landing byte-exact with their signal, RDMA READ of a
  peer's region, the peer writing back, writes from any memory (verbs' staging) (test_transfers);
- signals and credits: a ring carrying thousands of transfers (8 slots; one slot is the single-guest tier's), a
  slow receiver, a sender blocked without credit (test_channel);
- channel setup through the control plane between task processes in both guests, and a
  connection between them reset with both running, after which the pairs are set up again and
  carry exact data (test_channel_setup, with ps:0 and worker:0 in guest b);
each on verbs and on tcp. And: the independent pyverbs peer (Debian's python3-pyverbs, no
rdmadev code) here writing into an rdmadev region there; a stage (a region a sender grants
to one reader) read with RDMA READ from the other guest; the fabric two domains pick across
guests (verbs when both open every viable one, tcp when asked, never shm).
"""
import ipaddress
import json
import os
import subprocess
import sys
from multiprocessing.connection import Client

import numpy as np
import pytest

import rdmadev
from rdmadev import Config
from rdmadev.cluster import runtime
from rdmadev.testing import pair

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import control_task  # noqa: E402
import test_channel  # noqa: E402
import test_channel_setup  # noqa: E402
import test_transfers  # noqa: E402
from remote import RemotePeer  # noqa: E402
from remote_ops import pattern  # noqa: E402
from two_hosts import A, B, CONTROL_SECRET, PEER_PORT, SECRET, cluster_spec  # noqa: E402

if os.environ.get("RDMADEV_GUEST") != "a":
    pytest.skip("runs in guest a of tests/softroce/two_guests.sh", allow_module_level=True)

FABRICS = ["verbs", "tcp"]
PYVERBS_PEER = os.path.join(HERE, "pyverbs_peer.py")
#: The large transfer each way: 16 MiB (64 MiB took 53 s on verbs over this wire under TCG; the
#: single-guest tier and the default suite move 64 MiB on every fabric).
BIG = 16 << 20
BIG_TIMEOUT_S = 300


class GuestPeer(RemotePeer):
    """A RemotePeer whose process is in guest b: the same calls, over the wire."""

    def __init__(self, fabric, name="peer", timeout=120.0):
        self.proc, self.timeout, self.pending = None, timeout, 0
        self.conn = Client((B, PEER_PORT), authkey=SECRET)
        self.conn.send((name, fabric))
        self.address = pair.recv(self.conn, timeout)

    @property
    def pid(self):
        return None

    def kill(self):
        self.conn.close()

    def close(self):
        if not self.conn.closed:
            try:
                self.conn.send(None)
            except OSError:
                pass
            self.conn.close()


@pytest.fixture(params=FABRICS)
def fabric(request):
    return request.param


@pytest.fixture
def secret():
    return SECRET


@pytest.fixture
def domain(fabric):
    """This process's Domain on `fabric`, at guest a's address."""
    with rdmadev.open_domain("test:a", Config(fabric=fabric, secret=SECRET), tcp_addr=f"{A}:0") as dom:
        yield dom


@pytest.fixture(scope="module")
def _peers():
    peers = {}
    yield peers
    for p in peers.values():
        p.close()


@pytest.fixture
def peer(fabric, _peers):
    """A peer process in guest b on `fabric`, one per fabric for the module, reset between tests."""
    p = _peers.get(fabric)
    if p is not None and (p.pending or p.conn.closed):
        p.kill()
        p = None
    if p is not None:
        p.call("reset", timeout=60)
    else:
        p = _peers[fabric] = GuestPeer(fabric)
    yield p


@pytest.fixture(scope="module", params=FABRICS)
def world(request):
    """(this process's Runtime as worker:1 in guest a, None): ps:0 and worker:0 run in guest
    b (two_hosts.py), every task on one fabric."""
    spec = cluster_spec(request.param)
    runtime.register_handler("t_send", control_task.t_send)
    runtime.register_handler("t_recv", control_task.t_recv)
    rt = runtime.Runtime(spec, "worker", 1, Config(fabric=request.param,
                                                   secret=CONTROL_SECRET.encode(), deadline_s=60))
    try:
        yield rt, None
    finally:
        rt.close()


# --- the fabric tests of test_transfers and test_channel, their other end in guest b ---------

# test_transfers' sizes below BIG (its 64 MiB write and read take 30-40 s each over this wire on
# a loaded host, past the 30 s those tests give them): test_a_large_transfer_each_way has BIG.
SIZES = [s for s in test_transfers.SIZES if s < BIG]


@pytest.mark.parametrize("size", SIZES, ids=lambda s: f"{s}B")
def test_a_write_lands_byte_exact_in_the_other_guest(domain, peer, size):
    test_transfers.test_write_lands_in_peer_region(domain, peer, size)


@pytest.mark.parametrize("size", SIZES, ids=lambda s: f"{s}B")
def test_a_read_fetches_the_other_guests_region(domain, peer, size):
    test_transfers.test_read_fetches_peer_region(domain, peer, size)


def test_a_large_transfer_each_way(domain, peer):
    """BIG bytes written into the other guest at an odd offset land byte-exact with their
    signal; BIG bytes read back from there arrive byte-exact."""
    ep = test_transfers._connect_both(domain, peer)
    off = test_transfers.REMOTE_OFF
    remote = ep.attach(peer.call("alloc", "dst", BIG + off))
    src = domain.allocate(BIG)
    np.frombuffer(src, np.uint8)[:] = pattern(BIG, 7)
    ep.write(src, 0, remote, off, BIG, signal=(0, 1, BIG), timeout=BIG_TIMEOUT_S)
    assert peer.call("wait", "dst", 0, 1, BIG_TIMEOUT_S) == 1
    assert peer.call("matches", "dst", 7, off, BIG, timeout=BIG_TIMEOUT_S)
    peer.call("fill", "dst", 3, timeout=BIG_TIMEOUT_S)
    ep.read(remote, off, src, 0, BIG, timeout=BIG_TIMEOUT_S)
    assert np.array_equal(np.frombuffer(src, np.uint8), pattern(BIG + off, 3)[off:])


def test_the_other_guest_writes_into_our_region(domain, peer):
    test_transfers.test_peer_writes_into_our_region(domain, peer)


def test_writes_from_any_memory_land_in_the_other_guest_as_written(domain, peer):
    test_transfers.test_writes_from_any_memory_land_as_they_were_when_written(domain, peer)


# 3000 transfers take 15-55 s each over this wire: an 8-slot ring on verbs (the credits written
# back over the QP) and on tcp (its credits a frame of their own). One slot, a credit per
# transfer, took 23 s on verbs and 55 s on tcp: the single-guest tier runs it on verbs.
@pytest.mark.parametrize("fabric, slots", [("verbs", 8), ("tcp", 8)])
def test_a_ring_to_the_other_guest_carries_thousands_of_transfers(domain, peer, slots):
    test_channel.test_thousands_of_transfers_arrive_intact(domain, peer, slots)


def test_a_slow_receiver_in_the_other_guest_never_sees_a_slot_overwritten(domain, peer):
    test_channel.test_slow_receiver_never_sees_a_slot_overwritten(domain, peer)


def test_a_sender_blocks_without_credit_from_the_other_guest(domain, peer):
    test_channel.test_sender_blocks_without_credit(domain, peer)


def test_a_stage_granted_to_this_guest_is_read_with_rdma_read(domain, peer):
    """A stage as a sending task makes one (a region granted to its receiver's identity
    only, Domain.allocate's grant): read here, across the wire, as the receiver does."""
    size = (3 << 20) + 5
    desc = peer.call("alloc", "stage", size, ("test:a",))
    peer.call("fill", "stage", 21)
    ep = test_transfers._connect_both(domain, peer)
    dst = domain.allocate(size)
    ep.read(ep.attach(desc), 0, dst, 0, size)
    assert np.array_equal(np.frombuffer(dst, np.uint8), pattern(size, 21))


# --- control plane: channel setup and a reset connection between the guests -----------------

def test_channels_set_up_between_the_guests_carry_data(world):
    test_channel_setup.test_one_round_trip_per_pair_and_the_channels_carry_data(world)


@pytest.mark.breaks_connection
def test_a_reset_connection_between_the_guests_is_set_up_again(world):
    test_channel_setup.test_channels_of_a_connection_cut_while_both_tasks_run_are_set_up_again(world)


# --- an independent peer, and the fabric picked across guests ---------------------------------

@pytest.mark.parametrize("size", [0, 1, 4096 + 3, 1 << 20], ids=lambda s: f"{s}B")
def test_the_pyverbs_peer_here_writes_into_rdmadev_there(size):
    """tests/softroce/pyverbs_peer.py (Debian's python3-pyverbs; it shares no code with
    rdmadev) in this guest RDMA-WRITEs into a region of rdmadev's in guest b, then the signal."""
    with GuestPeer("verbs") as there:
        off = 4096 + 7
        desc = there.call("alloc", "dst", off + size + 64)
        p = subprocess.run(["/usr/bin/python3", PYVERBS_PEER, "write", there.address, desc.hex(),
                            SECRET.hex(), str(off), str(size), "41"],
                           capture_output=True, text=True, timeout=180)
        assert p.returncode == 0, p.stderr + p.stdout
        assert json.loads(p.stdout.splitlines()[-1])["ok"]
        assert there.call("wait", "dst", 0, 41, 30) == 41
        want = bytes((i * 131 + 17) & 0xFF for i in range(size))
        assert there.call("matches_bytes", "dst", off, want)
        assert there.call("matches_bytes", "dst", 8, size.to_bytes(8, "little"))


@pytest.mark.parametrize("ours, theirs, picked", [
    ("auto", "auto", "verbs"),   # shm is open on both ends, and reaches only within a kernel
    ("tcp", "auto", "tcp"),      # RDMADEV_FABRIC=tcp on one end
    ("auto", "tcp", "tcp"),
])
def test_the_fabric_picked_across_guests(ours, theirs, picked):
    mine = rdmadev.open_domain("test:a", Config(fabric=ours, secret=SECRET), tcp_addr=f"{A}:0")
    with mine, GuestPeer(theirs) as there:
        if ours == "auto":
            assert "shm" in mine.fabrics
        assert mine.connect(there.address).fabric == picked
        assert there.call("connect", "a", mine.address) == picked


def test_shm_alone_cannot_reach_the_other_guest():
    with rdmadev.open_domain("test:a", Config(fabric="shm", secret=SECRET)) as mine, \
            GuestPeer("auto") as there:
        with pytest.raises(rdmadev.FabricError, match="can reach none the peer offers"):
            mine.connect(there.address)


def test_the_guests_have_distinct_gids():
    with GuestPeer("verbs") as there, \
            rdmadev.open_domain("test:a", Config(fabric="verbs", secret=SECRET), tcp_addr=f"{A}:0") as mine:
        gid = lambda address: address.split("verbs=", 1)[1].split("/", 1)[1].split(";")[0]
        assert gid(mine.address) == f"::ffff:{A}" and gid(there.address) == f"::ffff:{B}"


# --- rdmadev doctor --peer from this guest to a task in the other -------------------------------

def test_doctor_peer_finds_the_verbs_path_to_a_task_in_the_other_guest():
    """The doctor here, as a user runs it on one host, against ps:0 in guest b (a task on
    verbs, two_hosts.py): every check ok, the pair on verbs, link layer, GID type, MTU and
    memlock agreeing, from both ends' sysfs."""
    peer = cluster_spec("verbs")["ps"][0]
    env = {**os.environ, "RDMADEV_SECRET": CONTROL_SECRET, "RDMADEV_FABRIC": "auto"}
    done = subprocess.run([sys.executable, "-m", "rdmadev", "doctor", "--peer", peer, "--json"],
                          env=env, capture_output=True, text=True, timeout=300)
    report = json.loads(done.stdout)
    checks = {c["name"]: c["status"] for c in report["checks"]}
    assert done.returncode == 0 and report["healthy"] and report["fabric"] == "verbs", report
    for name in ("resolved", "reachable", "secret", "version", "fabric", "connects", "verbs",
                 "mtu", "memlock"):
        assert checks[name] == "ok", (name, report)
    here, there = report["here"]["verbs"], report["peer_facts"]["verbs"]
    gids = [ipaddress.ip_address(side["gid"]) for side in (here, there)]  # sysfs writes hex
    assert gids == [ipaddress.ip_address(f"::ffff:{A}"), ipaddress.ip_address(f"::ffff:{B}")]
