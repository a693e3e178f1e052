"""Opting in: rdmadev.optimize(fn), rdmadev.enable(), RDMADEV_AUTO / RDMADEV_ENABLED.

``rdmadev.optimize(fn)`` returns a tf.function (the same class TF's ``tf.function`` makes)
whose name carries rdmadev's mark. TF sends that name wherever the function is instantiated,
so the partition pass of that process (the coordinator, or under ParameterServerStrategy the
worker running a scheduled step) rewrites exactly the marked functions and those calling
them; RDMADEV_AUTO=1 in a task rewrites every function instead. Called while another
function is traced (Keras's train function calling train_step), it is traced into that
function under a name scope carrying the same mark.

Example:
    >>> step = rdmadev.optimize(step)          # a tf.function, or a Python function to wrap
    >>> coordinator.schedule(step, args=(it,))  # or step(x), strategy.run(step, ...), Keras
    >>> print(step.report)                     # what moved where, on every task
"""
import ctypes
import functools
import logging
import os
import re
import secrets
import threading

from graph_pass.devices import task_name

from ..cluster import instances, reports, runtime
from ..cluster.opening import in_parallel
from ..cluster.spec import parse_cluster
from ..config import Config
from ..errors import ConfigError, RdmadevError
from . import ops

__all__ = ["optimize", "enable", "load_into_process", "opt_in_marker", "counters", "task_reports"]

#: The pass's modes (opt_in.h: kRewriteNone, kRewriteAll, kRewriteMarked): off; every
#: function (RDMADEV_AUTO); marked functions only.
MODE_OFF, MODE_ALL, MODE_MARKED = 0, 1, 2
#: Hex digits of the token that tells one optimized function's instantiations from another's
#: (also across coordinator processes, whose TF function counters restart).
TOKEN_HEX = 8
#: Seconds each serving task gets to answer a ping once a call failed as unavailable: the port
#: of a task whose process is gone refuses at once, a live task answers in milliseconds.
PROBE_S = 2.0
_native = None
_optimized_class = None
log = logging.getLogger(__name__)
log.addHandler(logging.NullHandler())


def _lib():
    global _native
    if _native is None:
        ops.load()  # registers the ops and the pass with TensorFlow
        _native = ctypes.CDLL(ops.library_path())
        _native.rdmadev_opt_in_marker.restype = ctypes.c_char_p
    return _native


def opt_in_marker():
    """The part of a function's name that opts it in (defined by the pass, pass.cc)."""
    return _lib().rdmadev_opt_in_marker().decode()


def load_into_process(auto=False, on=None):
    """Loads the op library; the pass then rewrites marked functions, or with `auto` every
    function instantiated here. `on` is RDMADEV_ENABLED when the caller has read it already
    (None: read it now); off, the pass rewrites nothing."""
    on = Config.from_env().enabled if on is None else on
    _lib().rdmadev_set_pass_mode(MODE_OFF if not on else MODE_ALL if auto else MODE_MARKED)


def _pass_mode(request):
    """The ``pass_mode`` control request: turns RDMADEV_AUTO on or off in this task."""
    load_into_process(auto=bool(request["auto"]))
    return {"auto": bool(request["auto"])}


runtime.register_handler("pass_mode", _pass_mode)


def _connected_server_def():
    from tensorflow.python.eager import context
    server_def = getattr(context.context(), "_server_def", None)
    return server_def if server_def is not None and server_def.cluster.job else None


def _connected_cluster():
    """The cluster this process connected to (tf.config.experimental_connect_to_cluster, or a
    ParameterServerStrategy) as {job: {index: address}}; None (parse_cluster then reads
    TF_CONFIG) when not connected."""
    server_def = _connected_server_def()
    if server_def is None:
        return None
    return {job.name: dict(job.tasks) for job in server_def.cluster.job}


def _coordinator(cluster):
    if runtime.current() is None:
        runtime.start(parse_cluster(cluster if cluster is not None else _connected_cluster()))
    return runtime.current()


