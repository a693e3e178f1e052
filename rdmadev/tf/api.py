"""Opting in: rdmadev.optimize(fn), rdmadev.enable(), RDMADEV_AUTO / RDMADEV_ENABLED.

Example:
    >>> step = rdmadev.optimize(step)          # a tf.function, or a Python function to wrap
    >>> step(x)                                # cross-task tensors move through rdmadev
    >>> print(step.report)                     # what moved where
"""
import contextlib
import ctypes
import functools

from ..cluster import reports, runtime
from ..cluster.spec import parse_cluster
from ..config import Config
from . import ops

__all__ = ["optimize", "enable", "load_into_process"]

MODE_OFF, MODE_ALL, MODE_ARMED = 0, 1, 2
_native = None


def _lib():
    global _native
    if _native is None:
        ops.load()  # registers the ops and the pass with TensorFlow
        _native = ctypes.CDLL(ops.library_path())
    return _native


def enabled():
    return Config.from_env().enabled


def load_into_process(auto=False, on=None):
    """Loads the op library; with `auto` the pass rewrites every function instantiated here.
    `on` is RDMADEV_ENABLED when the caller has read it already (None: read it now)."""
    on = enabled() if on is None else on
    _lib().rdmadev_set_pass_mode(MODE_ALL if auto and on else MODE_ARMED if on else MODE_OFF)


def _pass_mode(request):
    """The ``pass_mode`` control request: turns RDMADEV_AUTO on or off in this task."""
    load_into_process(auto=bool(request["auto"]))
    return {"auto": bool(request["auto"])}


runtime.register_handler("pass_mode", _pass_mode)


def _coordinator(cluster):
    if runtime.current() is None:
        runtime.start(parse_cluster(cluster if cluster is not None else _connected_cluster()))
    return runtime.current()


def _connected_cluster():
    """The cluster this process connected to with tf.config.experimental_connect_to_cluster,
    as {job: {index: address}}; None (parse_cluster then reads TF_CONFIG) when not connected."""
    from tensorflow.python.eager import context
    server_def = getattr(context.context(), "_server_def", None)
    if server_def is not None and server_def.cluster.job:
        return {job.name: dict(job.tasks) for job in server_def.cluster.job}
    return None


def enable(cluster=None):
    """Rewrites every function instantiated in this process from now on (RDMADEV_AUTO=1)."""
    _coordinator(cluster)
    load_into_process(auto=True)


@contextlib.contextmanager
def _armed():
    lib = _lib()
    lib.rdmadev_arm_pass(1)
    try:
        yield
    finally:
        lib.rdmadev_arm_pass(-1)


class Optimized:
    """A tf.function whose instantiations (from this process) are rewritten by rdmadev."""

    def __init__(self, fn, cluster=None):
        import tensorflow as tf
        self.fn = fn if hasattr(fn, "get_concrete_function") else tf.function(fn)
        self.cluster = cluster
        self._first_report = len(reports.reports())
        self.calls = 0
        functools.update_wrapper(self, fn)

    def __call__(self, *args, **kwargs):
        if not enabled():  # read once per call: it parses the environment (and secret file)
            return self.fn(*args, **kwargs)
        _coordinator(self.cluster)
        load_into_process(auto=False, on=True)
        self.calls += 1
        with _armed():
            return self.fn(*args, **kwargs)

    def get_concrete_function(self, *args, **kwargs):
        return self.fn.get_concrete_function(*args, **kwargs)

    @property
    def reports(self):
        """Reports of this function's instantiations (and any other planned meanwhile)."""
        return reports.reports()[self._first_report:]

    @property
    def report(self):
        r = self.reports
        if r:
            return "\n".join(map(str, r))
        if self.calls:
            return "rdmadev: no cross-task transfer in this function (nothing to rewrite)"
        return "rdmadev: not called yet"


def optimize(fn=None, cluster=None):
    """Marks `fn` (a tf.function, or a Python function it wraps) for rdmadev.

    Args:
        fn: the training step.
        cluster: cluster spec (default: the one connected to, else TF_CONFIG).
    Returns:
        An Optimized callable usable wherever the tf.function was.
    """
    if fn is None:
        return functools.partial(optimize, cluster=cluster)
    return Optimized(fn, cluster)
