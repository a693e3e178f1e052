"""Ends a launch.Cluster's tasks when the process that started them dies without stopping
them (SIGKILL, the OOM killer): the tasks run in sessions of their own, so nothing else would,
and an `rdmadev serve` task serves until killed, holding its ports, memory and CPU.

Run by launch.Cluster as ``python -I reaper.py GRACE_S`` (this file alone: no rdmadev, no TF),
its stdin a pipe from the Cluster with one line per change:

    +<pgid>   a task's process group started
    -<pgid>   that group ended and was waited for (kill(), stop(), or it exited on its own)

End of file while groups are still listed means the Cluster's process is gone: each is sent
SIGTERM, then SIGKILL after GRACE_S seconds (the grace launch.Cluster.stop gives). After a
normal stop() the list is empty and the reaper just exits.

Why not PR_SET_PDEATHSIG in each task: it fires when the *thread* that forked the task exits,
and clusters are started from threads that end (pytest fixtures, timers).
"""
import os
import signal
import sys
import time

__all__ = ["end_groups", "main"]

#: Seconds between checks that a terminated group is gone.
POLL_S = 0.1


def _alive(pgid):
    try:
        os.killpg(pgid, 0)
        return True
    except (ProcessLookupError, PermissionError):  # gone, or the id is someone else's now
        return False


def _signal(pgids, sig):
    for pgid in pgids:
        try:
            os.killpg(pgid, sig)
        except (ProcessLookupError, PermissionError):
            pass


def end_groups(pgids, grace_s):
    """SIGTERM every group, then SIGKILL those still there after ``grace_s``."""
    _signal(pgids, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline and any(_alive(p) for p in pgids):
        time.sleep(POLL_S)
    _signal([p for p in pgids if _alive(p)], signal.SIGKILL)


def main():
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a terminal's ^C is the Cluster's to handle
    groups = set()
    for line in sys.stdin:
        line = line.strip()
        if line[:1] == "+":
            groups.add(int(line[1:]))
        elif line[:1] == "-":
            groups.discard(int(line[1:]))
    if groups:
        try:  # the stderr it shares with the dead process may be a pipe nobody reads now
            print(f"rdmadev.testing.reaper: the process that started TF tasks (process groups "
                  f"{sorted(groups)}) exited without stopping them; ending them", file=sys.stderr,
                  flush=True)
        except OSError:
            pass
        end_groups(sorted(groups), float(sys.argv[1]))


if __name__ == "__main__":
    main()
