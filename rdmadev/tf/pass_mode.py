"""The partition pass's mode in this process (off, every function, or the marked ones) and the
mark in a function's name that opts it in: what rdmadev.optimize, enable() and the task
server set, through the op library's C entry points (opt_in.cc)."""
import ctypes

from ..cluster import facts, runtime
from ..config import Config
from ..errors import ConfigError
from . import ops

__all__ = ["MODE_OFF", "MODE_ALL", "MODE_MARKED", "opt_in_marker", "load_into_process", "current"]

#: The pass's modes, by the names the op library knows them by (opt_in.h; its numbers are its
#: own): off; every function (RDMADEV_AUTO); marked functions only.
MODE_OFF, MODE_ALL, MODE_MARKED = "off", "all", "marked"
_native = None
_mode = None  # the mode last set in this process (None: the pass is not loaded here)


def _lib():
    global _native
    if _native is None:
        ops.load()  # registers the ops and the pass with TensorFlow
        _native = ctypes.CDLL(ops.library_path())
        _native.rdmadev_opt_in_marker.restype = ctypes.c_char_p
        _native.rdmadev_set_pass_mode.argtypes = [ctypes.c_char_p]
        _native.rdmadev_set_pass_mode.restype = ctypes.c_int
    return _native


def _set_mode(mode):
    """Sets the pass's mode `mode` (a MODE_* name).

    Raises:
        ConfigError: the op library knows no mode of that name (built from other sources).
    """
    global _mode
    if _lib().rdmadev_set_pass_mode(mode.encode()) != 0:
        raise ConfigError(f"rdmadev's op library has no pass mode {mode!r}",
                          hint="reinstall rdmadev (pip install -e .): the library and the Python "
                               "package come from different sources")
    _mode = mode


def current():
    """The pass's mode in this process (a MODE_* name), or None when no pass is loaded here."""
    return _mode


def opt_in_marker():
    """The part of a function's name that opts it in (defined by the pass, opt_in.cc)."""
    return _lib().rdmadev_opt_in_marker().decode()


def load_into_process(auto=False, on=None):
    """Loads the op library; the pass then rewrites marked functions, or with `auto` every
    function instantiated here. `on` is RDMADEV_ENABLED when the caller has read it already
    (None: read it now); off, the pass rewrites nothing."""
    on = Config.from_env().enabled if on is None else on
    _set_mode(MODE_OFF if not on else MODE_ALL if auto else MODE_MARKED)
    if on:  # before the pass plans anything: TF's function calls are noted (calls.py)
        from . import calls  # pylint: disable=import-outside-toplevel  (it imports TensorFlow)
        calls.install()


def _pass_mode(request):
    """The ``pass_mode`` control request: turns RDMADEV_AUTO on or off in this task."""
    load_into_process(auto=bool(request["auto"]))
    return {"auto": bool(request["auto"])}


runtime.register_handler("pass_mode", _pass_mode)
facts.provide("pass_mode", current)  # `rdmadev doctor --peer`'s "rewrites" check
