"""TF's own shape inference over partition graphs, for offline planning (``rdmadev plan``).

Partition graphs from run metadata carry almost no shapes (``_output_shapes`` on ``_Arg`` nodes,
``_handle_shapes`` on resource arguments). The native pass fills them in with TF's ShapeRefiner
before it calls the planner (``_native/tf/pass.cc``, AnnotateRecvShapes); this module does the
same for graphs planned offline, through TensorFlow's importer, which runs every op's registered
shape function and honours ``_output_shapes`` attrs:

    repeat until nothing new is learned (at most ``SHAPE_ROUNDS`` times):
        import each partition, with the shapes known so far on its `_Recv` nodes;
        record the fully known shape of the tensor each `_Send` sends
    write each known shape as ``_output_shapes`` on its `_Recv`

The one hand rule is ``shapes.trusted_output`` (oneDNN fused ops past output 0), as in the pass.
This module imports TensorFlow; graph_pass's planner never imports it (only the CLI does).
"""

import logging
import re

from .attrs import attr
from .find_transfers import RENDEZVOUS_ATTRS
from .load import RECV_OPS, SEND_OPS
from .shapes import data_input, trusted_output

__all__ = ["annotate", "SHAPE_ROUNDS"]

log = logging.getLogger(__name__)
log.addHandler(logging.NullHandler())

#: Rounds of cross-partition propagation, as in the native pass: a shape crosses one task boundary
#: per round; a step crosses at most a few (ps -> worker -> ps), and a round imports every partition.
SHAPE_ROUNDS = 4
# Node names TF's Python importer accepts; partition graphs also hold names such as "_EagerConst".
_VALID_NAME = re.compile(r"^[A-Za-z0-9.][A-Za-z0-9_.\-/>]*$")


def _key(nd):
    return tuple(attr(nd, a) for a in RENDEZVOUS_ATTRS)


def _set_recv_shapes(gd, known):
    for nd in gd.node:
        if nd.op in RECV_OPS and _key(nd) in known:
            nd.attr["_output_shapes"].list.Clear()
            proto = nd.attr["_output_shapes"].list.shape.add()
            for d in known[_key(nd)]:
                proto.dim.add(size=d)


def _importable(gd, graph_pb2):
    """A copy of ``gd`` with node names the Python importer accepts (same structure)."""
    names = {n.name: n.name if _VALID_NAME.match(n.name) else f"rdmadev.renamed.{i}" for i, n in enumerate(gd.node)}
    if all(k == v for k, v in names.items()):
        return gd, names
    out = graph_pb2.GraphDef()
    out.CopyFrom(gd)
    for nd in out.node:
        nd.name = names[nd.name]
        for i, text in enumerate(nd.input):
            ctrl, rest = ("^", text[1:]) if text.startswith("^") else ("", text)
            base, sep, idx = rest.rpartition(":")
            base, sep, idx = (base, sep, idx) if sep and idx.isdigit() else (rest, "", "")
            nd.input[i] = ctrl + names.get(base, base) + sep + idx
    return out, names


def _send_shapes(tf, graph_pb2, gd):
    """``{rendezvous key: dims}`` for each `_Send` of ``gd`` whose input TF's shape functions fully define."""
    importable, names = _importable(gd, graph_pb2)
    g = tf.Graph()
    try:
        with g.as_default():
            tf.graph_util.import_graph_def(importable, name="")
    except (ValueError, TypeError, tf.errors.OpError) as exc:  # e.g. an op not registered in this process
        log.debug("shape inference skipped a partition: %s", exc)
        return {}
    out = {}
    for nd in gd.node:
        src = data_input(nd) if nd.op in SEND_OPS else None
        if src is None or src[0] not in names:
            continue
        op = g.get_operation_by_name(names[src[0]])
        if not trusted_output(op.type, src[1]) or src[1] >= len(op.outputs):
            continue
        shape = op.outputs[src[1]].shape
        if shape.is_fully_defined():
            out[_key(nd)] = tuple(shape.as_list())
    return out


def annotate(partitions, rounds=SHAPE_ROUNDS):
    """Return copies of ``partitions`` whose `_Recv` nodes carry TF's inferred ``_output_shapes``.

    Args:
        partitions: the GraphDefs of one instantiation (TF's messages, graph_pass's, or bytes).
        rounds: rounds of cross-partition propagation.

    Returns:
        A list of TF GraphDef messages (the inputs are not modified). A `_Recv` that already has
        ``_output_shapes`` keeps it unless TF infers a fully defined shape for its tensor.

    Example:
        >>> plan = plan_partitions(annotate(partition_sets(run_metadata)[0]))  # doctest: +SKIP
    """
    import tensorflow as tf
    from tensorflow.core.framework import graph_pb2

    gds = []
    for p in partitions:
        data = bytes(p) if isinstance(p, (bytes, bytearray, memoryview)) else p.SerializeToString()
        gds.append(graph_pb2.GraphDef.FromString(data))
    known = {}
    for _ in range(rounds):
        before = len(known)
        for gd in gds:
            _set_recv_shapes(gd, known)
            known.update(_send_shapes(tf, graph_pb2, gd))
        if len(known) == before:
            break
    for gd in gds:
        _set_recv_shapes(gd, known)
    log.debug("TF shape inference: %d transfer shapes known", len(known))
    return gds
