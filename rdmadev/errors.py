"""Exception classes of rdmadev. Each carries the errno (0 if none) and a fix-it hint.

Example:
    >>> try:
    ...     region.wait(0, 1, timeout=0.1)
    ... except rdmadev.DeadlineExceeded as e:
    ...     print(e.hint)
"""
import errno as _errno
import os

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
    """A malformed descriptor, address or frame, or peers out of step."""


class ClosedError(RdmadevError):
    """The object was closed."""


# Must match rdmadev::ErrorKind in _native/core/common.h (the only C++ <-> Python table).
_BY_KIND = {
    1: ConfigError, 2: FabricError, 3: RegionError, 4: BoundsError, 5: DeadlineExceeded,
    6: PeerLostError, 7: AuthError, 8: ProtocolError, 9: ClosedError,
}


def _from_native(kind, err, message, hint):
    """Builds the exception for a core error (called from the native layer)."""
    cls = _BY_KIND.get(kind, RdmadevError)
    return cls(message, err, hint)


def errno_name(err):
    """'ETIMEDOUT' for 110, '' for 0."""
    return _errno.errorcode.get(err, "") if err else ""


def describe(err):
    return os.strerror(err) if err else ""
