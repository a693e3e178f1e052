"""rdmadev: RPC-free tensor transfers for distributed TensorFlow.

A peer task is a remote device with a memory interface: allocate a region on it, write
into it, read from it, over the best fabric both ends reach (verbs, shm or tcp).

Example:
    >>> import rdmadev
    >>> dom = rdmadev.open_domain("worker:0")
    >>> region = dom.allocate(4096)
"""
import logging

from ._core import (ANY_PEER, Domain, Endpoint, Region, RemoteRegion, RingReceiver, RingSender,
                    recent_events, ring_bytes)
from .config import Config
from .device import fabric_report, open_domain, viable_fabrics
from .tf.api import enable, optimize
from .errors import (AuthError, BoundsError, ClosedError, ConfigError, DeadlineExceeded,
                     FabricError, PeerLostError, ProtocolError, RdmadevError, RegionError)

__version__ = "0.1.0"

__all__ = [
    "ANY_PEER", "Domain", "Endpoint", "Region", "RemoteRegion", "RingReceiver", "RingSender",
    "recent_events", "ring_bytes", "Config", "fabric_report", "open_domain", "viable_fabrics",
    "enable", "optimize",
    "AuthError", "BoundsError", "ClosedError", "ConfigError", "DeadlineExceeded", "FabricError",
    "PeerLostError", "ProtocolError", "RdmadevError", "RegionError",
]

logging.getLogger(__name__).addHandler(logging.NullHandler())

# Old flat module names still imported by files outside this package's owner (tests/test_tf_ops.py,
# tests/remote.py, tests/test_verbs.py, benchmarks/fabric_bench.py, benchmarks/perftest.py);
# remove once they import rdmadev.tf.ops, rdmadev.testing.pair and rdmadev.tools.doctor.
_MOVED = {"ops": "rdmadev.tf.ops", "pair": "rdmadev.testing.pair", "doctor": "rdmadev.tools.doctor"}


def __getattr__(name):
    if name in _MOVED:
        import importlib
        return importlib.import_module(_MOVED[name])
    raise AttributeError(f"module 'rdmadev' has no attribute {name!r}")
