"""Exception classes of rdmadev. Each carries the errno (0 if none) and a fix-it hint.

Example:
    >>> try:
    ...     region.wait(0, 1, timeout=0.1)
    ... except rdmadev.DeadlineExceeded as e:
    ...     print(e.hint)
"""
__all__ = [
    "RdmadevError", "ConfigError", "FabricError", "RegionError", "BoundsError",
    "DeadlineExceeded", "PeerLostError", "AuthError", "ProtocolError", "ClosedError",
]


class RdmadevError(Exception):
    """Base class: `errno` (int, 0 if none) and `hint` (how to fix it, may be empty)."""

    def __init__(self, message, errno=0, hint=""):
        super().__init__(message)
        self.errno = errno
        self.hint = hint

    def __str__(self):
        text = super().__str__()
        return f"{text}. Fix: {self.hint}" if self.hint else text


class ConfigError(RdmadevError, ValueError):
    """A bad option or environment variable; the message names it."""


class FabricError(RdmadevError):
    """A fabric could not be opened or chosen."""


class RegionError(RdmadevError, MemoryError):
    """Allocating, registering or mapping a region failed."""


class BoundsError(RdmadevError, IndexError):
    """An offset or length outside a region (or larger than a planned slot)."""


class DeadlineExceeded(RdmadevError, TimeoutError):
    """A wait or transfer passed its deadline."""


class PeerLostError(RdmadevError, ConnectionError):
    """The peer task died or closed its connection."""


class AuthError(RdmadevError, PermissionError):
    """A peer failed authentication (different cluster secret)."""


class ProtocolError(RdmadevError):
    """A malformed descriptor, address or frame, or peers out of step. A request a peer
    task refused has `kind`: the class name of what it raised there ("RegionError": past its
    registered-memory budget); "" else. A channel setup a receiving task refused for lack of
    room within its budget has `over_budget`: that task (opening.open_channels); None else."""

    kind = ""
    over_budget = None


class ClosedError(RdmadevError):
    """The object was closed."""


#: Exception class for each native error kind, by the kind's name in C++ (the
#: RDMADEV_ERROR_KINDS table in _native/core/common.h). The numbers are never written here:
#: rdmadev._core hands the native {name: value} table to _bind_native_kinds() at import (and
#: class_for_kind() reads it itself if a native module is used without rdmadev._core).
CLASS_BY_KIND_NAME = {
    "config": ConfigError, "fabric": FabricError, "region": RegionError, "bounds": BoundsError,
    "timeout": DeadlineExceeded, "peer_lost": PeerLostError, "auth": AuthError,
    "protocol": ProtocolError, "closed": ClosedError,
}

# Native kind value -> class, filled by _bind_native_kinds() when rdmadev._core is imported.
_BY_KIND = {}


def _bind_native_kinds(kinds):
    """Maps the native kinds ({name: value}, from rdmadev._core.error_kinds()) to classes.

    Raises:
        ImportError: a native kind has no class here (the core and this file disagree).
    """
    missing = sorted(set(kinds) - set(CLASS_BY_KIND_NAME))
    if missing:
        raise ImportError(f"rdmadev's native core has error kinds {missing} that "
                          "rdmadev/errors.py does not map; rebuild rdmadev from one source tree")
    _BY_KIND.clear()
    _BY_KIND.update({value: CLASS_BY_KIND_NAME[name] for name, value in kinds.items()})


def class_for_kind(kind):
    """The exception class for native error kind `kind` (an int from the core)."""
    if not _BY_KIND:
        from ._native.domain import error_kinds  # run time: the native modules import this one
        _bind_native_kinds(error_kinds())
    return _BY_KIND.get(kind, RdmadevError)


def _from_native(kind, err, message, hint):
    """Builds the exception for a core error (called from the native layer)."""
    return class_for_kind(kind)(message, err, hint)


def errno_hint(err, hint=""):
    """The hint for a failure with errno `err`: the core's own when the errno alone says what to
    fix (out of file descriptors: EMFILE, ENFILE; native errors carry it already), else `hint`."""
    from ._native.domain import errno_hint as core_hint  # run time: the native modules import this one
    return (core_hint(err) if err else "") or hint
