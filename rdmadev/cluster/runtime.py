"""A task's place in a TF cluster: its Domain, its control service, and control clients to
the other tasks. A task server (`rdmadev serve`, a ``grpc+rdmadev`` server) has all of them;
the coordinator has only clients (its own traffic to the tasks stays on gRPC). One process
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
from ..errors import ConfigError, PeerLostError, ProtocolError, RdmadevError, errno_hint
from . import facts, instances, limits, open_files, reports
from .channels import REQUESTS as CHANNEL_REQUESTS, ChannelTable
from .control import ControlClient, ControlServer, control_address
from .event_loop import EventLoop
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
        self.loop = None  # its EventLoop: the control service and heartbeats run there
        self.clients = {}  # task -> its idle control connections (_take, _give_back)
        self.closed = False
        self.lock = threading.RLock()
        if job is not None:
            address = self._address(job, index)
            self.task = task_name(job, index)
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
                                             self._connect, self.task, self.loop)

    def _control_server(self, address):
        """This task's control service, at its TF port +- RDMADEV_CONTROL_PORT_OFFSET; a port
        it cannot listen on closes what the runtime opened and is a ConfigError naming it."""
        offset = self.config.control_port_offset
        host, port = control_address(address, offset)
        try:
            return ControlServer((host, port), self.config.secret, self.handle, self.loop)
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
                    "control_connections": self._control_connections()}
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
        """Runs `request` on `task` (here if it is this task) and returns the result, on a
        control connection no other call uses meanwhile (see _take). An idle connection the
        task closed (it restarted since) is replaced once: the request never reached the new
        incarnation, so sending it again is safe. One that timed out is not: the task may
        still be serving it."""
        if task == self.task:
            return self.handle(request)
        for retry in (False, True):
            client, fresh = self._take(task, fresh=retry)
            try:
                return client.call(request)
            except PeerLostError:
                if fresh:
                    raise
            finally:
                self._give_back(task, client)

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

    def _take(self, task, fresh=False):
        """A control connection to `task` for one call, and whether it was just connected: an
        idle one, else a new one. Calls never share a connection: a request's handler may call
        back into this task, which may call the same task again (reopen does, on both tasks at
        once after a break), and calls queued on one connection then waited for each other
        until their deadline."""
        with self.lock:
            idle = self.clients.get(task)
            if idle and not fresh:
                return idle.pop(), False
        return self._connect(task, self.config.deadline_s), True

    def _give_back(self, task, client):
        """Keeps `client` for the next call to `task`, or closes it when a call on it failed
        midway or the runtime closed. A healthy one is never closed before: the task ties
        what this process owns there to the connection it asked on (control.Session), so
        there are as many as calls were ever in flight to that task at once (a few)."""
        with self.lock:
            if not client.broken and not self.closed:
                self.clients.setdefault(task, []).append(client)
                return
        client.close()

    def _control_connections(self):
        """``{"kept", "served", "heartbeats"}``: this task's control connections, each one
        descriptor and none a thread (the task's event loop serves them: event_loop.py): those
        kept idle for its next calls (_give_back), those of peers it serves, and its
        heartbeats' pings (liveness.py). Kept and served grow to the most calls ever in flight
        at once between two tasks; served ones end with their peer, and kept ones to a task
        that went close at the next call to it."""
        with self.lock:
            kept = sum(len(clients) for clients in self.clients.values())
        beats = self.heartbeats.connections() if self.heartbeats else 0
        return {"kept": kept, "served": self.server.connections, "heartbeats": beats}

    def _connect(self, task, timeout):
        """A new control connection to `task` (its connect and each answer bounded by
        `timeout` seconds)."""
        address = self._address(*split_task(task))
        return ControlClient(control_address(address, self.config.control_port_offset),
                             self.config.secret, timeout=timeout,
                             name=self.name)

    def close(self):
        if self.heartbeats:
            self.heartbeats.close()
        if self.table:
            self.table.close()
        with self.lock:
            self.closed = True
            idle = [c for clients in self.clients.values() for c in clients]
        for c in idle:
            c.close()
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