def _serving_tasks(rt):
    """The tasks that serve rdmadev: every task of the cluster except this process's own job
    (the coordinator: `localhost` when connected, `chief` under ParameterServerStrategy)."""
    server_def = _connected_server_def()
    own = server_def.job_name if server_def is not None else None
    return [task_name(job, i) for job, addresses in sorted(rt.cluster.items())
            if job != own for i in range(len(addresses))]


def _gather(rt, op):
    """``{task: result or RdmadevError}`` of control request `op` on every serving task."""
    out = {}
    for task in _serving_tasks(rt):
        try:
            out[task] = rt.call(task, {"op": op})
        except (RdmadevError, OSError) as e:
            out[task] = e if isinstance(e, RdmadevError) else RdmadevError(
                f"{task} did not answer {op!r}: {e}", hint="is the task running `rdmadev serve`?")
    return out


def _broadcast(rt, tasks, request):
    """Sends `request` to every task of `tasks` (best effort: a task that is gone has nothing
    left to act on)."""
    for task in tasks:
        try:
            rt.call(task, request)
        except (RdmadevError, OSError) as e:
            log.info("rdmadev: %s did not take %s: %s", task, request["op"], e)


def _gone_tasks(rt):
    """The serving tasks that do not answer a ping within PROBE_S (asked all at once)."""
    tasks = _serving_tasks(rt)
    return [t for t, ok in zip(tasks, in_parallel(lambda t: rt.answers(t, PROBE_S), tasks)) if not ok]


def _naming_gone_tasks(error):
    """`error` (a TF UnavailableError of a failed call) with the tasks that are gone named in
    front of its message when it does not name them: TF reports whichever component's error
    came first, and the coordinator's own RPC to a killed task may fail first with only
    "Connection reset by peer". Returns `error` itself when every task answers."""
    rt = runtime.current()
    gone = [t for t in (_gone_tasks(rt) if rt is not None else []) if t not in error.message]
    if not gone:
        return error
    return type(error)(error.node_def, error.op,
                       f"rdmadev: task {', '.join(gone)} does not answer: its process is gone or "
                       f"unreachable (restart it; the step can be run again once it serves). "
                       f"TF's error: {error.message}")


def _check_tasks_serve(rt):
    """Pings every serving task once: a task started without rdmadev would run an optimized
    function it instantiates (a ParameterServerStrategy step) on gRPC without a word.

    Raises:
        ConfigError: naming the task that does not answer and how to start it.
    """
    for task, result in _gather(rt, "ping").items():
        if isinstance(result, Exception):
            cause = Exception.__str__(result)  # without its own "Fix:"
            raise ConfigError(f"rdmadev.optimize cannot use task {task}: {cause}",
                              hint=result.hint or "start every task with `rdmadev serve`")


def counters(cluster=None):
    """Per-task counters: ``{task: {"channels", "regions", "registered_bytes", "transfers",
    "waits", ...}}`` read from every task's control service now."""
    return {task: (str(v) if isinstance(v, Exception) else v)
            for task, v in _gather(_coordinator(cluster), "counters").items()}


def task_reports(cluster=None):
    """``{task: [Report]}``: what every serving task planned itself, oldest first. Tasks plan
    what their own runtime partitions: the functions a ParameterServerStrategy worker
    instantiates, and each TF1 session's partition (between-graph replication); a task that
    did not answer gets one report saying so."""
    out = {}
    for task, result in _gather(_coordinator(cluster), "reports").items():
        out[task] = ([reports.Report.unreachable(task, result)] if isinstance(result, Exception)
                     else [reports.Report.from_dict(r) for r in result])
    return out


def enable(cluster=None):
    """Rewrites every function instantiated in this process from now on (RDMADEV_AUTO=1)."""
    _coordinator(cluster)
    load_into_process(auto=True)


