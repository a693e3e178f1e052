"""What a task's counters say it holds, as the tests judge it."""

__all__ = ["other_fds"]


def other_fds(counters):
    """A task's open descriptors besides its control connections (a task's `counters`
    request). Those are judged apart: they grow to the most calls once in flight at once
    between two tasks (runtime.Runtime._give_back), and so with the machine's load."""
    return counters["fds"] - sum(counters["control_connections"].values())
