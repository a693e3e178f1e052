"""What the parts of a task's channel setup (channels.py, half_pairs.py, growth.py,
recovery.py, registered.py) say alike: a task's Domain identity, errors named for what
failed, how often the table's watcher looks, and the steps of setting up one pair's halves
(its ring layouts, the region size the plan allows, binding, letting go on failure)."""
from graph_pass.devices import split_task

from .. import _core
from ..errors import ProtocolError, RdmadevError
from .opening import LAYOUT_FIELDS

__all__ = ["domain_identity", "reason_of", "error_naming", "WATCH_INTERVAL_S", "ring_layout",
           "planned_bytes", "let_go", "build_half", "bind_halves"]

#: Seconds between two looks of ChannelTable's watcher for dead peers (their halves are then
#: unbound): how long a dead task's channels, regions and mappings outlive it here (a step on
#: them fails at once anyway: the fabric's liveness check names the peer).
WATCH_INTERVAL_S = 0.5


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


def ring_layout(channel):
    """The ring layout a channel entry carries: the plan's, field for field."""
    return _core.RingLayout(**{f: channel[f] for f in LAYOUT_FIELDS})


def planned_bytes(size, layouts, label):
    """`size`, the bytes asked for a pair's region, if it is what the plan gives channels
    `layouts`: their extent rounded up to the layout's region_alignment (a peer cannot ask for
    more)."""
    extent = max(l.offset + l.bytes for l in layouts)
    alignment = _core.LAYOUT.region_alignment
    planned = -(-extent // alignment) * alignment
    if type(size) is not int or not extent <= size <= planned:
        raise ProtocolError(f"region {label} of {size!r} bytes is not what the plan gives its "
                            f"{len(layouts)} channel(s) ({extent} bytes, {planned} once "
                            "aligned); nothing was allocated",
                            hint="run the same rdmadev version in every task")
    return size


def let_go(*held):
    """Closes what a failed setup holds (regions, leases, attachments; None skipped) at once:
    the traceback keeps the failing frame, and with it these, alive for as long as the
    caller keeps the error."""
    for h in held:
        if h is not None:
            h.close()


def build_half(make, i, channel, failing):
    """``make(i, channel)``: builds a half of `channel`, the i-th of its pair; on failure its
    error is raised with ``failing(key)`` before its message."""
    try:
        return make(i, channel)
    except Exception as e:
        raise error_naming(e, failing(channel["key"])) from None


def bind_halves(channels, half, lease, peer, make, failing, successor=False):
    """Builds (``make(i, channel)``) and binds `half` ("send" or "recv") of every channel of
    one pair, holding `lease` (as successors: growth). On any failure the halves bound so far
    are unbound and the error is raised with ``failing(key)`` before its message."""
    try:
        for i, c in enumerate(channels):
            h = build_half(make, i, c, failing)
            if half == "send":  # the receiver alone may read what the sender stages
                h.bind(c["key"], lease, peer=peer, successor=successor,
                       reader=domain_identity(peer))
            else:
                h.bind(c["key"], lease, peer=peer, successor=successor)
    except BaseException:
        if not successor:  # a grown pair has one channel: nothing of it was bound
            for c in channels:
                _core.unbind_channel(c["key"], half)
        raise
