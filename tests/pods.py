"""Pods on one machine, for tests: a network namespace per pod, each with its own address on a
bridge that lives in a namespace of its own (the "node"), and a hosts file that resolves every
pod's DNS name, as a Kubernetes cluster's DNS resolves a TFJob's headless services. Processes
run in a pod with ``ip netns exec``, which also puts ``/etc/netns/<pod>/hosts`` over
``/etc/hosts`` for them. Nothing reaches the host's own interfaces. Needs root and iproute2
(tests/netns.py's `require`)."""
import os
import shutil
import subprocess

from netns import _ip  # `ip`, in a namespace or not, checked

__all__ = ["Pods"]

#: A private /24 that exists only inside the namespaces this module creates (netns.py's is .77).
SUBNET = "10.231.78"


class Pods:
    """Namespaces ``<tag>-<i>`` for pods named `names` (DNS names), addresses SUBNET.2, .3, ...

    Example:
        >>> with Pods("rdk", ["job-ps-0.default.svc", "job-worker-0.default.svc"]) as pods:
        ...     subprocess.run(pods.command("job-ps-0.default.svc", ["getent", "hosts", "job-ps-0.default.svc"]))
    """

    def __init__(self, tag, names):
        self.tag, self.names = tag, list(names)
        self.netns = {name: f"{tag}-{i}" for i, name in enumerate(self.names)}
        self.address = {name: f"{SUBNET}.{i + 2}" for i, name in enumerate(self.names)}
        self.node = f"{tag}-node"

    def __enter__(self):
        self.close()  # leftovers of a killed run with the same tag
        try:
            _ip("netns", "add", self.node)
            _ip("link", "add", "br0", "type", "bridge", ns=self.node)
            _ip("link", "set", "br0", "up", ns=self.node)
            hosts = "127.0.0.1 localhost\n" + "".join(
                f"{self.address[n]} {n}\n" for n in self.names)
            for i, name in enumerate(self.names):
                ns, veth = self.netns[name], f"{self.tag}p{i}"
                _ip("netns", "add", ns)
                os.makedirs(f"/etc/netns/{ns}", exist_ok=True)
                with open(f"/etc/netns/{ns}/hosts", "w") as f:
                    f.write(hosts)
                _ip("link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", ns,
                    ns=self.node)
                _ip("link", "set", veth, "master", "br0", "up", ns=self.node)
                _ip("addr", "add", f"{self.address[name]}/24", "dev", "eth0", ns=ns)
                _ip("link", "set", "eth0", "up", ns=ns)
                _ip("link", "set", "lo", "up", ns=ns)
        except BaseException:
            self.close()
            raise
        return self

    def command(self, name, argv):
        """`argv` as run inside pod `name`."""
        return ["ip", "netns", "exec", self.netns[name]] + list(argv)

    def close(self):
        for ns in list(self.netns.values()) + [self.node]:
            subprocess.run(["ip", "netns", "del", ns], capture_output=True, timeout=30)
            shutil.rmtree(f"/etc/netns/{ns}", ignore_errors=True)

    def __exit__(self, *exc):
        self.close()
