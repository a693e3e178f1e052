"""verbs-only behaviour: descriptors that are real RDMA addresses and keys (proved by an
independent pyverbs peer), dead peers, device choice. Runs where verbs is viable (the
Soft-RoCE tier: tests/softroce/run-in-vm.sh); with RDMADEV_REQUIRE_VERBS=1 a non-viable
verbs fails here instead of skipping."""
import json
import os
import struct
import subprocess
import sys
import time

import numpy as np
import pytest

import rdmadev
from remote import RemotePeer

# As in conftest.py: with RDMADEV_REQUIRE_VERBS=1 (the Soft-RoCE tier) these run, and fail,
# even when verbs is not viable.
VERBS = "verbs" in rdmadev.viable_fabrics() or os.environ.get("RDMADEV_REQUIRE_VERBS") == "1"
pytestmark = pytest.mark.skipif(not VERBS, reason="verbs is not viable here: " +
                                rdmadev._core.unviable_reason("verbs"))

HERE = os.path.dirname(__file__)
PYVERBS_PEER = os.path.join(HERE, "softroce", "pyverbs_peer.py")
# Debian's python3-pyverbs lives in the system Python's dist-packages only.
SYSTEM_PYTHON = "/usr/bin/python3"
DESC = struct.Struct("<IIQQQIiQQQI4xQ")  # descriptor v3 (region.h)


def _pyverbs_pattern(n):
    return bytes((i * 131 + 17) & 0xFF for i in range(n))


@pytest.fixture
def vdomain(secret):
    dom = rdmadev.open_domain("test:verbs", rdmadev.Config(fabric="verbs", secret=secret))
    yield dom
    dom.close()


def test_descriptor_carries_the_registration(vdomain):
    region = vdomain.allocate(3 * 4096 + 5)
    magic, version, rid, size, _, _, _, _, _, addr, rkey, _ = DESC.unpack(region.descriptor)
    assert (version, rid, size) == (3, region.id, 3 * 4096 + 5)
    view = np.frombuffer(region, np.uint8)
    assert addr == view.ctypes.data and rkey != 0
    assert vdomain.address.startswith("verbs=") and "/::ffff:" in vdomain.address


@pytest.mark.parametrize("source", ["region", "buffer"])
def test_dead_peer_fails_a_write_within_seconds(vdomain, secret, source):
    """From a region (written without a copy, the write waits for its completion) and from
    any other memory (staged: the write returns once posted, so the failure comes with a
    later write, or the endpoint's liveness check)."""
    peer = RemotePeer("verbs", secret)
    try:
        ep = vdomain.connect(peer.address, "verbs")
        remote = ep.attach(peer.call("alloc", "dst", 1 << 20))
        src = vdomain.allocate(1 << 20) if source == "region" else bytearray(1 << 20)
        ep.write(src, 0, remote, 0, 1 << 20, signal=(0, 1, 0))
        peer.kill()
        t0 = time.monotonic()
        with pytest.raises(rdmadev.PeerLostError):
            for _ in range(100):
                ep.write(src, 0, remote, 0, 1 << 20, signal=(0, 2, 0), timeout=60)
        assert time.monotonic() - t0 < 10
        assert ep.alive()[0] is False
    finally:
        peer.close()


def test_wrong_gid_index_is_a_clear_error(secret):
    with pytest.raises(rdmadev.FabricError, match="GID index 999"):
        rdmadev.open_domain("x", rdmadev.Config(fabric="verbs", secret=secret, gid_index=999))


def test_wrong_device_is_a_clear_error(secret):
    with pytest.raises(rdmadev.FabricError, match="not an RDMA device"):
        rdmadev.open_domain("x", rdmadev.Config(fabric="verbs", secret=secret, device="nosuch0"))


def test_doctor_lists_ports_and_gids():
    from rdmadev.tools import doctor

    ports = doctor.collect()["verbs"]["ports"]
    assert any(p["state"] and "ACTIVE" in p["state"] and
               any("RoCE v2, IPv4" in g["kind"] for g in p["gids"]) for p in ports)


