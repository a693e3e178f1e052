"""A real loopback TensorFlow cluster for tests: 1 ps + 2 workers on 127.0.0.1 by default.

Each task is a ``tf.distribute.Server`` in its own process (``tests/tf_server_main.py`` unless a
custom launcher is given). All tasks start in parallel; readiness means every task's gRPC port
accepts a TCP connection. Processes are always killed: by ``stop()``, by leaving the ``with``
block, and at interpreter exit for a shared cluster.

Example (pytest)::

    import tf_cluster

    @pytest.fixture(scope="session")
    def cluster():
        return tf_cluster.shared_cluster()        # one cluster per test session, stopped at exit

    def test_something(cluster):
        tf_cluster.connect(cluster)               # this process becomes the coordinator
        with tf.device(cluster.device("ps", 0)): ...

Example (later issues: extra env vars and their own server command)::

    def launcher(job, index, spec_json):
        return [sys.executable, "-m", "rdmadev", "serve", "--cluster", spec_json, "--job", job,
                "--index", str(index)]
    with tf_cluster.Cluster(env={"RDMADEV_FABRIC": "shm"}, launcher=launcher) as c: ...
"""

import atexit
import json
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

__all__ = ["Cluster", "ClusterError", "free_ports", "shared_cluster", "connect", "SERVER_SCRIPT"]

log = logging.getLogger(__name__)
log.addHandler(logging.NullHandler())

#: The default per-task server program (see its docstring).
SERVER_SCRIPT = Path(__file__).resolve().with_name("tf_server_main.py")
#: Loopback only: test traffic must never leave the machine.
HOST = "127.0.0.1"
#: Seconds all tasks together may take to listen. One server takes 5-9 s to import TF and start on
#: an idle 2-core VM; three starting at once on a loaded box took up to ~40 s, so allow 3x that.
READY_TIMEOUT_S = 120.0
#: Seconds between readiness polls: short next to the 5-9 s start, cheap in CPU.
POLL_INTERVAL_S = 0.2
#: Seconds a task gets to exit after SIGTERM before it is SIGKILLed.
STOP_TIMEOUT_S = 10.0
#: Bytes of a failed task's log quoted in the error.
LOG_TAIL_BYTES = 3000


class ClusterError(RuntimeError):
    """A task failed to start or to become ready; the message names the task and quotes its log."""


