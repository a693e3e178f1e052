"""A TensorFlow cluster on 127.0.0.1 for examples, benchmarks and tests: one process per
task, all started in parallel, always killed (by stop(), or by the cluster's reaper process
when the process that started them dies without stopping them). By default every task runs
`rdmadev serve`.

Example::

    with rdmadev.testing.launch.Cluster(num_ps=1, num_workers=2, env={"RDMADEV_SECRET": "s"}) as c:
        tf.config.experimental_connect_to_cluster(tf.train.ClusterSpec(c.spec))
        ...

``launcher(job, index, spec_json) -> argv`` replaces the task command (tests use plain TF
servers that way). Readiness means every task's gRPC port accepts connections; an
`rdmadev serve` task opens its control service before its gRPC port.
"""

import contextlib
import json
import logging
import os
import random
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from graph_pass.devices import task_name

from ..cluster.control import control_address
from ..config import Config
from ..cluster.spec import parse_cluster, split_address
from . import reaper

__all__ = ["Cluster", "ClusterError", "coordinated", "free_ports", "pss_coordinator",
           "rdmadev_launcher", "release_remote_functions"]

log = logging.getLogger(__name__)
log.addHandler(logging.NullHandler())

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
#: Seconds between two looks at the tasks of a started cluster for one that exited on its own
#: (Cluster._watch): TF waits for a lost task, often for good, so a job would hang silently.
WATCH_INTERVAL_S = 1.0
#: Lowest port free_ports picks; see ephemeral_floor.
PORT_FLOOR = 10000
#: "I/N": free_ports picks from the I-th of N disjoint slices of its range, so that N runs
#: starting clusters at once on one host (tests under pytest-xdist: tests/conftest.py) never
#: pick each other's ports in the moment between a pick and the task's bind.
PORT_SLICE_ENV = "RDMADEV_PORT_SLICE"
#: Ports free_ports tries before it gives up (about half of the range qualifies by default).
PICK_ATTEMPTS = 1000


def ephemeral_floor():
    """The lowest port of the kernel's ephemeral range (ip_local_port_range; 32768 by default):
    task ports are picked below it. One picked inside it was once taken by a task's own rdmadev
    listener (port 0) before TF bound it: that task's server failed to start while its port
    looked open, and the job waited for it (test_example, 2026-11-29). Unknown: 0, and
    free_ports binds port 0."""
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 0


def _pick_range(floor):
    """[low, high) of the ports free_ports picks: PORT_FLOOR up to the ephemeral `floor` or,
    with PORT_SLICE_ENV set to "I/N", the I-th of N slices of [PORT_FLOOR, PORT_FLOOR +
    offset): the control ports (port + RDMADEV_CONTROL_PORT_OFFSET) then lie in the I-th slice
    of the next `offset` ports, apart from every slice's task ports too."""
    sliced = os.environ.get(PORT_SLICE_ENV)
    if not sliced or floor <= PORT_FLOOR:
        return PORT_FLOOR, floor
    try:
        i, n = (int(x) for x in sliced.split("/"))
        if not 0 <= i < n:
            raise ValueError
    except ValueError:
        raise ValueError(f"{PORT_SLICE_ENV}={sliced!r} is not I/N with 0 <= I < N") from None
    offset = Config.from_env().control_port_offset
    if PORT_FLOOR + 2 * offset > floor:  # the slices' control ports would reach the floor
        return PORT_FLOOR, floor
    width = offset // n
    return PORT_FLOOR + i * width, PORT_FLOOR + (i + 1) * width


class ClusterError(RuntimeError):
    """A task failed to start or to become ready; the message names the task and quotes its log."""


def free_ports(count):
    """Pick ``count`` distinct free TCP ports on 127.0.0.1 for TF tasks, each with the port its
    rdmadev control service will use (control_address) free too.

    Both come from below the kernel's ephemeral range (PORT_FLOOR, ephemeral_floor()), so that
    no bind of port 0 can take them between this pick and the task's own bind: a task's rdmadev
    listeners and every outgoing connection take ephemeral ports. Every socket stays open
    until all ports are chosen, so they are distinct; a race remains only with programs that
    bind fixed ports, which ``Cluster`` reports.

    Args:
        count: how many ports.

    Returns:
        A list of ``count`` port numbers.
    """
    floor = ephemeral_floor()
    low, high = _pick_range(floor)
    picks = random.Random()
    socks = []
    try:
        for _ in range(PICK_ATTEMPTS):
            if len(socks) == 2 * count:
                break
            port = picks.randrange(low, high) if high > low else 0
            held = []
            try:
                s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
                held.append(s)
                s.bind((HOST, port))
                port = s.getsockname()[1]
                control = control_address(f"{HOST}:{port}")[1]
                if floor > PORT_FLOOR and control >= floor:
                    raise OSError("control port in the ephemeral range")
                c = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
                held.append(c)
                c.bind((HOST, control))
            except OSError:
                for h in held:
                    h.close()
                continue
            socks += held
        if len(socks) < 2 * count:
            raise ClusterError(f"found only {len(socks) // 2} of {count} free port pairs below "
                               f"port {floor} in {PICK_ATTEMPTS} attempts")
        return [s.getsockname()[1] for s in socks[::2]]
    finally:
        for s in socks:
            s.close()