def _pyverbs(*args, timeout=120):
    if not os.path.exists(SYSTEM_PYTHON):
        pytest.fail(f"{SYSTEM_PYTHON} is missing: the pyverbs peer needs Debian's python3-pyverbs")
    return subprocess.Popen([SYSTEM_PYTHON, PYVERBS_PEER, *map(str, args)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


@pytest.mark.parametrize("size", [0, 1, 4096 + 3, 1 << 20], ids=lambda s: f"{s}B")
def test_pyverbs_peer_writes_into_an_rdmadev_region(vdomain, secret, size):
    region = vdomain.allocate(size + 4096 + 64)
    off = 4096 + 7
    p = _pyverbs("write", vdomain.address, region.descriptor.hex(), secret.hex(), off, size, 41)
    out, err = p.communicate(timeout=120)
    assert p.returncode == 0, err + out
    assert region.wait(0, 41, timeout=10) == 41
    assert json.loads(out.splitlines()[-1])["ok"]
    assert region.load(8) == size
    assert bytes(memoryview(region)[off:off + size]) == _pyverbs_pattern(size)


@pytest.mark.parametrize("size", [1, 1 << 20], ids=lambda s: f"{s}B")
def test_rdmadev_writes_into_a_pyverbs_mr(vdomain, secret, size):
    off = 64
    p = _pyverbs("serve", secret.hex(), off + size, off, size, 77, 120)
    first = json.loads(p.stdout.readline())
    ep = vdomain.connect(first["address"], "verbs", timeout=60)
    remote = ep.attach(bytes.fromhex(first["descriptor"]))
    src = vdomain.allocate(size)
    np.frombuffer(src, np.uint8)[:] = np.frombuffer(_pyverbs_pattern(size), np.uint8)
    ep.write(src, 0, remote, off, size, signal=(0, 77, size))
    out, err = p.communicate(timeout=120)
    assert p.returncode == 0, err + out
    assert json.loads(out.splitlines()[-1]) == {"ok": True, "seq": 77, "aux": size}
    ep.close()


@pytest.mark.parametrize("ack_timeout, least_s, most_s", [(12, 0.0, 3.0), (17, 3.0, 20.0)])
def test_a_peer_that_stops_acknowledging_fails_the_write_after_the_ack_timeouts(
        secret, ack_timeout, least_s, most_s):
    """The pyverbs peer destroys its queue pair after one write, its side channel still
    open (a host gone silent): the next write fails once its retries run out, (1 + 6) ACK
    timeouts (RDMADEV_ACK_TIMEOUT: 117 ms at 12, 3.8 s at 17), long before the write's own
    deadline. A retry count of 7, which rxe reads as forever, waited out the deadline."""
    cfg = rdmadev.Config(fabric="verbs", secret=secret, ack_timeout=ack_timeout)
    p = _pyverbs("mute", secret.hex(), 64 + 4096, 64, 4096, 77, 120)
    try:
        first = json.loads(p.stdout.readline())
        with rdmadev.open_domain("test:verbs", cfg) as dom:
            ep = dom.connect(first["address"], "verbs", timeout=60)
            remote = ep.attach(bytes.fromhex(first["descriptor"]))
            src = dom.allocate(4096)
            np.frombuffer(src, np.uint8)[:] = np.frombuffer(_pyverbs_pattern(4096), np.uint8)
            ep.write(src, 0, remote, 64, 4096, signal=(0, 77, 4096))
            assert json.loads(p.stdout.readline()) == {"ok": True, "seq": 77, "aux": 4096}
            assert json.loads(p.stdout.readline()) == {"muted": True}
            t0 = time.monotonic()
            with pytest.raises(rdmadev.PeerLostError, match="stopped acknowledging"):
                ep.write(src, 0, remote, 64, 4096, signal=(0, 78, 4096), timeout=60)
            assert least_s <= time.monotonic() - t0 < most_s
            ep.close()
        out, err = p.communicate(timeout=60)
        assert p.returncode == 0, err + out
    finally:
        p.kill()


def test_memlock_too_low_says_how_much_and_how_to_raise():
    """Registration pins memory: with RLIMIT_MEMLOCK at 1 MiB (and CAP_IPC_LOCK dropped, as
    for any non-root user) a 64 MiB region's chunk fails with the numbers and the fix."""
    if os.geteuid() != 0 or not os.path.exists("/usr/bin/setpriv"):
        pytest.skip("needs root and setpriv to drop CAP_IPC_LOCK")
    code = ("import rdmadev; d = rdmadev.open_domain('m', rdmadev.Config(fabric='verbs', "
            "secret=b's')); d.allocate(64 << 20)")
    r = subprocess.run(["/usr/bin/setpriv", "--bounding-set", "-ipc_lock", "--inh-caps", "-ipc_lock",
                        "bash", "-c", f'ulimit -l 1024 && exec "{sys.executable}" -c "{code}"'],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode != 0
    assert "RegionError" in r.stderr and "RLIMIT_MEMLOCK is 1 MiB" in r.stderr, r.stderr
    # the region's chunk: 64 MiB and its directory page (rounded up in the message)
    assert "needs 65 MiB" in r.stderr and "ulimit -l unlimited" in r.stderr


def test_a_task_registers_past_a_soft_memlock_limit_below_its_hard_one():
    """A task raises its soft RLIMIT_MEMLOCK to the hard one when it starts (limits.py), so a
    soft 1 MiB under an unlimited hard limit (CAP_IPC_LOCK dropped) registers 64 MiB."""
    if os.geteuid() != 0 or not os.path.exists("/usr/bin/setpriv"):
        pytest.skip("needs root and setpriv to drop CAP_IPC_LOCK")
    code = ("import rdmadev; from rdmadev.cluster import limits; limits.raise_soft_limits(); "
            "d = rdmadev.open_domain('m', rdmadev.Config(fabric='verbs', secret=b's')); "
            "print(d.allocate(64 << 20).size)")
    r = subprocess.run(["/usr/bin/setpriv", "--bounding-set", "-ipc_lock", "--inh-caps", "-ipc_lock",
                        "bash", "-c", f'ulimit -H -l unlimited && ulimit -S -l 1024 && '
                                      f'exec "{sys.executable}" -c "{code}"'],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and r.stdout.split()[-1] == str(64 << 20), r.stderr


def test_the_regions_granted_one_peer_share_one_registration(vdomain):
    """One registration per chunk (_native/core/arena.h): the regions granted one peer carry
    its rkey, each at its own offset; another peer's are in a chunk (and a key) of their own."""
    first, second = (vdomain.allocate(5000, grant=["peer"]) for _ in range(2))
    other = vdomain.allocate(100, grant=["other"])
    (*_, a_addr, a_key, a_off), (*_, b_addr, b_key, b_off), (*_, o_key, _o_off) = (
        DESC.unpack(r.descriptor) for r in (first, second, other))
    assert a_key == b_key != o_key and a_key != 0
    assert b_addr - a_addr == b_off - a_off != 0
    assert vdomain.chunk_stats["chunks"] == 2
