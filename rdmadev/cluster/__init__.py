"""The control plane, framework-free: cluster specs, the per-process runtime (task, Domain,
control service and clients), channel setup between tasks, and reports. Never imports
TensorFlow or rdmadev.tf; the TF layer plugs in through ``runtime.register_handler``.
"""
from .reports import Report
from .runtime import Runtime, current, register_handler, start
from .spec import parse_cluster

__all__ = ["Report", "Runtime", "current", "register_handler", "start", "parse_cluster"]
