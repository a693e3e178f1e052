"""What a task's counters say it holds, as the tests judge it."""

__all__ = ["other_fds"]


def other_fds(counters):
    """A task's open descriptors besides its control connections (a task's `counters`
    request). Those are judged apart: a link to a peer task comes with its first call either
    way (links.py), and a coordinator's connection with the coordinator."""
    return counters["fds"] - sum(counters["control_connections"].values())
