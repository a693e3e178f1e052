"""The ``grpc+rdmadev`` server protocol: rdmadev in scripts that never import it.

Once rdmadev is installed, ``import tensorflow`` loads its plugin loader from
site-packages/tensorflow-plugins/ (plugin_loader.cc), which registers a TF ServerFactory for
the protocol ``grpc+rdmadev`` and starts nothing. A process that creates a server with that
protocol (``tf.distribute.Server(..., protocol="grpc+rdmadev")``, ``tf.compat.v1.train.Server``,
``tf.config.experimental_connect_to_cluster(..., protocol=...)``, a cluster resolver whose
``rpc_layer`` is ``grpc+rdmadev``) gets TF's own gRPC server plus this task's rdmadev runtime,
started here by ``start_task``: the Domain and control service of a task, or the control
clients of a coordinator, and the partition pass rewriting every function the process
partitions (the protocol is the opt-in, as RDMADEV_AUTO=1 is for ``rdmadev serve``). A
process may create several such servers (TF's in-process clusters do): each task gets a
runtime of its own, and the pass plans a partitioning with the runtime of the task that
partitions it (runtime.of_task).

Example:
    $ RDMADEV_SECRET=... python -c 'import tensorflow as tf; tf.distribute.Server(
          {"ps": ["h:2222"], "worker": ["h:2223"]}, "ps", 0, protocol="grpc+rdmadev").join()'
"""
import functools
import os
import threading

from ..cluster import runtime
from ..errors import RdmadevError
from . import api, ops

__all__ = ["PROTOCOL", "COORDINATOR_JOBS", "load", "start_task", "library_path", "plugin_path"]

PROTOCOL = "grpc+rdmadev"
#: Jobs whose process coordinates rather than serves: `localhost` is the job
#: experimental_connect_to_cluster gives the connecting client, `chief` the
#: ParameterServerStrategy coordinator's. Their runtime has control clients only, as
#: rdmadev.optimize's coordinator has (its own traffic stays on gRPC).
COORDINATOR_JOBS = ("localhost", "chief")
#: Environment variable that keeps the plugin loader inactive (plugin_loader.cc reads it).
PLUGIN_SWITCH = "RDMADEV_PLUGIN"

_pass_auto = threading.local()


def library_path():
    """The protocol library (protocol.cc), next to the op library."""
    return os.path.join(os.path.dirname(ops.library_path()), "_tf_protocol.so")


def plugin_path():
    """Where setup.py installed the plugin loader for this interpreter, or None."""
    import sysconfig

    path = os.path.join(sysconfig.get_paths()["platlib"], "tensorflow-plugins", "librdmadev_plugin.so")
    return path if os.path.exists(path) else None


@functools.lru_cache(maxsize=None)
def load():
    """Registers the protocol in this process, whether or not the plugin loader did (it does
    not with RDMADEV_PLUGIN=0). Loading twice is harmless: the library is loaded once.

    Raises:
        ConfigError: the library is missing or was built against another TensorFlow.
    """
    import tensorflow as tf

    ops.check_built()
    tf.load_library(library_path())


def start_task(server_def):
    """Called by the protocol's ServerFactory (protocol.cc) before TF's gRPC server starts.

    Args:
        server_def: the serialized tensorflow.ServerDef of the server being created.
    Returns:
        None once the server's task (or coordinator) has its rdmadev runtime (new, or
        already), else the message, with its fix, that TF raises from the server's creation.
    """
    from tensorflow.core.protobuf import tensorflow_server_pb2

    who = "a server"
    try:
        d = tensorflow_server_pb2.ServerDef.FromString(server_def)
        who = f"/job:{d.job_name}/task:{d.task_index}"
        cluster = {job.name: dict(job.tasks) for job in d.cluster.job}
        coordinator = d.job_name in COORDINATOR_JOBS
        # A runtime per task: an in-process cluster runs every task's server here.
        if coordinator:
            runtime.start(cluster)
        else:
            runtime.start(cluster, d.job_name, d.task_index)
        auto = getattr(_pass_auto, "value", None)
        api.load_into_process(auto=True if auto is None else auto)
        # The pass's Python half, imported now rather than inside the task's first step
        # (6-11 ms of CPU in every worker's first round).
        from . import bridge  # noqa: F401  pylint: disable=import-outside-toplevel,unused-import
        return None
    except RdmadevError as e:
        return f"{PROTOCOL} server for {who}: {e}"
    except Exception as e:  # pylint: disable=broad-except  (reported through TF, never lost)
        return f"{PROTOCOL}: rdmadev could not start: {type(e).__name__}: {e}"


def start_server(cluster, job, index, auto):
    """`rdmadev serve`'s server: the protocol's own path, with the pass rewriting every
    function (`auto`) or only rdmadev.optimize's (RDMADEV_AUTO=0, serve's default).

    Returns:
        The started tf.distribute.Server.
    """
    import tensorflow as tf

    load()
    _pass_auto.value = auto
    try:
        return tf.distribute.Server(tf.train.ClusterSpec(cluster), job_name=job, task_index=index,
                                    protocol=PROTOCOL, start=True)
    finally:
        _pass_auto.value = None
