"""This process's place in a TF cluster: its task, its Domain, its control service, and
control clients to the other tasks. A task server (`rdmadev serve`) has all of them; the
coordinator has only clients (its own traffic to the tasks stays on gRPC).

Example:
    >>> rt = runtime.start({"ps": ["10.0.0.1:2222"], "worker": [...]}, "ps", 0)
"""
import json
import logging
import os
import threading

from . import _core
from .config import Config
from .control import ControlClient, ControlServer, control_address
from .device import open_domain
from .errors import ConfigError
from .pair import CREDIT_BYTES

__all__ = ["Runtime", "start", "current", "parse_cluster", "task_name"]

log = logging.getLogger(__name__)
log.addHandler(logging.NullHandler())

_current = None
_lock = threading.Lock()


def parse_cluster(cluster):
    """A cluster spec as {job: [address, ...]} from a dict, a JSON string or TF_CONFIG.

    Raises:
        ConfigError: naming what is wrong and the expected form.
    """
    if cluster is None:
        text = os.environ.get("TF_CONFIG", "")
        if not text:
            raise ConfigError("no cluster spec: neither given nor in TF_CONFIG",
                              hint='set TF_CONFIG=\'{"cluster": {"ps": ["host:port"], "worker": '
                                   '[...]}, "task": {"type": "worker", "index": 0}}\' or pass --cluster')
        try:
            cluster = json.loads(text).get("cluster")
        except (ValueError, AttributeError) as e:
            raise ConfigError(f"TF_CONFIG is not valid JSON with a 'cluster' key: {e}",
                              hint="fix TF_CONFIG's JSON") from None
    if isinstance(cluster, str):
        try:
            cluster = json.loads(cluster)
        except ValueError as e:
            raise ConfigError(f"cluster spec is not valid JSON: {e}",
                              hint='pass {"job": ["host:port", ...], ...}') from None
    if hasattr(cluster, "as_dict"):
        cluster = cluster.as_dict()
    if not isinstance(cluster, dict) or not cluster:
        raise ConfigError(f"cluster spec must be a non-empty mapping, got {cluster!r}",
                          hint='pass {"job": ["host:port", ...], ...}')
    out = {}
    for job, addrs in cluster.items():
        if isinstance(addrs, dict):  # {index: address}
            addrs = [addrs[k] for k in sorted(addrs, key=int)]
        if not isinstance(addrs, (list, tuple)) or not all(
                isinstance(a, str) and a.rpartition(":")[2].isdigit() for a in addrs):
            raise ConfigError(f"cluster spec job {job!r}: {addrs!r} is not a list of host:port",
                              hint='pass {"job": ["host:port", ...], ...}')
        out[str(job)] = list(addrs)
    return out


def task_name(job, index):
    return f"/job:{job}/replica:0/task:{index}"


def _split_task(task):
    parts = dict(p.split(":", 1) for p in task.strip("/").split("/") if ":" in p)
    return parts["job"], int(parts["task"])


class Runtime:
    """See the module docstring. `job`/`index` None: the coordinator."""

    def __init__(self, cluster, job=None, index=None, config=None):
        self.cluster = parse_cluster(cluster)
        self.config = config or Config.from_env()
        if not self.config.secret:
            raise ConfigError("RDMADEV_SECRET is not set",
                              hint="set the same RDMADEV_SECRET (or RDMADEV_SECRET_FILE) in every "
                                   "task and in the coordinator")
        self.task = None
        self.domain = None
        self.server = None
        self.clients = {}
        self.endpoints = {}
        self.regions = {}
        self.channels = {}
        self.reports = []
        self.lock = threading.RLock()
        if job is not None:
            if job not in self.cluster or not 0 <= index < len(self.cluster[job]):
                raise ConfigError(f"task {job}:{index} is not in the cluster spec {self.cluster}",
                                  hint="pass a --job/--task that the cluster spec lists")
            self.task = task_name(job, index)
            host = self.cluster[job][index].rpartition(":")[0].strip("[]")
            self.domain = open_domain(f"{job}:{index}", self.config, tcp_addr=f"{host}:0")
            self.server = ControlServer(control_address(self.cluster[job][index]),
                                        self.config.secret, self.handle)

    # --- control requests served by this task -------------------------------------------
    def handle(self, request):
        op = request.get("op")
        if op == "ping":
            return {"task": self.task, "address": self.domain.address}
        if op == "alloc_region":
            return self._alloc_region(request)
        if op == "send_channel":
            return self._send_channel(request)
        if op == "recv_channel":
            return self._recv_channel(request)
        if op == "reports":
            from . import tf_pass
            return [str(r) for r in tf_pass.reports()]
        if op == "pass_mode":
            from . import api
            api.load_into_process(auto=bool(request["auto"]))
            return {"auto": bool(request["auto"])}
        raise ValueError(f"unknown control request {op!r}")

    def _endpoint(self, address):
        with self.lock:
            ep = self.endpoints.get(address)
            if ep is None or not ep.alive()[0]:
                ep = self.endpoints[address] = self.domain.connect(address, self.config.fabric,
                                                                   timeout=self.config.deadline_s)
            return ep

    def _alloc_region(self, r):
        with self.lock:
            region = self.regions.get(r["region"])
            if region is None:
                sender_job, sender_index = _split_task(r["sender"])
                region = self.domain.allocate(r["bytes"], label=r["region"],
                                              grant=[f"{sender_job}:{sender_index}"])
                self.regions[r["region"]] = region
        return {"address": self.domain.address, "descriptor": region.descriptor.hex()}

    def _send_channel(self, r):
        ep = self._endpoint(r["receiver_address"])
        credit = self.domain.allocate(CREDIT_BYTES, label="credit")
        tx = _core.RingSender(ep, ep.attach(bytes.fromhex(r["ring"])), r["slots"], r["capacity"],
                              credit, 0, r["offset"])
        tx.bind(r["key"])
        with self.lock:
            self.channels[r["key"]] = tx
        return {"address": self.domain.address, "credit": credit.descriptor.hex(),
                "fabric": ep.fabric}

    def _recv_channel(self, r):
        ep = self._endpoint(r["sender_address"])
        rx = _core.RingReceiver(self.regions[r["region"]], r["slots"], r["capacity"], ep,
                                ep.attach(bytes.fromhex(r["credit"])), 0, r["offset"])
        rx.bind(r["key"])
        with self.lock:
            self.channels[r["key"]] = rx
        return {"fabric": ep.fabric}

    # --- requests to other tasks ----------------------------------------------------------
    def call(self, task, request):
        """Runs `request` on `task` (here if it is this task) and returns the result."""
        if task == self.task:
            return self.handle(request)
        with self.lock:
            client = self.clients.get(task)
            if client is None:
                job, index = _split_task(task)
                if job not in self.cluster or index >= len(self.cluster[job]):
                    raise ConfigError(f"task {task} is not in the cluster spec",
                                      hint="the coordinator and every task need the same spec")
                client = self.clients[task] = ControlClient(
                    control_address(self.cluster[job][index]), self.config.secret,
                    timeout=self.config.deadline_s)
        return client.call(request)

    def close(self):
        for key in list(self.channels):
            _core.unbind_channel(key)
        self.channels.clear()
        for c in self.clients.values():
            c.close()
        if self.server:
            self.server.close()
        if self.domain:
            self.domain.close()


def start(cluster, job=None, index=None, config=None):
    """Creates this process's runtime (once) and returns it."""
    global _current
    with _lock:
        if _current is None:
            _current = Runtime(cluster, job, index, config)
        return _current


def current():
    """This process's runtime, or None."""
    return _current
