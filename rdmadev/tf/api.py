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
import functools
import secrets

from ..cluster import reports
from . import serving
from .pass_mode import load_into_process, opt_in_marker

__all__ = ["optimize", "enable", "load_into_process", "opt_in_marker", "counters", "task_reports"]

#: Hex digits of the token that tells one optimized function's instantiations from another's
#: (also across coordinator processes, whose TF function counters restart).
TOKEN_HEX = 8


def counters(cluster=None):
    """Per-task counters: ``{task: {"channels", "regions", "registered_bytes", "transfers",
    "waits", ...}}`` read from every task's control service now."""
    return {task: (str(v) if isinstance(v, Exception) else v)
            for task, v in serving.gather(serving.coordinator(cluster), "counters").items()}


def task_reports(cluster=None):
    """``{task: [Report]}``: what every serving task planned itself, oldest first. Tasks plan
    what their own runtime partitions: the functions a ParameterServerStrategy worker
    instantiates, and each TF1 session's partition (between-graph replication); a task that
    did not answer gets one report saying so."""
    out = {}
    for task, result in serving.gather(serving.coordinator(cluster), "reports").items():
        out[task] = ([reports.Report.unreachable(task, result)] if isinstance(result, Exception)
                     else [reports.Report.from_dict(r) for r in result])
    return out


def enable(cluster=None):
    """Rewrites every function instantiated in this process from now on (RDMADEV_AUTO=1)."""
    serving.coordinator(cluster)
    load_into_process(auto=True)


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

    from .optimized import Optimized  # imports TensorFlow

    if isinstance(fn, Optimized):
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
    marked = Optimized(
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
