"""A task's place in a TF cluster: its Domain, its control service, and control links to
the other tasks (links.py). A task server (`rdmadev serve`, a ``grpc+rdmadev`` server) has all
of them; the coordinator has only links it dials (its own traffic to the tasks stays on gRPC). One process
may run several: TF's in-process clusters host every ps and worker server, and often the
coordinator, in one process, and each task gets a runtime of its own (``start`` per task,
``of_task`` to find it; ``current`` is the one a coordinator's calls go through).

The runtime knows nothing of TensorFlow: requests it does not serve itself (e.g. the TF
layer's ``pass_mode``) are served by handlers registered with ``register_handler``.

Example:
    >>> rt = runtime.start({"ps": ["10.0.0.1:2222"], "worker": [...]}, "ps", 0)
    >>> rt.call(task_name("ps", 0), {"op": "ping"})
"""
import contextlib
import dataclasses
import errno
import logging
import socket
import sys
import threading

from graph_pass.devices import split_task, task_name

from ..config import Config
from ..device import open_domain
from ..errors import ConfigError, ProtocolError, RdmadevError, errno_hint
from . import facts, instances, limits, open_files, reports
from .channels import REQUESTS as CHANNEL_REQUESTS, ChannelTable
from .control import ControlClient, ControlServer, control_address
from .event_loop import EventLoop
from .links import Links
from .liveness import Heartbeats
from .spec import parse_cluster, split_address

__all__ = ["Runtime", "checked", "start", "current", "of_task", "register_handler",
           "log_to_stderr"]

_runtimes = {}  # task (None: the coordinator) -> its Runtime in this process, in start order
_lock = threading.Lock()
# Control requests served by other layers: op -> handler(request) -> JSON-able result.
_handlers = {"release_function": instances.release_function,
             "own_function": instances.own_function}


def register_handler(op, handler):
    """Serves control request `op` with ``handler(request: dict)`` in every runtime of this
    process (the TF layer registers ``pass_mode`` this way). Re-registering replaces."""
    _handlers[op] = handler


def checked(cluster, job=None, index=None, config=None):
    """(cluster spec, Config) of a runtime for task `job`:`index` (None: the coordinator),
    checked before anything starts: a spec that parses and lists the task, and a Config
    (default: from the environment) with a cluster secret. `rdmadev serve` calls it before it
    imports TensorFlow, so a bad configuration is reported in a fraction of a second.

    Raises:
        ConfigError: naming what is wrong and the fix.
    """
    cluster = parse_cluster(cluster)
    config = config or Config.from_env()
    if not config.secret:
        raise ConfigError("RDMADEV_SECRET is not set",
                          hint="set the same RDMADEV_SECRET (or RDMADEV_SECRET_FILE) in every "
                               "task and in the coordinator")
    if job is not None and (job not in cluster or not 0 <= index < len(cluster[job])):
        raise ConfigError(f"task {job}:{index} is not in the cluster spec {cluster}",
                          hint="pass a --job/--task that the cluster spec lists; the "
                               "coordinator and every task need the same spec")
    return cluster, config


