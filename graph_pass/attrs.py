"""Read NodeDef attributes as plain Python values; works on TF's protos and on graph_pass._proto's.

Shapes are tuples of ints with -1 for an unknown dimension, or None when even the rank is unknown.
"""

__all__ = ["attr", "shape_from_proto", "tensor_shape", "parse_input", "NodeInput"]

import collections

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


def parse_input(text):
    """Parse a NodeDef input string: ``"x"``, ``"x:1"`` or ``"^x"`` -> NodeInput."""
    if text.startswith("^"):
        return NodeInput(text[1:], -1, True)
    name, sep, index = text.rpartition(":")
    if sep and index.isdigit():
        return NodeInput(name, int(index), False)
    return NodeInput(text, 0, False)

