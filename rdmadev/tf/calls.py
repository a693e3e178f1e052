"""Every eager call of a TF function in this process is noted as the owner of what the pass
plans inside it (instances.calling), and passes through the evictions of the
instantiations planned here (rdmadev/cluster/evictions.py) when it has any: the channels of
one evicted to make room for another plan are set up again before TF runs it, and one running
is never evicted. TF calls every function, traced or loaded, through AtomicFunction.call_flat;
a call inside a function being traced only adds a call op to its graph and passes through.

Setting channels up again can fail as a step can: a task gone (TF's UnavailableError, which
TF's retrying callers catch) or, with nothing left to evict, no room on a task within its
budget (ResourceExhaustedError, TF's out-of-memory class); the message names the task and the
fix."""
from tensorflow.python.eager.polymorphic_function import atomic_function
from tensorflow.python.framework import errors as tf_errors

from ..cluster import evictions, instances
from ..errors import RdmadevError

__all__ = ["install"]


def install():
    """Wraps AtomicFunction.call_flat, once per process, before the pass plans anything
    (pass_mode.load_into_process)."""
    cls = atomic_function.AtomicFunction
    original = cls.call_flat
    if getattr(original, "rdmadev_wrapped", False):
        return

    def call_flat(self, *args):
        with instances.calling(self):  # the owner of what the pass plans inside this call
            if not evictions.watching(self) or not self._bound_context.executing_eagerly():  # pylint: disable=protected-access
                return original(self, *args)
            try:
                running = evictions.begin_call(self)
            except RdmadevError as e:
                raise as_tf_error(e) from e
            clean = False
            try:
                outputs = original(self, *args)
                clean = True
                return outputs
            finally:
                evictions.end_call(running, clean)

    call_flat.rdmadev_wrapped = True
    call_flat.__doc__ = original.__doc__
    cls.call_flat = call_flat


def as_tf_error(e):
    """The TF error a step would fail with for `e`, raised setting an evicted instantiation's
    channels up again."""
    cls = (tf_errors.ResourceExhaustedError if getattr(e, "over_budget", None)
           else tf_errors.UnavailableError)
    return cls(None, None, f"rdmadev could not set up again the channels of an instantiation "
                           f"evicted to make room for another plan: {e}")
