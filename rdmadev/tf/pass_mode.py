"""The partition pass's mode in this process (off, every function, or the marked ones) and the
mark in a function's name that opts it in: what rdmadev.optimize, enable() and the task
server set, through the op library's C entry points (opt_in.cc)."""
import ctypes

from ..cluster import runtime
from ..config import Config
from . import ops

__all__ = ["MODE_OFF", "MODE_ALL", "MODE_MARKED", "opt_in_marker", "load_into_process"]

#: The pass's modes (opt_in.h: kRewriteNone, kRewriteAll, kRewriteMarked): off; every
#: function (RDMADEV_AUTO); marked functions only.
MODE_OFF, MODE_ALL, MODE_MARKED = 0, 1, 2
_native = None


def _lib():
    global _native
    if _native is None:
        ops.load()  # registers the ops and the pass with TensorFlow
        _native = ctypes.CDLL(ops.library_path())
        _native.rdmadev_opt_in_marker.restype = ctypes.c_char_p
    return _native


def opt_in_marker():
    """The part of a function's name that opts it in (defined by the pass, opt_in.cc)."""
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