class Runtime:
    """See the module docstring. `job`/`index` None: the coordinator."""

    def __init__(self, cluster, job=None, index=None, config=None):
        self.cluster, self.config = checked(cluster, job, index, config)
        self.task = None
        self.domain = None
        self.server = None
        self.table = None
        self.heartbeats = None
        self.loop = None  # its EventLoop: the control service, links and heartbeats run there
        self.closed = False
        self.lock = threading.RLock()
        if job is not None:
            self.task = task_name(job, index)
        self.links = Links(self.name, self._control_address, self.config.secret, self.handle,
                           self._loop, self.config.deadline_s, heard=self._heard)
        if job is not None:
            address = self._address(job, index)
            limits.raise_soft_limits()  # a ps holds ~10 descriptors and a ring per worker
            open_files.check(self.task, peers=sum(map(len, self.cluster.values())))  # + coordinator
            host, port = split_address(address, job)
            with _holding(port, self.task):
                self.domain = open_domain(f"{job}:{index}", self.config, tcp_addr=f"{host}:0")
                self.table = ChannelTable(self.domain, self.config, call=self.call, task=self.task)
                self.loop = EventLoop(self.task)
                self.server = self._control_server(address)
            if self.config.liveness_s > 0:
                self.heartbeats = Heartbeats(self.config.liveness_s, self.table.peer_endpoints,
                                             self.task, self.config.secret,
                                             self.server.listener, self._control_address,
                                             self._ping_on_link, self.loop)

    def _control_server(self, address):
        """This task's control service, at its TF port +- RDMADEV_CONTROL_PORT_OFFSET; a port
        it cannot listen on closes what the runtime opened and is a ConfigError naming it."""
        offset = self.config.control_port_offset
        host, port = control_address(address, offset)
        try:
            return ControlServer((host, port), self.config.secret, self.handle, self.loop,
                                 on_link=self._offered)
        except OSError as e:
            self.close()
            busy = e.errno == errno.EADDRINUSE
            raise ConfigError(
                f"task {self.task}'s rdmadev control service cannot listen on {host}:{port} "
                f"(its TF address {address} +- RDMADEV_CONTROL_PORT_OFFSET={offset}): "
                f"{e.strerror or e}",
                hint=("another process holds that port; a port picked inside the kernel's "
                      "ephemeral range (ip_local_port_range; portpicker picks there) may be "
                      "any connection's. Give tasks TF ports whose port + offset is free, "
                      "below that range, or set another RDMADEV_CONTROL_PORT_OFFSET, the same "
                      "in every task and the coordinator") if busy
                else errno_hint(e.errno, "check the task's address")) from None

    @property
    def name(self):
        """This runtime's task, or "coordinator": how its reports and control clients name it."""
        return self.task or "coordinator"

    def _address(self, job, index):
        checked(self.cluster, job, index, self.config)
        return self.cluster[job][index]

    def handle(self, request):
        """Serves one control request (from another task, or from call() to this task)."""
        op = request.get("op")
        if op == "ping":  # a peer's heartbeat says who sent it: that peer runs
            if self.heartbeats is not None and isinstance(request.get("from"), str):
                self.heartbeats.heard_from(request["from"])
            return {"task": self.task, "address": self.domain.address}
        if op == "facts":  # what `rdmadev doctor --peer` judges the pair by
            return facts.facts(self.config, self.domain, self.task)
        if op == "reports":  # those this task planned: its process may plan for others too
            return [dataclasses.asdict(r) for r in reports.reports()
                    if r.task == self.name]
        if op == "counters" and self.table is not None:
            return {**self.table.counters(request),
                    "control_connections": self._control_connections(),
                    "heard_by_datagram": self.heartbeats.heard_by_datagram()
                    if self.heartbeats else 0}
        if op in CHANNEL_REQUESTS and self.table is not None:
            return self.table.handle(request)
        handler = _handlers.get(op)
        if handler is None:
            raise ProtocolError(f"unknown control request {op!r} at {self.task or 'the coordinator'}; "
                                f"this runtime serves ping, {', '.join(CHANNEL_REQUESTS)}, "
                                f"{', '.join(sorted(_handlers))}",
                                hint="run the same rdmadev version in every task; the TF layer's "
                                     "requests exist once rdmadev.tf is imported (rdmadev serve does)")
        return handler(request)

    def call(self, task, request):
        """Runs `request` on `task` (here if it is this task) and returns the result, on the
        control link between the two (links.py)."""
        if task == self.task:
            return self.handle(request)
        return self.links.call(task, request)

    def answers(self, task, timeout):
        """Whether `task` answers a ping on a fresh control connection within `timeout`
        seconds (connect and answer each): a task whose process is gone refuses at once."""
        try:
            client = self._connect(task, timeout)
            try:
                client.call({"op": "ping"})
            finally:
                client.close()
            return True
        except (RdmadevError, OSError):
            return False

    def _offered(self, name, link, request):
        """A peer offered the connection it dialed for calls back (ControlServer's on_link):
        another task of the cluster's offer is for Links to judge; a coordinator is called by
        nobody, so its link is only served."""
        try:
            job, index = split_task(name)
            task = name != self.task and 0 <= index < len(self.cluster.get(job, ()))
        except ValueError:
            task = False
        return self.links.offered(name, link, request) if task else {"kept": True}

    def _heard(self, task):
        if self.heartbeats is not None:
            self.heartbeats.heard_from(task)

    async def _ping_on_link(self, task, timeout):
        """Pings `task` on the link to it (the heartbeats' way when datagrams do not pass),
        dialing one on a worker when there is none."""
        loop = self.loop.loop
        link, _ = await loop.run_in_executor(self.loop.workers, self.links.get, task)
        return await link.ask({"op": "ping", "from": self.task}, timeout)

    def _loop(self):
        """The EventLoop links are served on: the task's, or the coordinator's own, started at
        its first call."""
        with self.lock:
            if self.loop is None:
                self.loop = EventLoop(self.name)
            return self.loop

    def _control_connections(self):
        """``{"links", "served", "heartbeats"}``: this task's control descriptors, none a
        thread (the task's event loop serves them: event_loop.py): its links to peer tasks,
        one per peer whichever dialed it (links.py), the other connections it serves (of
        coordinators and tools), and its heartbeat socket (liveness.py: 1, or 0 when it could
        not bind)."""
        links, accepted = self.links.count()
        beats = int(self.heartbeats is not None and self.heartbeats.sock is not None)
        return {"links": links, "served": self.server.connections - accepted,
                "heartbeats": beats}

    def _control_address(self, task):
        return control_address(self._address(*split_task(task)), self.config.control_port_offset)

    def _connect(self, task, timeout):
        """A new connection to `task`'s control service for one call at a time (its connect
        and each answer bounded by `timeout` seconds)."""
        return ControlClient(self._control_address(task), self.config.secret, timeout=timeout,
                             name=self.name)

    def close(self):
        if self.heartbeats:
            self.heartbeats.close()
        if self.table:
            self.table.close()
        with self.lock:
            self.closed = True
        self.links.close()
        if self.server:
            self.server.close()
        if self.loop:
            self.loop.close()
        if self.domain:
            self.domain.close()


