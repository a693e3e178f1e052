"""rdmadev: RPC-free tensor transfers for distributed TensorFlow.

A peer task is a remote device with a memory interface: allocate a region on it, write
into it, read from it, over the best fabric both ends reach (verbs, shm or tcp).

Example:
    >>> import rdmadev
    >>> dom = rdmadev.open_domain("worker:0")
    >>> region = dom.allocate(4096)
"""
import logging

from ._core import (ANY_PEER, CREDIT_BYTES, Domain, Endpoint, Region, RemoteRegion, RingLayout,
                    RingReceiver, RingSender, recent_events)
from .config import Config
from .device import fabric_report, open_domain, viable_fabrics
from .tf.api import counters, enable, optimize, task_reports
from .errors import (AuthError, BoundsError, ClosedError, ConfigError, DeadlineExceeded,
                     FabricError, PeerLostError, ProtocolError, RdmadevError, RegionError)

__version__ = "0.1.0"

__all__ = [
    "ANY_PEER", "CREDIT_BYTES", "Domain", "Endpoint", "Region", "RemoteRegion", "RingLayout",
    "RingReceiver", "RingSender", "recent_events", "Config", "fabric_report", "open_domain", "viable_fabrics",
    "counters", "enable", "optimize", "task_reports",
    "AuthError", "BoundsError", "ClosedError", "ConfigError", "DeadlineExceeded", "FabricError",
    "PeerLostError", "ProtocolError", "RdmadevError", "RegionError",
]

logging.getLogger(__name__).addHandler(logging.NullHandler())
