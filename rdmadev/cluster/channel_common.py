"""What the parts of a task's channel setup (channels.py, half_pairs.py, growth.py,
recovery.py) say alike: a task's Domain identity, and errors named for what failed."""
from graph_pass.devices import split_task

from ..errors import ProtocolError, RdmadevError

__all__ = ["domain_identity", "reason_of", "error_naming"]


def domain_identity(task):
    """The Domain identity ("job:index") of task name `task` (what fabrics authenticate)."""
    job, index = split_task(task)
    return f"{job}:{index}"


def reason_of(e):
    """What exception `e` says, without its fix (the caller names its own)."""
    return e.args[0] if isinstance(e, RdmadevError) and e.args else f"{type(e).__name__}: {e}"


def error_naming(e, what):
    """Exception `e` again, its message prefixed with `what` (errno and hint kept)."""
    if isinstance(e, RdmadevError):
        return type(e)(f"{what}: {reason_of(e)}", e.errno, e.hint)
    return ProtocolError(f"{what}: {reason_of(e)}")
