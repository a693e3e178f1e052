"""The byte layout of receive regions: how the planner lays them out, from the native constants.

The constants are the native protocol's, defined once in C++ (``_native/core/channel.h``, where
each is explained): the planner keeps no copy. Its caller hands them in as a ``Layout``
(rdmadev's bridge and ``rdmadev plan`` give ``rdmadev._core.LAYOUT``, built from the bindings'
``wire_layout()``), and each plan records the one it was laid out with (``Plan.layout``).

A task registers one block per plan; the block holds one **region** per sending peer task, each
starting on a ``region_alignment`` boundary. A region holds one **channel** per planned
transfer, in channel-key order; a channel is ``slots`` consecutive **slots** of ``slot_bytes``
each::

    slot (slot_bytes, a multiple of alignment)
    +0   header, slot_header_bytes
         +seq_offset     u64 sequence word: written last, with release ordering; 0 = never written
         +length_offset  u64 payload byte length of this message
    +shape_block_offset  shape block (dynamic channels only): u64 rank at +shape_rank_offset,
                         then u64 dims[rank_capacity] at +shape_dims_offset; its size is rounded
                         up to alignment
    +payload_offset      payload: capacity_bytes rounded up to alignment

Static channels have no shape block (payload_offset = slot_header_bytes); control signals have
no payload (slot_bytes = slot_header_bytes).
"""

import dataclasses
import functools
from dataclasses import dataclass

from .errors import ConfigError

__all__ = ["Layout", "round_up", "end_to_end"]


def round_up(n, multiple):
    """Round ``n`` up to a multiple of ``multiple``.

    Args:
        n: a non-negative int.
        multiple: a positive int.

    Returns:
        The smallest multiple of ``multiple`` that is >= ``n``.

    Example:
        >>> round_up(65, 64)
        128
    """
    return -(-n // multiple) * multiple


def end_to_end(extents):
    """Offsets of a region's channels laid end to end, in order, and the bytes they use (the
    region is that rounded up to ``Layout.region_alignment``): the one rule the planner and a
    task laying a pair out again (rdmadev.cluster.channels) share.

    Args:
        extents: each channel's bytes (``slots * slot_bytes``), in channel-key order.

    Returns:
        ``(offsets, used_bytes)``.

    Example:
        >>> end_to_end([128, 64])
        ([0, 128], 192)
    """
    offsets, used = [], 0
    for n in extents:
        offsets.append(used)
        used += n
    return offsets, used


@dataclass(frozen=True)
class Layout:
    """The native protocol's slot and region constants (``_native/core/channel.h``) and the
    layout rules over them.

    Attributes:
        alignment: of every slot, header and payload, in bytes.
        slot_header_bytes: bytes of a slot's header.
        seq_offset, seq_bytes: where the u64 sequence word lies in the header.
        length_offset, length_bytes: where the u64 payload length lies in the header.
        shape_block_offset: where a dynamic slot's shape block starts.
        shape_rank_offset: of the u64 rank inside the shape block.
        shape_dims_offset: of the first u64 dimension inside the shape block.
        shape_dim_bytes: width of one dimension there.
        region_alignment: of each region inside a task's block.
        byte_order: of every integer in a region (``"little"``).

    Example (``LAYOUT``: rdmadev._core's, the native values)::

        LAYOUT.slot_bytes(100)  # (192, 64)
    """

    alignment: int
    slot_header_bytes: int
    seq_offset: int
    seq_bytes: int
    length_offset: int
    length_bytes: int
    shape_block_offset: int
    shape_rank_offset: int
    shape_dims_offset: int
    shape_dim_bytes: int
    region_alignment: int
    byte_order: str

    def __post_init__(self):
        for f in dataclasses.fields(self):
            v = getattr(self, f.name)
            if f.name == "byte_order":
                if v not in ("little", "big"):
                    raise ConfigError(f"layout byte_order={v!r}: must be 'little' or 'big'")
            elif not isinstance(v, int) or isinstance(v, bool) or v < 0:
                raise ConfigError(f"layout {f.name}={v!r}: must be an int >= 0")
        for name in ("alignment", "region_alignment"):
            if getattr(self, name) < 1:
                raise ConfigError(f"layout {name}={getattr(self, name)!r}: must be >= 1")

    @classmethod
    def from_dict(cls, data):
        """The layout a plan recorded (``Plan.layout``, ``to_dict()``).

        Raises:
            ConfigError: a field is missing, unknown or of the wrong type.
        """
        names = {f.name for f in dataclasses.fields(cls)}
        if not isinstance(data, dict) or set(data) != names:
            got = set(data) if isinstance(data, dict) else set()
            raise ConfigError(f"not a slot layout: missing {sorted(names - got)}, unknown {sorted(got - names)}")
        return cls(**data)

    def to_dict(self):
        """Every constant as a JSON-ready dict (stored in each plan as ``layout``): a new one."""
        return dict(self._dict)

    @functools.cached_property
    def _dict(self):
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}

    def shape_block_bytes(self, rank_capacity):
        """Bytes of a dynamic slot's shape block holding up to ``rank_capacity`` dims (0 for static).

        Args:
            rank_capacity: the largest rank the channel carries, or None for a static channel.

        Returns:
            The block size, a multiple of ``alignment``.
        """
        if rank_capacity is None:
            return 0
        return round_up(self.shape_dims_offset + self.shape_dim_bytes * rank_capacity, self.alignment)

    def slot_bytes(self, capacity_bytes, rank_capacity=None):
        """Return ``(slot_bytes, payload_offset)`` for a slot carrying up to ``capacity_bytes``.

        Args:
            capacity_bytes: payload bytes (exact for static shapes, the bound for dynamic ones).
            rank_capacity: dims the shape block holds (dynamic channels), or None (static).

        Returns:
            A tuple ``(slot_bytes, payload_offset)``, both multiples of ``alignment``.

        Example:
            >>> LAYOUT.slot_bytes(100)  # doctest: +SKIP
            (192, 64)
        """
        payload_offset = self.shape_block_offset + self.shape_block_bytes(rank_capacity)
        return payload_offset + round_up(capacity_bytes, self.alignment), payload_offset