def rdmadev_launcher(job, index, spec_json):
    """The default task command: `python -m rdmadev.server` for this task."""
    return [sys.executable, "-m", "rdmadev.server", "--cluster", spec_json, "--job", job,
            "--task", str(index)]


def _port_open(host, port):
    try:
        with socket.create_connection((host, port), timeout=0.5):
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
            default runs ``rdmadev serve``. The command must serve the task's address
            from the spec; readiness is judged by its port accepting connections.
        ready_timeout: seconds all tasks together may take to listen.
        log_dir: where each task's stdout+stderr go (``<job>-<index>.log``); by default a temp dir,
            removed by ``stop()`` (a start failure quotes the log in its error first).
        spec: the cluster spec to serve (default: free ports on 127.0.0.1); readiness is
            judged at each task's own address.

    Attributes:
        spec: the cluster spec, ``{"ps": ["127.0.0.1:p", ...], "worker": [...]}``.
    """

    def __init__(self, num_ps=1, num_workers=2, env=None, launcher=None, ready_timeout=READY_TIMEOUT_S,
                 log_dir=None, spec=None):
        if spec is None:
            ports = free_ports(num_ps + num_workers)
            spec = {"ps": [f"{HOST}:{p}" for p in ports[:num_ps]],
                    "worker": [f"{HOST}:{p}" for p in ports[num_ps:]]}
        self.spec = parse_cluster(spec)
        self.env = dict(env or {})
        self.launcher = launcher or rdmadev_launcher
        self.ready_timeout = ready_timeout
        self._own_log_dir = log_dir is None
        self.log_dir = Path(log_dir or tempfile.mkdtemp(prefix="tf_cluster_"))
        self._procs = {}  # (job, index) -> (Popen, log file object)
        self._killed = set()  # (job, index) ended by kill(), until restart()
        self._stopping = threading.Event()
        self._watcher = None
        self._reaper = None  # ends the tasks if this process dies without stopping them
        self._reaper_lock = threading.Lock()  # the watcher thread tells it too

    def tasks(self):
        """Return ``[(job, index, "127.0.0.1:port"), ...]`` for every task."""
        return [(job, i, addr) for job, addrs in self.spec.items() for i, addr in enumerate(addrs)]

    def device(self, job, index, kind="CPU", number=0):
        """Return the full device name of a task, e.g. ``/job:ps/replica:0/task:0/device:CPU:0``."""
        return f"{task_name(job, index)}/device:{kind}:{number}"

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
        self._stopping.clear()
        self._reaper = subprocess.Popen([sys.executable, "-I", reaper.__file__, str(STOP_TIMEOUT_S)],
                                        stdin=subprocess.PIPE, start_new_session=True, text=True)
        for job, index, _ in self.tasks():
            self._spawn(job, index)
        try:
            self._wait_ready()
        except BaseException:
            self.stop()
            raise
        self._watcher = threading.Thread(target=self._watch, daemon=True, name="tf-cluster-watch")
        self._watcher.start()
        return self

    def _watch(self):
        """Says on stderr, once per process, that a task exited on its own while the cluster
        runs (not by kill() or stop()), with its exit code and the end of its log."""
        told = set()
        while not self._stopping.wait(WATCH_INTERVAL_S):
            for key, (proc, _) in list(self._procs.items()):
                if proc.poll() is None or key in self._killed or proc.pid in told:
                    continue
                told.add(proc.pid)
                self._tell_reaper(f"-{proc.pid}")
                print(f"rdmadev.testing.launch: TF task {key[0]}:{key[1]} (pid {proc.pid}) exited "
                      f"with code {proc.returncode} while the cluster runs; TF waits for a lost "
                      f"task, so the job may hang. Its log:\n{self._tail(*key)}", file=sys.stderr,
                      flush=True)

    def _spawn(self, job, index):
        env = dict(os.environ)
        env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
        env.update(self.env)
        logf = open(self.log_path(job, index), "ab")  # a restarted task appends to its log
        proc = subprocess.Popen(self.launcher(job, index, json.dumps(self.spec)), stdout=logf,
                                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env,
                                start_new_session=True)
        self._procs[(job, index)] = (proc, logf)
        self._tell_reaper(f"+{proc.pid}")
        log.info("started %s:%d pid=%d", job, index, proc.pid)

    def _tell_reaper(self, line):
        """One change of the reaper's list: ``+pgid`` started, ``-pgid`` ended and waited for."""
        if self._reaper is None:
            return
        try:
            with self._reaper_lock:
                self._reaper.stdin.write(line + "\n")
                self._reaper.stdin.flush()
        except (OSError, ValueError):  # the reaper is gone: the tasks are as without it
            pass

    def pid(self, job, index):
        """The process id of a task."""
        return self._procs[(job, index)][0].pid

    def kill(self, job, index):
        """SIGKILLs one task (its process group) and waits for it: a crash, as tests need it."""
        proc, logf = self._procs[(job, index)]
        self._killed.add((job, index))
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait(timeout=STOP_TIMEOUT_S)
        self._tell_reaper(f"-{proc.pid}")
        logf.close()

    def restart(self, job, index, wait=True):
        """Starts a killed or exited task again at the same address; waits until it listens
        (`wait` False: returns once its process is started, for a caller whose next call
        waits for the task while holding Python's GIL, as TF's set_server_def does)."""
        proc, logf = self._procs[(job, index)]
        if proc.poll() is None:
            raise ClusterError(f"TF task {job}:{index} is still running (pid {proc.pid}); kill it first")
        logf.close()
        self._spawn(job, index)
        self._killed.discard((job, index))
        if wait:
            self._wait_ready([(job, index)])

    def _wait_ready(self, keys=None):
        deadline = time.monotonic() + self.ready_timeout
        pending = {(job, i): split_address(addr, job) for job, i, addr in self.tasks()
                   if keys is None or (job, i) in keys}
        while pending:
            for key, (host, port) in list(pending.items()):
                proc = self._procs[key][0]
                if proc.poll() is not None:
                    raise ClusterError(f"TF task {key[0]}:{key[1]} exited with code {proc.returncode} before "
                                       f"listening on {host}:{port}; its log:\n{self._tail(*key)}")
                if _port_open(host, port):
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
        self._stopping.set()
        if self._watcher is not None:
            self._watcher.join()
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
            self._tell_reaper(f"-{proc.pid}")
            logf.close()
        if self._reaper is not None:  # its list is empty now: it exits at end of file
            with contextlib.suppress(OSError):
                self._reaper.stdin.close()
            self._reaper.wait(timeout=STOP_TIMEOUT_S)
            self._reaper = None
        if self._own_log_dir:
            shutil.rmtree(self.log_dir, ignore_errors=True)

    def alive(self):
        """Return True when every started task is still running."""
        return bool(self._procs) and all(self.running(job, i) for job, i in self._procs)

    def running(self, job, index):
        """Whether task `job`:`index` runs (not killed, not exited)."""
        return self._procs[(job, index)][0].poll() is None

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()
        return False




