"""A TF cluster of `rdmadev serve` tasks, one network namespace per task, for `cnn.py --netns`.

Each task gets namespace <tag>-<job><i> with one veth (`eth0`, SUBNET.<10+n>/24, MTU 1500)
whose other end is enslaved to a bridge <tag>br (SUBNET.1/24) in the root namespace, where the
coordinator runs. Traffic between tasks therefore crosses two veth links and the bridge, like
hosts on one switch, and the tcp fabric is forced (RDMADEV_FABRIC=tcp, RDMADEV_TCP_ADDR = the
task's address): shm would otherwise still be chosen (same kernel and pid namespace). Every
process, namespace, veth and the bridge are removed by ``stop()`` (also on errors). Root only.

Example::

    with NetnsCluster(1, 2, env={"RDMADEV_SECRET": "s"}) as c:
        tf.config.experimental_connect_to_cluster(tf.train.ClusterSpec(c.spec))
"""
import os
import shutil
import subprocess

from rdmadev.testing import launch

__all__ = ["NetnsCluster", "unavailable_reason", "SUBNET"]

#: A private /24 used only by the interfaces made here (tests/netns.py uses 10.231.77).
SUBNET = "10.231.78"
#: Every task listens on this port inside its own namespace (each has its own port space).
PORT = 2222
#: Seconds all tasks together may take to listen (as rdmadev.testing.launch: 5-40 s each on 2 cores).
READY_TIMEOUT_S = 120.0


def unavailable_reason():
    """Why namespaces cannot be made here ("" if they can)."""
    if os.geteuid() != 0:
        return "--netns needs root (network namespaces)"
    if not shutil.which("ip"):
        return "--netns needs iproute2's `ip`"
    return ""


def _ip(*args, ns=None, check=True):
    cmd = (["ip", "netns", "exec", ns, "ip"] if ns else ["ip"]) + list(args)
    return subprocess.run(cmd, check=check, capture_output=True, text=True, timeout=30)


class NetnsCluster(launch.Cluster):
    """num_ps + num_workers `rdmadev serve` tasks, each in its own namespace; a context manager.

    Args:
        num_ps, num_workers: task counts.
        env: extra environment for every task (RDMADEV_SECRET at least).

    Attributes:
        spec: the cluster spec with the namespace addresses.
        bridge_address: the coordinator's address on the bridge (root namespace).
    """

    def __init__(self, num_ps, num_workers, env=None):
        self.tag = f"rdc{os.getpid() % 100000}"
        self.bridge, self.bridge_address = f"{self.tag}br", f"{SUBNET}.1"
        tasks = [("ps", i) for i in range(num_ps)] + [("worker", i) for i in range(num_workers)]
        self.addr = {t: f"{SUBNET}.{10 + n}" for n, t in enumerate(tasks)}
        spec = {job: [f"{self.addr[(j, i)]}:{PORT}" for j, i in tasks if j == job] for job in ("ps", "worker")}
        self.namespaces = []
        super().__init__(num_ps, num_workers, env=env, launcher=self._in_namespace,
                         ready_timeout=READY_TIMEOUT_S, spec=spec)

    def _ns(self, job, index):
        return f"{self.tag}-{job}{index}"

    def _in_namespace(self, job, index, spec_json):
        """`rdmadev serve` inside the task's namespace, forced onto tcp at its address."""
        return (["ip", "netns", "exec", self._ns(job, index), "env", "RDMADEV_FABRIC=tcp",
                 f"RDMADEV_TCP_ADDR={self.addr[(job, index)]}:0"]
                + launch.rdmadev_launcher(job, index, spec_json))

    def start(self):
        try:
            _ip("link", "add", self.bridge, "type", "bridge")
            self.namespaces.append(None)  # marks the bridge as made
            _ip("addr", "add", f"{self.bridge_address}/24", "dev", self.bridge)
            _ip("link", "set", self.bridge, "up")
            for n, (job, index, _) in enumerate(self.tasks()):
                ns, host_end = self._ns(job, index), f"{self.tag}v{n}"
                _ip("netns", "add", ns)
                self.namespaces.append(ns)
                _ip("link", "add", host_end, "type", "veth", "peer", "name", "eth0", "netns", ns)
                _ip("link", "set", host_end, "master", self.bridge, "up")
                _ip("addr", "add", f"{self.addr[(job, index)]}/24", "dev", "eth0", ns=ns)
                _ip("link", "set", "eth0", "up", ns=ns)
                _ip("link", "set", "lo", "up", ns=ns)
        except BaseException:
            self.stop()
            raise
        return super().start()  # stops everything (namespaces too) if a task fails to start

    def stop(self):
        super().stop()
        for n, ns in enumerate(ns for ns in self.namespaces if ns is not None):
            # the namespace's teardown is asynchronous and can keep the pair alive for a long
            # while (seen: minutes); delete the host end explicitly, which removes both ends
            _ip("link", "del", f"{self.tag}v{n}", check=False)
            subprocess.run(["ip", "netns", "del", ns], capture_output=True, timeout=30)
        if self.namespaces:
            _ip("link", "del", self.bridge, check=False)
        self.namespaces = []
