"""A task raises its soft resource limits to the hard ones when it starts, for the two limits
its peers make it need more of:

- RLIMIT_NOFILE: descriptors per peer task (open_files.py); a soft limit below the hard one
  only protects programs that still use select(2), and rdmadev and TensorFlow poll and epoll
  (Go's runtime raises it for every program).
- RLIMIT_MEMLOCK: the verbs fabric pins every region it registers, and a task registers its
  channels' rings, each the bytes its pairs move a step (up to RDMADEV_MAX_REGISTERED_BYTES).
  Systems often start a process with a soft limit of 64 KiB or 8 MiB under a larger hard one
  (limits.conf sets both); what stays above the hard limit fails registration with a
  RegionError naming the limit and how to raise it (verbs_memory.cc). Root with CAP_IPC_LOCK
  is exempt.

Example:
    >>> raise_soft_limits()  # nofile soft 1024, hard 524288 -> soft 524288; memlock likewise
"""
import logging
import resource

__all__ = ["RAISED", "raise_soft_limits"]

#: (limit, what a log line calls it) of the limits a task raises.
RAISED = ((resource.RLIMIT_NOFILE, "open-file"), (resource.RLIMIT_MEMLOCK, "locked-memory"))

log = logging.getLogger(__name__)
log.addHandler(logging.NullHandler())


def raise_soft_limits():
    """Raises this process's soft limits of RAISED to their hard limits."""
    for which, what in RAISED:
        soft, hard = resource.getrlimit(which)
        if soft == resource.RLIM_INFINITY or (hard != resource.RLIM_INFINITY and soft >= hard):
            continue
        try:
            resource.setrlimit(which, (hard, hard))
        except (ValueError, OSError) as e:  # e.g. an open-file hard limit above fs.nr_open
            log.info("rdmadev: kept the %s limit at %d: raising it to %d failed: %s", what, soft,
                     hard, e)
            continue
        log.info("rdmadev: %s limit raised from %d to %d (the hard limit)", what, soft, hard)
