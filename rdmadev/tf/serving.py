"""The coordinator's view of the tasks that serve rdmadev: the cluster this process connected
to, its control runtime, and requests to every serving task (rdmadev.optimize's calls, reports
and counters; api.py, optimized.py)."""
import logging

from graph_pass.devices import task_name

from ..cluster import runtime
from ..cluster.opening import in_parallel
from ..cluster.spec import parse_cluster
from ..errors import ConfigError, RdmadevError

__all__ = ["connected_server_def", "connected_cluster", "coordinator", "serving_tasks", "gather",
           "broadcast", "gone_tasks", "naming_gone_tasks", "check_tasks_serve", "PROBE_S"]

#: Seconds each serving task gets to answer a ping once a call failed as unavailable: the port
#: of a task whose process is gone refuses at once, a live task answers in milliseconds.
PROBE_S = 2.0
log = logging.getLogger("rdmadev.tf.api")  # as before the split: a filter on it sees these too
log.addHandler(logging.NullHandler())


def connected_server_def():
    """The ServerDef this process connected with (None: not connected to a cluster)."""
    from tensorflow.python.eager import context
    server_def = getattr(context.context(), "_server_def", None)
    return server_def if server_def is not None and server_def.cluster.job else None


def connected_cluster():
    """The cluster this process connected to (tf.config.experimental_connect_to_cluster, or a
    ParameterServerStrategy) as {job: {index: address}}; None (parse_cluster then reads
    TF_CONFIG) when not connected."""
    server_def = connected_server_def()
    if server_def is None:
        return None
    return {job.name: dict(job.tasks) for job in server_def.cluster.job}


def coordinator(cluster):
    """This process's control runtime, started on first use for `cluster` (None: the one
    connected to, else TF_CONFIG): the coordinator's connections to the serving tasks."""
    if runtime.current() is None:
        runtime.start(parse_cluster(cluster if cluster is not None else connected_cluster()))
    return runtime.current()


def serving_tasks(rt):
    """The tasks that serve rdmadev: every task of the cluster except this process's own job
    (the coordinator: `localhost` when connected, `chief` under ParameterServerStrategy)."""
    server_def = connected_server_def()
    own = server_def.job_name if server_def is not None else None
    return [task_name(job, i) for job, addresses in sorted(rt.cluster.items())
            if job != own for i in range(len(addresses))]


def gather(rt, op):
    """``{task: result or RdmadevError}`` of control request `op` on every serving task."""
    out = {}
    for task in serving_tasks(rt):
        try:
            out[task] = rt.call(task, {"op": op})
        except (RdmadevError, OSError) as e:
            out[task] = e if isinstance(e, RdmadevError) else RdmadevError(
                f"{task} did not answer {op!r}: {e}", hint="is the task running `rdmadev serve`?")
    return out


def broadcast(rt, tasks, request):
    """Sends `request` to every task of `tasks` (best effort: a task that is gone has nothing
    left to act on)."""
    for task in tasks:
        try:
            rt.call(task, request)
        except (RdmadevError, OSError) as e:
            log.info("rdmadev: %s did not take %s: %s", task, request["op"], e)


def gone_tasks(rt):
    """The serving tasks that do not answer a ping within PROBE_S (asked all at once)."""
    tasks = serving_tasks(rt)
    return [t for t, ok in zip(tasks, in_parallel(lambda t: rt.answers(t, PROBE_S), tasks)) if not ok]


def naming_gone_tasks(error):
    """`error` (a TF UnavailableError of a failed call) with the tasks that are gone named in
    front of its message when it does not name them: TF reports whichever component's error
    came first, and the coordinator's own RPC to a killed task may fail first with only
    "Connection reset by peer". Returns `error` itself when every task answers."""
    rt = runtime.current()
    gone = [t for t in (gone_tasks(rt) if rt is not None else []) if t not in error.message]
    if not gone:
        return error
    return type(error)(error.node_def, error.op,
                       f"rdmadev: task {', '.join(gone)} does not answer: its process is gone or "
                       f"unreachable (restart it; the step can be run again once it serves). "
                       f"TF's error: {error.message}")


def check_tasks_serve(rt):
    """Pings every serving task once: a task started without rdmadev would run an optimized
    function it instantiates (a ParameterServerStrategy step) on gRPC without a word.

    Raises:
        ConfigError: naming the task that does not answer and how to start it.
    """
    for task, result in gather(rt, "ping").items():
        if isinstance(result, Exception):
            cause = Exception.__str__(result)  # without its own "Fix:"
            raise ConfigError(f"rdmadev.optimize cannot use task {task}: {cause}",
                              hint=result.hint or "start every task with `rdmadev serve`")