def free_ports(count):
    """Pick ``count`` distinct free TCP ports on 127.0.0.1 by binding port 0.

    All sockets stay open until every port is chosen, so the ports are distinct; they are closed
    before returning (a tiny race remains with other programs, which ``Cluster`` reports clearly).

    Args:
        count: how many ports.

    Returns:
        A list of ``count`` port numbers.
    """
    socks = []
    try:
        for _ in range(count):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.bind((HOST, 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def _default_launcher(job, index, spec_json):
    return [sys.executable, str(SERVER_SCRIPT), "--cluster", spec_json, "--job", job, "--index", str(index)]


def _port_open(port):
    try:
        with socket.create_connection((HOST, port), timeout=0.5):
            return True
    except OSError:
        return False


class Cluster:
    """A set of TF server processes on 127.0.0.1, started in parallel; a context manager.

    Args:
        num_ps: number of ``ps`` tasks.
        num_workers: number of ``worker`` tasks.
        env: extra environment variables for every task (merged over ``os.environ``;
            ``TF_CPP_MIN_LOG_LEVEL`` defaults to 2).
        launcher: ``launcher(job, index, spec_json) -> argv`` builds each task's command; the
            default runs ``tests/tf_server_main.py``. The command must serve the task's address
            from the spec; readiness is judged by its port accepting connections.
        ready_timeout: seconds all tasks together may take to listen.
        log_dir: where each task's stdout+stderr go (``<job>-<index>.log``); by default a temp dir,
            removed by ``stop()`` (a start failure quotes the log in its error first).

    Attributes:
        spec: the cluster spec, ``{"ps": ["127.0.0.1:p", ...], "worker": [...]}``.
    """

    def __init__(self, num_ps=1, num_workers=2, env=None, launcher=None, ready_timeout=READY_TIMEOUT_S,
                 log_dir=None):
        ports = free_ports(num_ps + num_workers)
        self.spec = {"ps": [f"{HOST}:{p}" for p in ports[:num_ps]],
                     "worker": [f"{HOST}:{p}" for p in ports[num_ps:]]}
        self.env = dict(env or {})
        self.launcher = launcher or _default_launcher
        self.ready_timeout = ready_timeout
        self._own_log_dir = log_dir is None
        self.log_dir = Path(log_dir or tempfile.mkdtemp(prefix="tf_cluster_"))
        self._procs = {}  # (job, index) -> (Popen, log file object)

    def tasks(self):
        """Return ``[(job, index, "127.0.0.1:port"), ...]`` for every task."""
        return [(job, i, addr) for job, addrs in self.spec.items() for i, addr in enumerate(addrs)]

    def device(self, job, index, kind="CPU", number=0):
        """Return the full device name of a task, e.g. ``/job:ps/replica:0/task:0/device:CPU:0``."""
        return f"/job:{job}/replica:0/task:{index}/device:{kind}:{number}"

    def log_path(self, job, index):
        """Return the path of a task's log file."""
        return self.log_dir / f"{job}-{index}.log"

    def start(self):
        """Start every task in parallel and wait until all listen.

        Returns:
            self.

        Raises:
            ClusterError: a task exited early or did not listen within ``ready_timeout``; all
                tasks are stopped first and the message quotes the task's log.
        """
        env = dict(os.environ)
        env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
        env.update(self.env)
        spec_json = json.dumps(self.spec)
        for job, index, _ in self.tasks():
            logf = open(self.log_path(job, index), "wb")
            proc = subprocess.Popen(self.launcher(job, index, spec_json), stdout=logf, stderr=subprocess.STDOUT,
                                    stdin=subprocess.DEVNULL, env=env, start_new_session=True)
            self._procs[(job, index)] = (proc, logf)
            log.info("started %s:%d pid=%d", job, index, proc.pid)
        try:
            self._wait_ready()
        except BaseException:
            self.stop()
            raise
        return self

    def _wait_ready(self):
        deadline = time.monotonic() + self.ready_timeout
        pending = {(job, i): int(addr.rsplit(":", 1)[1]) for job, i, addr in self.tasks()}
        while pending:
            for key, port in list(pending.items()):
                proc = self._procs[key][0]
                if proc.poll() is not None:
                    raise ClusterError(f"TF task {key[0]}:{key[1]} exited with code {proc.returncode} before "
                                       f"listening on port {port}; its log:\n{self._tail(*key)}")
                if _port_open(port):
                    del pending[key]
            if not pending:
                break
            if time.monotonic() > deadline:
                names = ", ".join(f"{j}:{i}" for j, i in pending)
                raise ClusterError(f"TF tasks {names} did not listen within {self.ready_timeout:.0f} s; raise "
                                   f"ready_timeout on a loaded machine. Log of {names.split(',')[0]}:\n"
                                   f"{self._tail(*next(iter(pending)))}")
            time.sleep(POLL_INTERVAL_S)

    def _tail(self, job, index):
        try:
            data = self.log_path(job, index).read_bytes()
        except OSError as exc:
            return f"<no log: {exc}>"
        return data[-LOG_TAIL_BYTES:].decode("utf-8", "replace")

    def stop(self):
        """Stop every task (SIGTERM to its process group, SIGKILL after a grace period). Idempotent."""
        procs, self._procs = self._procs, {}
        for proc, _ in procs.values():
            if proc.poll() is None:
                try:
                    os.killpg(proc.pid, signal.SIGTERM)  # the group this helper created for the task
                except ProcessLookupError:
                    pass
        deadline = time.monotonic() + STOP_TIMEOUT_S
        for proc, logf in procs.values():
            try:
                proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                try:
                    os.killpg(proc.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                proc.wait(timeout=STOP_TIMEOUT_S)
            logf.close()
        if self._own_log_dir:
            shutil.rmtree(self.log_dir, ignore_errors=True)

    def alive(self):
        """Return True when every started task is still running."""
        return bool(self._procs) and all(p.poll() is None for p, _ in self._procs.values())

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()
        return False


_shared = {}
_connected = []


def shared_cluster(num_ps=1, num_workers=2):
    """Return a started cluster shared by the whole process (one per test session), stopped at exit.

    Args:
        num_ps: number of ps tasks (part of the cache key).
        num_workers: number of workers (part of the cache key).

    Returns:
        A started ``Cluster``.
    """
    key = (num_ps, num_workers)
    cluster = _shared.get(key)
    if cluster is None or not cluster.alive():
        if cluster is not None:
            cluster.stop()
        cluster = Cluster(num_ps=num_ps, num_workers=num_workers).start()
        _shared[key] = cluster
        atexit.register(cluster.stop)
    return cluster


def connect(cluster):
    """Make this process the cluster's coordinator (``/job:localhost``); idempotent per cluster.

    TF keeps one remote context per process, so connecting to a second cluster replaces the first.

    Args:
        cluster: a started ``Cluster``.
    """
    if _connected and _connected[-1] is cluster:
        return
    import tensorflow as tf
    # Pass the ClusterSpec itself: a SimpleClusterResolver without a master silently does nothing.
    tf.config.experimental_connect_to_cluster(tf.train.ClusterSpec(cluster.spec))
    _connected.append(cluster)