def _make_optimized_class():
    """The tf.function class with reports: defined on first use, so `import rdmadev` does not
    import TensorFlow."""
    from tensorflow.python.eager.polymorphic_function import autograph_util, polymorphic_function
    from tensorflow.python.framework import errors as tf_errors
    from tensorflow.python.framework import ops as tf_ops

    class Optimized(polymorphic_function.Function):
        """A tf.function marked for rdmadev (see the module docstring). It is TF's own class,
        so TF takes it wherever it takes a tf.function; rdmadev adds `report` and `reports`."""

        _rdmadev_ready = False

        _rdmadev_traced = 0

        _rdmadev_inlined = 0

        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            # Calls from Python threads run one at a time: each channel of an instantiation
            # carries one step at a time (its slots are reused by the next step), so two
            # overlapping calls would take each other's transfers. TF runs them concurrently.
            self._rdmadev_calls = threading.RLock()

        def __getstate__(self):  # as TF's own: a lock does not pickle
            state = super().__getstate__()
            del state["_rdmadev_calls"]
            return state

        def __setstate__(self, state):
            super().__setstate__(state)
            self._rdmadev_calls = threading.RLock()

        def __call__(self, *args, **kwargs):
            if not self._rdmadev_ready:
                self._rdmadev_prepare()
            if tf_ops.inside_function():
                return self._rdmadev_inline(args, kwargs)
            try:
                with self._rdmadev_calls:
                    return super().__call__(*args, **kwargs)
            except tf_errors.UnavailableError as e:
                named = _naming_gone_tasks(e)
                if named is e:
                    raise
                raise named from e
            finally:
                self._rdmadev_watch_traces()

        def _rdmadev_inline(self, args, kwargs):
            # Called while another function is traced (Keras's train function calling
            # train_step, a step inside strategy.run): traced into it under the name scope
            # `<name>__rdmadev_<token>`, which opts the caller in (pass.cc, AddMarkedScope). A
            # nested tf.function would be a function of its own, and one that aggregates
            # gradients cannot be (TF: "merge_call called while defining a new graph").
            # Instantiations filed under the scope are released once this object is gone.
            scope = self._rdmadev_scope
            rt = runtime.current()
            if rt is not None:  # watched once (instances.py keys it by the scope)
                instances.watch_function(self, functools.partial(_broadcast, rt, _serving_tasks(rt)),
                                         name=scope)
            self._rdmadev_inlined += 1
            fn = self._python_function
            if self._autograph:  # as tf.function traces it
                fn = autograph_util.py_func_from_autograph(fn, self._experimental_autograph_options)
            with tf_ops.name_scope(scope):
                return fn(*args, **kwargs)

        @property
        def _rdmadev_scope(self):
            prefix = re.sub(r"[^A-Za-z0-9_.-]", "_", self._name.rsplit(opt_in_marker(), 1)[0])
            return (prefix.lstrip("_.-") or "optimized") + opt_in_marker() + self.rdmadev_token

        def get_concrete_function(self, *args, **kwargs):
            # ClusterCoordinator.schedule traces here and sends the concrete function to a
            # worker: it never calls the function itself.
            if not self._rdmadev_ready:
                self._rdmadev_prepare()
            try:
                return super().get_concrete_function(*args, **kwargs)
            finally:
                self._rdmadev_watch_traces()

        def _rdmadev_watch_traces(self):
            # A task that instantiates a traced function (a ParameterServerStrategy worker)
            # cannot tell when this process drops it: tell every task then (instances.py).
            count = self.experimental_get_tracing_count()
            if count == self._rdmadev_traced or not self._rdmadev_ready:
                return
            self._rdmadev_traced = count
            rt = runtime.current()
            if rt is None:
                return
            tasks = _serving_tasks(rt)
            for concrete in self._list_all_concrete_functions():
                instances.watch_function(concrete._inference_function,  # pylint: disable=protected-access
                                         functools.partial(_broadcast, rt, tasks))

        def _rdmadev_prepare(self):
            # In the coordinator: the pass must run here too (a call from the coordinator is
            # instantiated here), with a runtime to set up channels through.
            config = Config.from_env()
            load_into_process(auto=config.auto, on=config.enabled)
            cluster = getattr(self, "_rdmadev_cluster", None) or _connected_cluster()
            if cluster is None and "TF_CONFIG" not in os.environ:
                return  # one process, no cluster (yet): nothing crosses tasks; check next time
            if config.enabled:
                _check_tasks_serve(_coordinator(cluster))
            self._rdmadev_ready = True

        @property
        def rdmadev_token(self):
            return self._name.rsplit(opt_in_marker(), 1)[-1]

        @property
        def reports(self):
            """Reports of every instantiation of this function (or of one calling it), from
            every task that instantiated one, oldest first per task. Tasks that did not answer
            appear as a report saying so."""
            token = opt_in_marker() + self.rdmadev_token
            out = [r for r in reports.reports() if r.concerns(token)]
            rt = _coordinator(getattr(self, "_rdmadev_cluster", None))
            for task, result in _gather(rt, "reports").items():
                if isinstance(result, Exception):
                    out.append(reports.Report.unreachable(task, result))
                    continue
                out += [r for r in map(reports.Report.from_dict, result) if r.concerns(token)]
            return out

        @property
        def report(self):
            r = self.reports
            if r:
                return "\n".join(map(str, r))
            if self.experimental_get_tracing_count() or self._rdmadev_inlined:
                return "rdmadev: no cross-task transfer in this function (nothing to rewrite)"
            return "rdmadev: not called yet"

    return Optimized


