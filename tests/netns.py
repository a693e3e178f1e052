"""Network namespaces joined by a veth pair: two "hosts" on one machine for tests and
benchmarks. Created and removed by the caller; needs root and iproute2."""
import ctypes
import os
import shutil
import subprocess

# A private /24 that exists only inside the namespaces this module creates.
SUBNET = "10.231.77"
# CLONE_NEWNET from <sched.h>: setns() into a network namespace (Python 3.11 has no os.setns).
CLONE_NEWNET = 0x40000000


#: Debian's package of each tool the namespace tests use.
PACKAGES = {"ip": "iproute2", "ss": "iproute2", "nft": "nftables", "unshare": "util-linux"}


def unavailable_reason(*tools):
    """Why namespaces (and `tools`, besides `ip`) cannot be used here ("" if they can)."""
    if os.geteuid() != 0:
        return "creating network namespaces needs root"
    for tool in ("ip",) + tools:
        if not shutil.which(tool):
            return f"`{tool}` is not installed (apt-get install {PACKAGES.get(tool, tool)})"
    return ""


def require(*tools):
    """Skips the calling test when namespaces or `tools` are unavailable, saying why; fails it
    instead under RDMADEV_REQUIRE_NETNS=1 (set by .ci/run), as RDMADEV_REQUIRE_VERBS=1 does for
    verbs, so that CI cannot pass by skipping."""
    import pytest
    reason = unavailable_reason(*tools)
    if not reason:
        return
    if os.environ.get("RDMADEV_REQUIRE_NETNS") == "1":
        pytest.fail(f"{reason}, and RDMADEV_REQUIRE_NETNS=1 says it must be there")
    pytest.skip(reason)


def enter(name):
    """Moves this thread (and the threads it starts later) into network namespace `name`."""
    libc = ctypes.CDLL(None, use_errno=True)
    fd = os.open(f"/var/run/netns/{name}", os.O_RDONLY)
    try:
        if libc.setns(fd, CLONE_NEWNET) != 0:
            err = ctypes.get_errno()
            raise OSError(err, f"setns into {name} failed: {os.strerror(err)}")
    finally:
        os.close(fd)


def _ip(*args, ns=None):
    cmd = (["ip", "netns", "exec", ns, "ip"] if ns else ["ip"]) + list(args)
    subprocess.run(cmd, check=True, capture_output=True, text=True, timeout=30)


class VethPair:
    """Namespaces <tag>a and <tag>b with addresses SUBNET.1 and SUBNET.2.

    Example:
        >>> with VethPair("rdt") as net:
        ...     print(net.names, net.addresses)
    """

    def __init__(self, tag, mtu=1500):
        self.names = (f"{tag}a", f"{tag}b")
        self.addresses = (f"{SUBNET}.1", f"{SUBNET}.2")
        self.mtu = mtu

    def __enter__(self):
        self.close()  # leftovers of a killed run with the same tag
        a, b = self.names
        try:
            for ns in self.names:
                _ip("netns", "add", ns)
            _ip("link", "add", f"{a}v", "type", "veth", "peer", "name", f"{b}v")
            for ns, addr in zip(self.names, self.addresses):
                _ip("link", "set", f"{ns}v", "netns", ns)
                _ip("addr", "add", f"{addr}/24", "dev", f"{ns}v", ns=ns)
                _ip("link", "set", f"{ns}v", "mtu", str(self.mtu), "up", ns=ns)
                _ip("link", "set", "lo", "up", ns=ns)
        except BaseException:
            self.close()
            raise
        return self

    def close(self):
        for ns in self.names:
            subprocess.run(["ip", "netns", "del", ns], capture_output=True, timeout=30)

    def __exit__(self, *exc):
        self.close()
