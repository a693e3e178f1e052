"""The TensorFlow adapter: opting in (api: optimize, enable), the op library and its wrappers
(ops), the bridge the C++ partition pass calls (bridge), and the task server (server).
Importing it does not import TensorFlow; loading the op library does.
"""
from .api import counters, enable, optimize

__all__ = ["counters", "enable", "optimize"]
