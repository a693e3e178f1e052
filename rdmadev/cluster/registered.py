"""The registered memory a task's channel setups may take (RegisteredMemory, a part of
ChannelTable that owns its state: ``table.memory``).

Pairs are set up in parallel, so each holds the bytes of the region it is about to allocate
(``reserving``) against the task's RDMADEV_MAX_REGISTERED_BYTES, with the bytes its Domain
has registered already; a setup past the limit is refused with RegionError, after waiting a
while for memory that unbound halves still keep for their peer.
"""
import contextlib
import threading
import time

from .. import _core
from ..errors import RegionError
from .channel_common import WATCH_INTERVAL_S

__all__ = ["RegisteredMemory", "KEPT_WAIT_S", "KEPT_POLL_S"]

#: Seconds a setup that would pass RDMADEV_MAX_REGISTERED_BYTES waits for memory that unbound
#: halves keep for their peer (reserving): a receiving ring retired for late writes goes
#: within LATE_WRITE_GRACE_S (verbs), a parked sending half once its receiver has credited
#: what it sent. Checked every KEPT_POLL_S.
KEPT_WAIT_S = _core.LATE_WRITE_GRACE_S + WATCH_INTERVAL_S
KEPT_POLL_S = 0.1


class RegisteredMemory:
    """The bytes of regions being allocated (``reserved``), held against the limit.

    Args:
        table: the ChannelTable it is a part of; it reads its ``config``
            (max_registered_bytes), ``domain`` (the bytes registered) and ``task``.
    """

    def __init__(self, table):
        self.table = table
        self.lock = threading.Lock()
        self.reserved = 0

    @contextlib.contextmanager
    def reserving(self, size, label, wait=True):
        """Holds `size` bytes against the task's RDMADEV_MAX_REGISTERED_BYTES while a region
        of that size is allocated (pairs are set up in parallel), or raises RegionError.
        `wait`: memory that unbound halves still keep for their peer (parked, retired: a pair
        set up again after its connection broke replaces a ring kept for late writes) is
        waited for, up to KEPT_WAIT_S, before the setup is refused."""
        table = self.table
        limit = table.config.max_registered_bytes
        deadline = time.monotonic() + KEPT_WAIT_S
        while True:
            with self.lock:
                registered = table.domain.region_stats[1] + self.reserved
                if registered + size <= limit:
                    self.reserved += size
                    break
            kept = 0
            if wait:
                held = _core.channel_counts(table.domain)
                kept = held["parked"] + held["retired"]
            if not kept or time.monotonic() > deadline:
                waited = (f"; {kept} unbound channel half(s) still keep theirs for their peer "
                          f"after {KEPT_WAIT_S:g} s") if kept else ""
                raise RegionError(
                    f"region {label} of {size} bytes would take task {table.task}'s registered "
                    f"memory to {registered + size} bytes, past its limit of {limit}{waited}",
                    hint="raise RDMADEV_MAX_REGISTERED_BYTES in this task (default: half of "
                         "RAM, less on verbs under a locked-memory limit), or plan smaller "
                         "tensors or fewer slots (RDMADEV_SLOTS)")
            _core.release_drained()
            time.sleep(KEPT_POLL_S)
        try:
            yield
        finally:
            with self.lock:
                self.reserved -= size
