"""The byte layout of receive regions: the ONE definition shared with the native layer.

Every constant below is serialized into each plan (``Plan.layout``, from ``layout_dict()``), so the
native write/wait ops read them from the plan instead of keeping a copy in C++ in sync by hand.

A task registers one block per plan; the block holds one **region** per sending peer task, each
starting on a ``REGION_ALIGNMENT`` boundary. A region holds one **channel** per planned transfer,
in channel-key order; a channel is ``slots`` consecutive **slots** of ``slot_bytes`` each::

    slot (slot_bytes, a multiple of ALIGNMENT)
    +0   header, SLOT_HEADER_BYTES = 64
         +0  u64 sequence word (SEQ_OFFSET): written last, with release ordering; 0 = never written
         +8  u64 payload byte length (LENGTH_OFFSET) of this message
         +16 .. +63 reserved, zero
    +64  shape block (dynamic channels only): u64 rank at +0, then u64 dims[rank_capacity] at +8;
         its size is rounded up to ALIGNMENT
    +payload_offset  payload: capacity_bytes rounded up to ALIGNMENT

Static channels have no shape block (payload_offset = 64); control signals have no payload
(slot_bytes = 64). Integers are little-endian (every supported host is x86-64 or aarch64 LE).
"""

__all__ = [
    "ALIGNMENT", "SLOT_HEADER_BYTES", "SEQ_OFFSET", "SEQ_BYTES", "LENGTH_OFFSET", "LENGTH_BYTES",
    "SHAPE_RANK_OFFSET", "SHAPE_DIMS_OFFSET", "SHAPE_DIM_BYTES", "REGION_ALIGNMENT", "BYTE_ORDER",
    "round_up", "shape_block_bytes", "slot_bytes", "end_to_end", "layout_dict",
]

#: Alignment of every slot, header and payload, in bytes. 64 is a cache line on x86-64 and most
#: aarch64 parts, so the sequence word the receiver polls never shares a line with another slot's
#: payload (no false sharing between the writer and the poller), and it equals TF's
#: EIGEN_MAX_ALIGN_BYTES=64 (from tf.sysconfig.get_compile_flags()), so a payload can be aliased as
#: a Tensor buffer without a copy.
ALIGNMENT = 64
#: Bytes of the slot header. One aligned unit: room for the two words below plus reserved space.
SLOT_HEADER_BYTES = 64
#: Offset of the u64 sequence word in the slot header; published last with release ordering.
SEQ_OFFSET = 0
#: Width of the sequence word.
SEQ_BYTES = 8
#: Offset of the u64 payload byte length in the slot header.
LENGTH_OFFSET = 8
#: Width of the length word.
LENGTH_BYTES = 8
#: Offset of the u64 rank inside a dynamic slot's shape block (the block starts at SLOT_HEADER_BYTES).
SHAPE_RANK_OFFSET = 0
#: Offset of the first u64 dimension inside the shape block.
SHAPE_DIMS_OFFSET = 8
#: Width of one dimension in the shape block (TF dims are int64).
SHAPE_DIM_BYTES = 8
#: Alignment of each region inside a task's block: a page, so every region can be registered
#: (ibv_reg_mr) or mapped (mmap of a memfd) on its own without sharing a page with another peer's.
REGION_ALIGNMENT = 4096
#: Byte order of every integer in a region.
BYTE_ORDER = "little"


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


def shape_block_bytes(rank_capacity):
    """Bytes of a dynamic slot's shape block holding up to ``rank_capacity`` dims (0 for static).

    Args:
        rank_capacity: the largest rank the channel carries, or None for a static channel.

    Returns:
        The block size, a multiple of ``ALIGNMENT``.
    """
    if rank_capacity is None:
        return 0
    return round_up(SHAPE_DIMS_OFFSET + SHAPE_DIM_BYTES * rank_capacity, ALIGNMENT)


def slot_bytes(capacity_bytes, rank_capacity=None):
    """Return ``(slot_bytes, payload_offset)`` for a slot carrying up to ``capacity_bytes``.

    Args:
        capacity_bytes: payload bytes (exact for static shapes, the bound for dynamic ones).
        rank_capacity: dims the shape block holds (dynamic channels), or None (static).

    Returns:
        A tuple ``(slot_bytes, payload_offset)``, both multiples of ``ALIGNMENT``.

    Example:
        >>> slot_bytes(100)
        (192, 64)
    """
    payload_offset = SLOT_HEADER_BYTES + shape_block_bytes(rank_capacity)
    return payload_offset + round_up(capacity_bytes, ALIGNMENT), payload_offset


def end_to_end(extents):
    """Offsets of a region's channels laid end to end, in order, and the bytes they use (the
    region is that rounded up to ``REGION_ALIGNMENT``): the one rule the planner and a task
    laying a pair out again (rdmadev.cluster.channels) share.

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


def layout_dict():
    """Return every layout constant as a JSON-ready dict (stored in each plan as ``layout``)."""
    return {
        "alignment": ALIGNMENT, "slot_header_bytes": SLOT_HEADER_BYTES,
        "seq_offset": SEQ_OFFSET, "seq_bytes": SEQ_BYTES,
        "length_offset": LENGTH_OFFSET, "length_bytes": LENGTH_BYTES,
        "shape_block_offset": SLOT_HEADER_BYTES, "shape_rank_offset": SHAPE_RANK_OFFSET,
        "shape_dims_offset": SHAPE_DIMS_OFFSET, "shape_dim_bytes": SHAPE_DIM_BYTES,
        "region_alignment": REGION_ALIGNMENT, "byte_order": BYTE_ORDER,
    }
