"""rdmadev's TensorFlow ops: loading the op library and the Python wrappers.

The library is built by setup.py against the installed TensorFlow; loading checks that the
TensorFlow now installed is the one it was built against.

Example:
    >>> from rdmadev.tf import ops
    >>> ops.send(tf.ones([4]), channel="w0->ps:x")            # on the sender's device
    >>> y = ops.recv(tf.float32, [4], channel="w0->ps:x")      # on the receiver's device
"""
import functools
import os

from ..config import Config
from ..errors import ConfigError

__all__ = ["load", "check_built", "send", "recv", "send_bundle", "recv_bundle", "library_path"]


def library_path():
    """Where setup.py puts the op library: next to the rdmadev package's other extensions."""
    return os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "_tf_ops.so")


def check_built():
    """Checks that rdmadev's TF libraries are built, against the TensorFlow installed now.

    Raises:
        ConfigError: a library is missing or was built against another TensorFlow.
    """
    import tensorflow as tf

    try:
        from .._build_info import TF_VERSION
    except ImportError:
        TF_VERSION = None
    path = library_path()
    if TF_VERSION is None or not os.path.exists(path):
        raise ConfigError("rdmadev's TensorFlow op library is not built",
                          hint="reinstall rdmadev (pip install -e .) with TensorFlow available")
    if TF_VERSION != tf.__version__:
        raise ConfigError(
            f"rdmadev's op library was built against TensorFlow {TF_VERSION}, but "
            f"{tf.__version__} is installed",
            hint="rebuild it: pip install --force-reinstall --no-deps -e . (or pin "
                 f"tensorflow=={TF_VERSION})")


@functools.lru_cache(maxsize=None)
def load():
    """Loads the op library into this process (once) and returns its op module.

    Raises:
        ConfigError: the library is missing or was built against another TensorFlow.
    """
    import tensorflow as tf

    check_built()
    return tf.load_op_library(library_path())


def _deadline(timeout_s):
    return Config.from_env().deadline_s if timeout_s is None else timeout_s


def send(x, channel, timeout_s=None, max_bytes=0):
    """Writes tensor `x` into the next slot of `channel` (bound in this process).

    `timeout_s` None: RDMADEV_DEADLINE_S (Config.deadline_s). On a dynamic channel (its
    slots have a shape block) `x`'s shape travels with it, a tensor larger than a slot goes
    in slot-sized chunks, and one larger than `max_bytes` (0: no limit) is refused."""
    return load().rdmadev_send(x, channel=channel, timeout_s=_deadline(timeout_s),
                               max_bytes=max_bytes)


def recv(dtype, shape, channel, timeout_s=None, zero_copy=False, max_bytes=0, zero_copy_min_bytes=0):
    """Waits for the next tensor on `channel` (bound in this process) and returns it.

    `timeout_s` None: RDMADEV_DEADLINE_S (Config.deadline_s). `shape` may have None dims (or
    be None) on a dynamic channel: the output has the shape the sender wrote, refused when it
    does not match `shape` or needs more than `max_bytes` (0: no limit).

    With zero_copy=True a tensor of at least `zero_copy_min_bytes` that arrived in one slot
    aliases it (the planner sets zero_copy where every consumer keeps nothing, and passes its
    config's zero_copy_min_bytes); the slot returns to the sender
    only when the tensor is freed: keep such tensors short-lived, or the sender stalls
    (DeadlineExceeded on its credit) once the receiver holds every slot."""
    return load().rdmadev_recv(dtype=dtype, shape=shape, channel=channel, timeout_s=_deadline(timeout_s),
                               zero_copy=zero_copy, zero_copy_min_bytes=zero_copy_min_bytes,
                               max_bytes=max_bytes)


def send_bundle(xs, offsets, channel, timeout_s=None):
    """Writes the tensors `xs` into the next slot of `channel`, each at its byte offset in
    the payload (ascending, non-overlapping; the bytes between them are zeroed), with one
    signal: a bundle (graph_pass.bundles). The slot must hold them all."""
    return load().rdmadev_send_bundle(xs, offsets=list(offsets), channel=channel,
                                      timeout_s=_deadline(timeout_s))


def recv_bundle(dtypes, shapes, offsets, channel, timeout_s=None):
    """Waits for the next slot of `channel` and returns its tensors: dtypes[i] of static
    shapes[i] at offsets[i], each copied out; refused when the slot carries other bytes than
    they span."""
    return load().rdmadev_recv_bundle(dtypes=list(dtypes), shapes=list(shapes), offsets=list(offsets),
                                      channel=channel, timeout_s=_deadline(timeout_s))
