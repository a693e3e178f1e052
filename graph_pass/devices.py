"""TF device and task names: the one parser every layer of rdmadev uses.

A full device name is ``/job:J/replica:R/task:T/device:KIND:N``; TF also writes the legacy
``/job:J/replica:R/task:T/cpu:0`` and partial names (``/job:ps/task:1``, ``/job:ps``). A *task*
name is the ``/job:J/replica:R/task:T`` prefix. Pure Python (no TensorFlow): the planner and the
control plane both parse names, and neither may import TF.

Example:
    >>> parse_device("/job:ps/replica:0/task:1/device:CPU:0")
    Device(job='ps', replica=0, task=1, kind='CPU', index=0)
    >>> task_of("/job:worker/task:2/device:CPU:0")
    '/job:worker/replica:0/task:2'
"""

import functools
import re
from typing import NamedTuple

__all__ = ["Device", "parse_device", "task_of", "job_of", "task_name", "split_task"]

# Each field is optional in TF's own names; the order is fixed. "device:KIND:N" or legacy "KIND:N".
_DEVICE_RE = re.compile(
    r"^(?:/job:(?P<job>[^/:]+))?"
    r"(?:/replica:(?P<replica>\d+))?"
    r"(?:/task:(?P<task>\d+))?"
    r"(?:/(?:device:)?(?P<kind>[A-Za-z_][A-Za-z0-9_]*):(?P<index>\d+|\*))?/?$")


class Device(NamedTuple):
    """A parsed device name; fields absent from the name are None (replica and task: 0 once a job is named)."""

    job: str
    replica: int
    task: int
    kind: str
    index: int

    @property
    def task_name(self):
        """``/job:J/replica:R/task:T``, or ``""`` when the name has no job (a local device)."""
        return task_name(self.job, self.task, self.replica) if self.job else ""


@functools.lru_cache(maxsize=4096)  # a plan asks of the same few names thousands of times
def parse_device(name):
    """Parse a TF device or task name.

    Args:
        name: e.g. ``/job:ps/replica:0/task:0/device:CPU:0``, ``/job:ps/task:1``, ``/cpu:0`` or ``""``.

    Returns:
        A ``Device``. With a job, a missing replica or task is 0 (TF's defaults); without one, both are None.

    Raises:
        ValueError: ``name`` is not a device name (the message quotes it and the expected form).
    """
    m = _DEVICE_RE.match(name or "")
    if m is None:
        raise ValueError(f"{name!r} is not a TF device name; expected /job:J/replica:R/task:T/device:KIND:N")
    job = m.group("job")
    replica, task = m.group("replica"), m.group("task")
    index = m.group("index")
    return Device(job=job,
                  replica=int(replica) if replica is not None else (0 if job else None),
                  task=int(task) if task is not None else (0 if job else None),
                  kind=m.group("kind"),
                  index=None if index in (None, "*") else int(index))


def task_of(name):
    """The task a device belongs to, ``/job:J/replica:R/task:T`` (``""`` for a name without a job).

    Raises:
        ValueError: not a device name.
    """
    return parse_device(name).task_name


def job_of(name):
    """The job of a device or task name (``""`` when it names none).

    Raises:
        ValueError: not a device name.
    """
    return parse_device(name).job or ""


def task_name(job, index, replica=0):
    """``/job:{job}/replica:{replica}/task:{index}``, the canonical task name."""
    return f"/job:{job}/replica:{int(replica)}/task:{int(index)}"


def split_task(name):
    """``(job, task index)`` of a task or device name.

    Raises:
        ValueError: not a device name, or it names no job.
    """
    d = parse_device(name)
    if not d.job:
        raise ValueError(f"{name!r} names no job; expected /job:J/replica:R/task:T")
    return d.job, d.task
