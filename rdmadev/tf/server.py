"""`rdmadev serve` / `python -m rdmadev.server`: start one TF task with rdmadev.

A thin wrapper over the grpc+rdmadev protocol (rdmadev.tf.protocol): it checks the task's
configuration first (so a bad one is reported as rdmadev's own error), then starts
tf.distribute.Server with that protocol, which opens this task's Domain and control service
and loads the op library and the partition pass, and serves until killed. Unlike a bare
protocol server, the pass rewrites only rdmadev.optimize's functions unless RDMADEV_AUTO=1,
and rdmadev's warnings (a silent peer, an open-file limit too low for the cluster) go to stderr.

Example:
    $ RDMADEV_SECRET=... python -m rdmadev.server --cluster '{"ps": ["h:2222"], "worker": ["h:2223"]}' --job ps --task 0
    $ TF_CONFIG='{"cluster": {...}, "task": {"type": "worker", "index": 1}}' rdmadev serve
"""
import argparse
import os
import signal
import sys
import time

from ..cluster import runtime
from ..cluster.spec import tf_config_task
from ..errors import ConfigError, RdmadevError
from . import protocol
from .startup import import_tensorflow

__all__ = ["main"]

READY_MARKER = "RDMADEV_SERVER_READY"


def main(argv=None):
    ap = argparse.ArgumentParser(prog="rdmadev serve", description=__doc__.splitlines()[0])
    ap.add_argument("--cluster", help="cluster spec JSON (default: TF_CONFIG's)")
    ap.add_argument("--job", help="this task's job (default: TF_CONFIG's task.type)")
    ap.add_argument("--task", type=int, help="this task's index (default: TF_CONFIG's task.index)")
    args = ap.parse_args(argv)
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, _stop)
    job, index = args.job, args.task
    try:  # the configuration first: its errors come before TensorFlow's seconds of import
        if job is None or index is None:
            env_job, env_index = tf_config_task()
            job = job if job is not None else env_job
            index = index if index is not None else env_index
        if job is None or index is None:
            raise ConfigError("no task given: pass --job and --task, or set TF_CONFIG's task",
                              hint="e.g. rdmadev serve --cluster '{...}' --job worker --task 0")
        spec, config = runtime.checked(args.cluster, job, int(index))
    except RdmadevError as e:
        print(f"rdmadev serve: {e}", file=sys.stderr, flush=True)
        return 2
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import_tensorflow()  # without the start-up lines that variable does not reach
    runtime.log_to_stderr()  # e.g. a silent peer, or an open-file limit below the cluster's need
    try:
        rt = runtime.start(spec, job, int(index), config)
        server = protocol.start_server(spec, job, int(index), auto=rt.config.auto)
    except RdmadevError as e:
        print(f"rdmadev serve: {e}", file=sys.stderr, flush=True)
        return 2
    print(f"{READY_MARKER} {job}:{index} {server.target} rdmadev={rt.domain.address} pid={os.getpid()}",
          flush=True)
    # Sleeping in Python (not server.join()) keeps the GIL free for the partition pass,
    # which calls the planner from TF's threads.
    while True:
        time.sleep(3600)


def _stop(signum, frame):
    """SIGTERM (how Kubernetes, Slurm and systemd stop a task) or Ctrl-C: ends the task at once
    and quietly, as the signal's default action would, with status 0. A handler is needed: as a
    container's pid 1 the task would otherwise ignore SIGTERM (the kernel's rule for a pid
    namespace's init) until Kubernetes' grace period ends in SIGKILL. Nothing is left to undo:
    the kernel frees the task's memory and sockets, and its peers see it gone as after a kill."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
