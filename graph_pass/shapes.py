"""Shapes of transferred tensors, from TF's own shape information only.

TF's shape functions are the one source. The native pass runs TF's ShapeRefiner across the
partitions and writes each `_Recv`'s refined shape as its ``_output_shapes``
(``_native/tf/pass/shapes.cc``); ``rdmadev plan`` runs that same code through the op library
(``rdmadev.tools.tf_shapes``) before planning. This module only reads what TF wrote:

1. ``_output_shapes`` on the `_Recv` (authoritative when present);
2. else, on the sending side, ``_output_shapes`` of the node feeding the `_Send` (TF writes it on
   ``_Arg`` nodes, and on every node of a graph exported with shapes), or the shape of a Const's
   value.

There are no op-by-op rules. The one hand rule is where a TF shape function is known to be
wrong: the native side's ``trusted_output`` (``NativeRules``; rules.h, TrustedOutput: oneDNN's
fused ops past output 0, except its batch norms' outputs 1 and 2), which the pass applies too.
What TF does not prove stays unknown (-1 / None), and the policy keeps such a transfer on gRPC
unless the ops carry dynamic shapes.

For a tensor of run-time shape the same annotation may also give a bound on every dim (the
rules' ``bound_attr``; ``transfer_bound``): from the few ops whose output size depends on their
inputs' values, sized by those inputs, and TF's shape functions after them
(``_native/tf/pass/shapes.h`` says which ops). The policy starts such a channel's slots at the
bound when it is below the configured capacity.
"""

from .attrs import attr, parse_input, tensor_shape

__all__ = ["fully_defined", "data_input", "transfer_shape", "transfer_bound"]


def fully_defined(shape):
    """True when ``shape`` is a known rank with every dim known."""
    return shape is not None and all(d >= 0 for d in shape)


def data_input(node_def, i=0):
    """Return ``(source name, output index)`` of data input ``i`` of ``node_def``, or None."""
    ins = [p for p in map(parse_input, node_def.input) if not p.control]
    return (ins[i].name, ins[i].index) if i < len(ins) else None


def _declared(nd, index, trusted_output):
    """The shape TF wrote for output ``index`` of ``nd`` (None when it wrote none or is not trusted)."""
    if not trusted_output(nd.op, index):
        return None, f"not trusted: {nd.op} output {index} (TF's shape function is wrong there)"
    shapes = attr(nd, "_output_shapes")
    if shapes and index < len(shapes) and shapes[index] is not None:
        return shapes[index], f"_output_shapes of {nd.name}"
    if nd.op == "Const" and index == 0:
        value = attr(nd, "value")
        if value is not None:
            return tensor_shape(value), f"value of Const {nd.name}"
    return None, "unknown"


def transfer_shape(graph, send_key, recv_key, trusted_output):
    """Return ``(shape, source)`` of the tensor a pair carries, from what TF wrote on either half.

    Args:
        graph: the networkx graph from ``load``.
        send_key: the `_Send` node key, or None when only the receiving half is loaded.
        recv_key: the `_Recv` node key, or None when only the sending half is loaded.
        trusted_output: ``trusted_output(op, index)``, the native rule (``NativeRules``).

    Returns:
        ``(shape, source)``: shape a tuple (-1 = unknown dim) or None (unknown rank); source says
        where it came from. A fully defined shape wins over a partial one; the `_Recv`'s first,
        then the `_Send`'s own ``_output_shapes``, then its input's declared shape.
    """
    found = []
    if recv_key is not None:
        nd = graph.nodes[recv_key]["node_def"]
        shapes = attr(nd, "_output_shapes")
        if shapes and shapes[0] is not None:
            found.append((shapes[0], f"_output_shapes of {nd.name}"))
    if send_key is not None:
        nd = graph.nodes[send_key]["node_def"]
        shapes = attr(nd, "_output_shapes")  # rdmadev's pass writes it when TF's shapes know
        if shapes and shapes[0] is not None:
            found.append((shapes[0], f"_output_shapes of {nd.name}"))
        src = data_input(nd)
        key = (send_key[0], src[0]) if src else None
        if key is not None and key in graph:
            found.append(_declared(graph.nodes[key]["node_def"], src[1], trusted_output))
    for shape, source in found:
        if fully_defined(shape):
            return shape, source
    for shape, source in found:
        if shape is not None:
            return shape, source
    return None, found[-1][1] if found else "unknown"


def transfer_bound(graph, send_key, recv_key, bound_attr):
    """Return the bound (a tuple of dims) rdmadev's pass wrote for a pair's tensor, or None.

    Args:
        graph: the networkx graph from ``load``.
        send_key: the `_Send` node key, or None when only the receiving half is loaded.
        recv_key: the `_Recv` node key, or None when only the sending half is loaded.
        bound_attr: the attr the pass writes a bound under (``NativeRules.bound_attr``).

    Returns:
        The fully defined shape every dim of the tensor stays within, from either half's
        `bound_attr`; None when no half has one.
    """
    for key in (recv_key, send_key):
        if key is None:
            continue
        shapes = attr(graph.nodes[key]["node_def"], bound_attr)
        if shapes and fully_defined(shapes[0]):
            return tuple(shapes[0])
    return None
