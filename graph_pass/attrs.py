"""Read NodeDef attributes as plain Python values; works on TF's protos and on graph_pass._proto's.

Shapes are tuples of ints with -1 for an unknown dimension, or None when even the rank is unknown.
"""

__all__ = ["attr", "shape_from_proto", "tensor_shape", "tensor_ints", "parse_input", "NodeInput"]

import collections
import struct

#: One data or control input of a node: source node name, output index (-1 for control).
NodeInput = collections.namedtuple("NodeInput", "name index control")


def shape_from_proto(shape):
    """Convert a TensorShapeProto to a tuple (-1 = unknown dim) or None (unknown rank)."""
    if shape.unknown_rank:
        return None
    return tuple(int(d.size) for d in shape.dim)


def attr(node_def, name, default=None):
    """Return the value of attr ``name`` of ``node_def`` as a Python value, or ``default``.

    Args:
        node_def: a NodeDef message (TF's or graph_pass._proto's).
        name: the attr name, e.g. ``"tensor_name"``.
        default: returned when the attr is absent or empty.

    Returns:
        ``s`` -> str (UTF-8, undecodable bytes replaced); ``i`` -> int; ``f`` -> float; ``b`` -> bool;
        ``type`` -> int (DataType enum); ``shape`` -> tuple/None; ``tensor`` -> the TensorProto;
        ``list`` -> a list of the first non-empty member kind (shapes converted).
    """
    if name not in node_def.attr:
        return default
    value = node_def.attr[name]
    kind = value.WhichOneof("value")
    if kind is None:
        return default
    if kind == "s":
        return value.s.decode("utf-8", "replace")
    if kind == "shape":
        return shape_from_proto(value.shape)
    if kind == "list":
        lst = value.list
        for member in ("shape", "type", "i", "s", "f", "b", "tensor"):
            items = getattr(lst, member)
            if len(items):
                if member == "shape":
                    return [shape_from_proto(s) for s in items]
                if member == "s":
                    return [s.decode("utf-8", "replace") for s in items]
                return list(items)
        return []
    return getattr(value, kind)


def tensor_shape(tensor):
    """Return the shape of a TensorProto (a tuple)."""
    return shape_from_proto(tensor.tensor_shape)


def tensor_ints(tensor):
    """Return the integer values of a small int32/int64 TensorProto (e.g. a shape Const), or None.

    Args:
        tensor: a TensorProto of dtype DT_INT32 (3) or DT_INT64 (9).

    Returns:
        A list of ints, or None when the dtype is not an integer type or the values are missing.
    """
    if tensor.dtype == 3:
        if tensor.tensor_content:
            return list(struct.unpack(f"<{len(tensor.tensor_content) // 4}i", tensor.tensor_content))
        values = list(tensor.int_val)
    elif tensor.dtype == 9:
        if tensor.tensor_content:
            return list(struct.unpack(f"<{len(tensor.tensor_content) // 8}q", tensor.tensor_content))
        values = list(tensor.int64_val)
    else:
        return None
    shape = tensor_shape(tensor)
    count = 1
    for d in shape or ():
        count *= d
    if len(values) == 1 and count > 1:  # TF stores a splat as one value
        values = values * count
    return values if len(values) == count else None


def parse_input(text):
    """Parse a NodeDef input string: ``"x"``, ``"x:1"`` or ``"^x"`` -> NodeInput."""
    if text.startswith("^"):
        return NodeInput(text[1:], -1, True)
    name, sep, index = text.rpartition(":")
    if sep and index.isdigit():
        return NodeInput(name, int(index), False)
    return NodeInput(text, 0, False)

