"""The open-file limit of a task. A task holds descriptors for every peer task it exchanges
tensors with (its control link, its fabric endpoint, the memfds of the chunks its regions for
that peer are placed in),
so a ps serving a few hundred workers needs more than the soft RLIMIT_NOFILE of 1024 that most
systems start a process with, below a hard limit that is usually far higher.

A task's runtime therefore raises its soft limit to the hard one when it starts (limits.py),
and warns when even the hard limit is below what its cluster spec may need. Running out anyway
fails with an error that names the limit (rdmadev.errors.errno_hint); `rdmadev doctor` shows
both limits.

Example:
    >>> peers_served(524288)
    43685
"""
import errno
import logging
import resource

from ..errors import errno_hint

__all__ = ["DESCRIPTORS_PER_PEER", "BASE_DESCRIPTORS", "needed", "peers_served", "check"]

#: Descriptors a task holds per peer task it exchanges tensors with. Measured 2026-11-28 on
#: loopback (shm), peak count from /proc of each `rdmadev serve` task, with four control
#: connections per peer then (calls and a heartbeat lane each way):
#: - one in-graph function in which every worker reads a ps variable, takes tf.unique of it
#:   and sends an update back: the ps held 11 more descriptors with 1 worker, 38 with 4 and
#:   74 with 8, ~9.3 per peer;
#: - `benchmarks/embedding.py --one` (2 ps, 27 transfers per worker and ps, 24 of them of
#:   run-time shape): each ps peaked at 19 with 1 worker and 51 with 4, ~10.7 per worker.
#: Since, a peer costs its control link (links.py; heartbeats go by datagram on one socket per
#: task), the fabric endpoint (a pidfd or socket) and a memfd per chunk of regions granted it
#: (a few per peer whatever the functions, _native/core/arena.h): tests/test_event_loop.py
#: measures 3 per peer with one function's pairs. Kept at 12: a peer's tcp or verbs endpoints
#: add sockets both ways, staged and grown channels add regions, and a warning too early costs
#: less than running out.
DESCRIPTORS_PER_PEER = 12
#: Descriptors a task holds before its first peer: Python, TensorFlow's gRPC server and the
#: control listener; measured 11 for `rdmadev serve` (2026-11-28), with room for log files.
BASE_DESCRIPTORS = 64

log = logging.getLogger(__name__)
log.addHandler(logging.NullHandler())


def needed(peers):
    """About how many descriptors a task needs to exchange tensors with `peers` other tasks."""
    return BASE_DESCRIPTORS + DESCRIPTORS_PER_PEER * peers


def peers_served(hard):
    """About how many peer tasks an open-file limit of `hard` serves (None: unlimited)."""
    return None if hard == resource.RLIM_INFINITY else max(0, hard - BASE_DESCRIPTORS) // DESCRIPTORS_PER_PEER


def check(task, peers):
    """Warns when this process's hard open-file limit is below what exchanging tensors with
    `peers` other tasks may need."""
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = needed(peers)
    if hard == resource.RLIM_INFINITY or hard >= want:
        return
    log.warning("rdmadev: task %s may run out of file descriptors: its open-file limit is %d, and "
                "exchanging tensors with the %d other tasks of its cluster (the coordinator "
                "included) may take about %d. Fix: %s", task, hard, peers, want,
                errno_hint(errno.EMFILE))