def pss_coordinator(spec, rpc_layer="grpc", **strategy_kwargs):
    """A ParameterServerStrategy over the tasks of `spec` ({job: [address]}), with this process
    as its chief (at a free port of 127.0.0.1), and its ClusterCoordinator.

    Returns:
        (strategy, coordinator).
    """
    import tensorflow as tf
    spec = {**spec, "chief": [f"127.0.0.1:{free_ports(1)[0]}"]}
    resolver = tf.distribute.cluster_resolver.SimpleClusterResolver(
        tf.train.ClusterSpec(spec), task_type="chief", task_id=0, rpc_layer=rpc_layer)
    strategy = tf.distribute.ParameterServerStrategy(resolver, **strategy_kwargs)
    return strategy, tf.distribute.coordinator.ClusterCoordinator(strategy)


@contextlib.contextmanager
def coordinated(num_ps=1, num_workers=1):
    """A Cluster of `rdmadev serve` tasks with this process as their coordinator; yields it.

    The tasks share this process's RDMADEV_SECRET (generated and set here when unset, before
    rdmadev's runtime reads it) and TF's eager context is connected to them. Drop the
    functions that ran on them before leaving the block: it releases them on the tasks
    (``release_remote_functions``) before stopping them.
    """
    import tensorflow as tf
    os.environ.setdefault("RDMADEV_SECRET", secrets.token_hex(16))
    with Cluster(num_ps=num_ps, num_workers=num_workers) as cluster:
        tf.config.experimental_connect_to_cluster(tf.train.ClusterSpec(cluster.spec))
        yield cluster
        release_remote_functions(cluster.spec)


def release_remote_functions(spec):
    """Lets the tasks of `spec` unregister this process's freed functions while they still
    run: TF does it asynchronously when a function is freed, and a function freed after the
    cluster stopped makes TF log "Failed to remove function remotely" for each task at exit.
    Call it after dropping the functions and before ``Cluster.stop``."""
    import gc

    import tensorflow as tf
    gc.collect()  # TF queues the removal of each freed function per task
    for job, addresses in spec.items():  # one synchronous op per task drains its queue
        for index in range(len(addresses)):
            with tf.device(task_name(job, index)):
                tf.identity(0).numpy()
