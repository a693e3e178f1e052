"""The test suite's cluster helpers over rdmadev.testing.launch: plain TF servers by default
(tests/tf_server_main.py), one shared cluster per test session, and connecting to it.

Example (pytest)::

    @pytest.fixture(scope="session")
    def cluster():
        return tf_cluster.shared_cluster()        # one cluster per test session, stopped at exit

    def test_something(cluster):
        tf_cluster.connect(cluster)               # this process becomes the coordinator
"""
import atexit
import json
import sys
from pathlib import Path

from rdmadev.testing import launch
from rdmadev.testing.launch import ClusterError, free_ports, rdmadev_launcher  # noqa: F401 (re-exported)

__all__ = ["Cluster", "ClusterError", "free_ports", "shared_cluster", "connect", "SERVER_SCRIPT",
           "rdmadev_launcher", "protocol_launcher"]

#: The default per-task server program here: a plain tf.distribute.Server (see its docstring).
SERVER_SCRIPT = Path(__file__).resolve().with_name("tf_server_main.py")


def protocol_launcher(rpc_layer):
    """A launcher whose tasks are tests/protocol_task.py, a user's own server script: TF_CONFIG
    with `rpc_layer` ("grpc", "grpc+rdmadev") and `tf.distribute.Server`, no rdmadev import."""
    script = SERVER_SCRIPT.with_name("protocol_task.py")

    def launch(job, index, spec_json):
        tf_config = {"cluster": json.loads(spec_json), "task": {"type": job, "index": index},
                     "rpc_layer": rpc_layer}
        return ["env", "TF_CONFIG=" + json.dumps(tf_config), sys.executable, str(script)]
    return launch


def _plain_launcher(job, index, spec_json):
    return [sys.executable, str(SERVER_SCRIPT), "--cluster", spec_json, "--job", job, "--index", str(index)]


class Cluster(launch.Cluster):
    """rdmadev.testing.launch.Cluster whose tasks are plain TF servers unless `launcher` says otherwise."""

    def __init__(self, *args, launcher=None, **kwargs):
        super().__init__(*args, launcher=launcher or _plain_launcher, **kwargs)


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


#: What a task's start says when TF's own port picker (portpicker, inside the kernel's
#: ephemeral range) put its control port (TF port + RDMADEV_CONTROL_PORT_OFFSET) on another
#: connection's port (runtime.Runtime._control_server).
CONTROL_PORT_TAKEN = "rdmadev control service cannot listen on"


def run_picking_ports_again(run, output_of):
    """`run()`, and once more should its output (`output_of(result)`) say that a port TF's
    in-process cluster picked put a control port on a taken one: TF's multi_worker_test_base
    picks ports where any connection may hold port + offset, more often with tests running
    side by side (pytest -n 2); a second run picks new ones, as a user would start again."""
    result = run()
    if CONTROL_PORT_TAKEN in output_of(result):
        result = run()
    return result

