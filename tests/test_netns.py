"""The tcp fabric between two network namespaces joined by a veth pair: the bytes cross a
real interface, as between two hosts."""
import os

import pytest

import netns
from remote import RemotePeer

pytestmark = pytest.mark.netns


@pytest.fixture
def hosts(secret):
    netns.require()
    with netns.VethPair(f"rdt{os.getpid() % 10000}-") as net:
        a = RemotePeer("tcp", secret, name="host:a", tcp_addr=f"{net.addresses[0]}:0", netns=net.names[0])
        b = RemotePeer("tcp", secret, name="host:b", tcp_addr=f"{net.addresses[1]}:0", netns=net.names[1])
        try:
            yield a, b, net
        finally:
            a.close()
            b.close()


@pytest.mark.parametrize("size", [1, 4096 + 3, 1 << 20, 64 << 20], ids=lambda s: f"{s}B")
def test_write_and_read_across_veth(hosts, size):
    a, b, net = hosts
    assert a.address.startswith(f"tcp={net.addresses[0]}:")
    dst = a.call("alloc", "dst", size + 64)
    b.call("alloc", "src", size)
    b.call("fill", "src", 5)
    assert b.call("connect", "a", a.address) == "tcp"
    b.call("attach", "a", "dst", dst)
    b.call("write", "a", "src", 0, "dst", 64, size, (0, 1, size))
    assert a.call("wait", "dst", 0, 1, 60) == 1
    assert a.call("matches", "dst", 5, 64, size)
    b.call("alloc", "back", size)
    b.call("read", "a", "dst", 64, "back", 0, size)
    assert b.call("matches", "back", 5, 0, size)


def test_namespaces_cannot_reach_loopback_of_each_other(hosts):
    """Sanity: the peers really are apart (b cannot reach a's loopback listener)."""
    a, b, _ = hosts
    import rdmadev
    port = a.address.rsplit(":", 1)[1]
    with pytest.raises(rdmadev.PeerLostError):
        b.call("connect", "lo", f"tcp=127.0.0.1:{port}")