@contextlib.contextmanager
def _holding(port, task):
    """Keeps the task's TF port bound, on every address as TF's gRPC server binds it, while the
    runtime opens its own listeners: their binds of port 0 cannot take it then. (One did, with a
    port inside the kernel's ephemeral range: TF's server then failed to start while its port
    looked open.) A port another process listens on is reported here, by name; TF would say
    only "Could not start gRPC server". SO_REUSEADDR lets the hold pass connections in
    TIME_WAIT from a previous run of the task, as TF's own bind does."""
    try:
        hold, wildcard = socket.socket(socket.AF_INET6, socket.SOCK_STREAM), "::"
    except OSError:  # a kernel without IPv6
        hold, wildcard = socket.socket(socket.AF_INET, socket.SOCK_STREAM), "0.0.0.0"
    try:
        if hold.family == socket.AF_INET6:
            hold.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)  # IPv4 too, as TF's
        hold.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            hold.bind((wildcard, port))
        except OSError as e:
            if e.errno != errno.EADDRINUSE:
                raise
            raise ConfigError(f"{task}'s port {port} is in use: another process listens on it",
                              hint=f"stop that process (an earlier run of this task? `ss -ltnp "
                                   f"'sport = :{port}'` names it), or give the task a free port "
                                   f"in the cluster spec") from None
        yield
    finally:
        hold.close()


def log_to_stderr():
    """Sends rdmadev's warnings to stderr, prefixed with the logger and pid (the core's own lines
    read ``rdmadev[pid]: ...``). For processes rdmadev owns, such as `rdmadev serve`: as a
    library rdmadev leaves logging to the application."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(levelname)s %(name)s[%(process)d]: %(message)s"))
    root = logging.getLogger("rdmadev")
    root.addHandler(handler)
    root.setLevel(logging.WARNING)


def start(cluster, job=None, index=None, config=None):
    """The runtime of task `job`:`index` (None: the coordinator) in this process, created at
    the first call for that task (a later one returns it as it is)."""
    task = None if job is None else task_name(job, index)
    with _lock:
        if task not in _runtimes:
            _runtimes[task] = Runtime(cluster, job, index, config)
        return _runtimes[task]


def current():
    """The runtime a coordinator's calls go through: this process's coordinator runtime, else
    the first task runtime it started (a task process), else None."""
    with _lock:
        return _runtimes.get(None) or next(iter(_runtimes.values()), None)


def of_task(task):
    """The runtime of `task` ("/job:worker/replica:0/task:1") in this process: the one the
    pass plans a task's partitions with when it can tell the task (pass.cc,
    PartitioningTask). Without one (a function's partitions span tasks: TF does not tell
    the pass which of them instantiates), current()."""
    with _lock:
        own = _runtimes.get(task)
    return own or current()
