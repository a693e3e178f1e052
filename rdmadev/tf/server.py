"""`rdmadev serve` / `python -m rdmadev.server`: start one TF task with rdmadev.

A thin wrapper over the grpc+rdmadev protocol (rdmadev.tf.protocol): it checks the task's
configuration first (so a bad one is reported as rdmadev's own error), then starts
tf.distribute.Server with that protocol, which opens this task's Domain and control service
and loads the op library and the partition pass, and serves until killed. Unlike a bare
protocol server, the pass rewrites only rdmadev.optimize's functions unless RDMADEV_AUTO=1,
and rdmadev's warnings (a silent peer, an open-file limit too low for the cluster) go to stderr.

Under Slurm (`--slurm JOBS`, in a task started by srun), TF's SlurmClusterResolver builds the
cluster from the step and picks this task's job and index from its Slurm rank
(rdmadev.cluster.slurm). When the jobs have a chief (the coordinator, itself a task of the
step), the task serves until the chief has exited, then exits 0, so the step ends with the
training; a task the step ends (scancel, the time limit) stops at Slurm's SIGTERM.

Example:
    $ RDMADEV_SECRET=... python -m rdmadev.server --cluster '{"ps": ["h:2222"], "worker": ["h:2223"]}' --job ps --task 0
    $ TF_CONFIG='{"cluster": {...}, "task": {"type": "worker", "index": 1}}' rdmadev serve
    $ srun --ntasks=4 --multi-prog tasks.conf   # ranks 1-3: rdmadev serve --slurm chief=1,ps=1,worker=2
"""
import argparse
import os
import signal
import socket
import sys
import time

from ..cluster import runtime, slurm
from ..cluster.spec import split_address, tf_config_task
from ..errors import ConfigError, RdmadevError
from . import protocol
from .startup import import_tensorflow

__all__ = ["main"]

READY_MARKER = "RDMADEV_SERVER_READY"
#: With --slurm, seconds between two looks at the chief's TF port (a connect, at once closed).
CHIEF_POLL_S = 1.0
#: Looks in a row that find the chief's port closed, after it once answered, that mean the
#: chief has exited: one refused connect may be a moment's backlog on a loaded node.
CHIEF_GONE_LOOKS = 3


def main(argv=None):
    ap = argparse.ArgumentParser(prog="rdmadev serve", description=__doc__.splitlines()[0])
    ap.add_argument("--cluster", help="cluster spec JSON (default: TF_CONFIG's)")
    ap.add_argument("--job", help="this task's job (default: TF_CONFIG's task.type)")
    ap.add_argument("--task", type=int, help="this task's index (default: TF_CONFIG's task.index)")
    ap.add_argument("--slurm", metavar="JOBS",
                    help="in a task started by srun: the cluster from the Slurm step, built by "
                         "TF's SlurmClusterResolver with these jobs and task counts, e.g. "
                         "chief=1,ps=1,worker=2 (Slurm ranks go to the jobs in the sorted order "
                         "of their names; the chief runs the training script, not serve)")
    ap.add_argument("--port-base", type=int, default=slurm.PORT_BASE,
                    help=f"with --slurm: the first TF port on each node (default {slurm.PORT_BASE}, "
                         f"TF's); a node's next tasks take the next ports")
    args = ap.parse_args(argv)
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, _stop)
    try:  # the configuration first: its errors come before TensorFlow's seconds of import
        if args.slurm is not None:
            if args.cluster is not None or args.job is not None or args.task is not None:
                raise ConfigError("--slurm builds the cluster and picks this task from the Slurm "
                                  "step; --cluster, --job and --task cannot be given with it",
                                  hint="drop --cluster/--job/--task, or --slurm")
            jobs = slurm.parse_jobs(args.slurm)
            slurm.check_step(jobs)
        else:
            cluster, job, index = _given_task(args)
            spec, config = runtime.checked(cluster, job, index)
    except RdmadevError as e:
        return _failed(e)
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    tf = import_tensorflow()  # without the start-up lines that variable does not reach
    if args.slurm is not None:  # TF's resolver reads the step: after the import
        try:
            cluster, job, index = _slurm_task(tf, jobs, args.port_base)
            spec, config = runtime.checked(cluster, job, index)
        except RdmadevError as e:
            return _failed(e)
    runtime.log_to_stderr()  # e.g. a silent peer, or an open-file limit below the cluster's need
    try:
        rt = runtime.start(spec, job, index, config)
        server = protocol.start_server(spec, job, index, auto=rt.config.auto)
    except RdmadevError as e:
        return _failed(e)
    print(f"{READY_MARKER} {job}:{index} {server.target} rdmadev={rt.domain.address} pid={os.getpid()}",
          flush=True)
    if args.slurm is not None and "chief" in spec:
        _serve_until_chief_exits(spec["chief"][0])
        _stop(None, None)  # as on SIGTERM: at once, status 0
    # Sleeping in Python (not server.join()) keeps the GIL free for the partition pass,
    # which calls the planner from TF's threads.
    while True:
        time.sleep(3600)


def _failed(error):
    print(f"rdmadev serve: {error}", file=sys.stderr, flush=True)
    return 2


def _given_task(args):
    """(cluster, job, index) from --cluster/--job/--task, else TF_CONFIG."""
    job, index = args.job, args.task
    if job is None or index is None:
        env_job, env_index = tf_config_task()
        job = job if job is not None else env_job
        index = index if index is not None else env_index
    if job is None or index is None:
        raise ConfigError("no task given: pass --job and --task, or set TF_CONFIG's task",
                          hint="e.g. rdmadev serve --cluster '{...}' --job worker --task 0")
    return args.cluster, job, int(index)


def _slurm_task(tf, jobs, port_base):
    """(cluster, job, index) of this Slurm task, by TF's SlurmClusterResolver."""
    try:
        resolver = tf.distribute.cluster_resolver.SlurmClusterResolver(
            **slurm.resolver_args(jobs, port_base))
        cluster = resolver.cluster_spec().as_dict()
    except (RuntimeError, ValueError) as e:  # TF's own words for a step it cannot read
        raise ConfigError(f"TF's SlurmClusterResolver failed: {e}",
                          hint="check the srun options against --slurm's jobs") from None
    job, index = resolver.get_task_info()
    if job == "chief":
        raise ConfigError(f"Slurm task {os.environ['SLURM_PROCID']} is the chief of {cluster}",
                          hint="run the training script in the chief's task (srun --multi-prog: "
                               "rank 0), rdmadev serve in the others")
    return cluster, job, index


def _serve_until_chief_exits(address):
    """Returns once the chief's TF port, after it answered once, stays closed for
    CHIEF_GONE_LOOKS looks in a row."""
    host, port = split_address(address, "chief")
    answered, closed = False, 0
    while closed < CHIEF_GONE_LOOKS:
        time.sleep(CHIEF_POLL_S)
        try:
            socket.create_connection((host, port), timeout=CHIEF_POLL_S).close()
            answered, closed = True, 0
        except OSError:
            closed += answered


def _stop(signum, frame):
    """SIGTERM (how Kubernetes, Slurm and systemd stop a task) or Ctrl-C: ends the task at once
    and quietly, as the signal's default action would, with status 0. A handler is needed: as a
    container's pid 1 the task would otherwise ignore SIGTERM (the kernel's rule for a pid
    namespace's init) until Kubernetes' grace period ends in SIGKILL. Nothing is left to undo:
    the kernel frees the task's memory and sockets, and its peers see it gone as after a kill."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