_AS_DECORATOR = object()  # optimize(cluster=...) with no function: a decorator


def optimize(fn=_AS_DECORATOR, cluster=None):
    """Marks `fn` (a tf.function, or a Python function it wraps) for rdmadev.

    Args:
        fn: the training step: a tf.function (its options are kept) or a Python function.
        cluster: cluster spec for the coordinator's control connections (default: the one
            connected to, else TF_CONFIG).
    Returns:
        A tf.function (TF's class, with `report` and `reports` added): the same signature,
        tracing and retracing as `fn`; TF instantiates it where it always would, and that
        process's pass rewrites its cross-task transfers.
    """
    if fn is _AS_DECORATOR:
        return functools.partial(optimize, cluster=cluster)
    import tensorflow as tf
    from tensorflow.python.eager.polymorphic_function import polymorphic_function
    from tensorflow.python.util import tf_decorator

    global _optimized_class
    if _optimized_class is None:
        _optimized_class = _make_optimized_class()
    if isinstance(fn, _optimized_class):
        return fn
    if not isinstance(fn, polymorphic_function.Function):
        if isinstance(fn, tf.types.experimental.ConcreteFunction):
            raise TypeError("rdmadev.optimize takes a tf.function or a Python function, not a "
                            "concrete function: it is traced already and cannot be renamed; pass "
                            "the tf.function it came from")
        if not callable(fn):
            raise TypeError(f"rdmadev.optimize takes a tf.function or a Python function, not "
                            f"{type(fn).__name__}")
        fn = tf.function(fn)
    # pylint: disable=protected-access  (TF's own way to copy a tf.function, see Function._clone)
    marked = _optimized_class(
        python_function=fn._python_function,
        name=f"{fn._name}{opt_in_marker()}{secrets.token_hex(TOKEN_HEX // 2)}",
        input_signature=fn.input_signature,
        autograph=fn._autograph,
        jit_compile=fn._jit_compile,
        reduce_retracing=fn._reduce_retracing,
        experimental_attributes=fn._attributes or None,
        experimental_autograph_options=fn._experimental_autograph_options)
    marked._rdmadev_cluster = cluster
    return tf_decorator.make_decorator(fn._python_function, marked, decorator_name="rdmadev.optimize")
