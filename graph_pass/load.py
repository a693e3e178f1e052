"""Pass 1, load: partition graphs (protos or serialized bytes) -> one networkx MultiDiGraph.

One format for both sources: the native POST_PARTITIONING pass hands over ``{device: GraphDef
bytes}``; offline analysis takes ``RunMetadata.function_graphs[i].partition_graphs`` (TF message
objects) or a saved RunMetadata file (see ``partition_sets``). Either way each node becomes a
networkx node keyed ``(partition, name)`` with data ``op``, ``name``, ``device``, ``partition`` and
``node_def`` (the NodeDef message; attrs are read lazily with ``graph_pass.attrs.attr``), plus an
empty ``rdmadev`` dict where later passes keep their results. Edges carry ``src_output``,
``dst_input`` (-1 for control edges) and ``control``.
"""

import functools
import logging
import re
from collections.abc import Mapping

import networkx as nx
from google.protobuf.message import DecodeError

from . import _proto
from .attrs import parse_input
from .errors import LoadError

__all__ = ["load", "as_graph_def", "partition_sets", "may_have_transfers", "NS"]

log = logging.getLogger(__name__)
log.addHandler(logging.NullHandler())

#: Namespace key under which every graph_pass result is stored on nodes, edges and the graph.
NS = "rdmadev"


@functools.lru_cache(maxsize=None)
def _pair_op_names(send_ops, recv_ops):
    """A regular expression for the fast path: an op name is stored verbatim in NodeDef field 2,
    so the absence of every pair op's name proves the absence of every pair op. Each name is
    searched for ("_HostSend" does not contain "_Send"), in one scan."""
    return re.compile(b"|".join(re.escape(op.encode()) for op in sorted(send_ops | recv_ops)))


def as_graph_def(obj, label="input"):
    """Return ``obj`` as a GraphDef message, parsing bytes with graph_pass's proto subset.

    Args:
        obj: a GraphDef message (returned as is) or its serialized bytes.
        label: names the partition in error messages.

    Returns:
        A GraphDef-like message.

    Raises:
        LoadError: the bytes do not parse, or ``obj`` is neither bytes nor a GraphDef.
    """
    if isinstance(obj, (bytes, bytearray, memoryview)):
        try:
            return _proto.GraphDef.FromString(bytes(obj))
        except DecodeError as exc:
            raise LoadError(f"partition {label}: the bytes are not a serialized GraphDef ({exc}); pass "
                            f"GraphDef.SerializeToString() output, or a RunMetadata via partition_sets()") from exc
    if hasattr(obj, "node"):
        return obj
    raise LoadError(f"partition {label}: expected a GraphDef message or its serialized bytes, got "
                    f"{type(obj).__name__}")


def _named_partitions(partitions):
    """Return [(label, GraphDef-like)] for every accepted input form."""
    if isinstance(partitions, Mapping):
        return [(str(k), as_graph_def(v, k)) for k, v in partitions.items()]
    if isinstance(partitions, (bytes, bytearray, memoryview)) or hasattr(partitions, "node"):
        partitions = [partitions]
    elif hasattr(partitions, "function_graphs"):
        raise LoadError("got a whole RunMetadata: it may hold several instantiations; plan each of "
                        "graph_pass.partition_sets(run_metadata) separately")
    elif hasattr(partitions, "partition_graphs"):  # a RunMetadata.FunctionGraphs message
        partitions = list(partitions.partition_graphs)
    try:
        items = list(partitions)
    except TypeError:
        raise LoadError(f"expected partition graphs (a mapping device -> GraphDef/bytes, a list of them, or a "
                        f"FunctionGraphs message), got {type(partitions).__name__}") from None
    out, seen = [], set()
    for i, item in enumerate(items):
        gd = as_graph_def(item, f"#{i}")
        label = next((n.device for n in gd.node if n.device), "") or f"partition:{i}"
        base, k = label, 1
        while label in seen:  # two partitions on one device (e.g. merged inputs): keep both apart
            label, k = f"{base}#{k}", k + 1
        seen.add(label)
        out.append((label, gd))
    return out


def load(partitions):
    """Build one networkx graph from all partition graphs of one instantiation.

    Args:
        partitions: a mapping ``{device: GraphDef | bytes}``, a sequence of GraphDefs or bytes, a
            single GraphDef or bytes, or a ``RunMetadata.FunctionGraphs`` message.

    Returns:
        A ``networkx.MultiDiGraph``; ``graph.graph["rdmadev"]["partitions"]`` lists partition labels.

    Raises:
        LoadError: bytes that do not parse, an unsupported input type, a duplicate node name in a
            partition, or an input naming a node missing from its partition.

    Example:
        >>> g = load({"/job:ps/replica:0/task:0/device:CPU:0": graph_def_bytes})  # doctest: +SKIP
    """
    named = _named_partitions(partitions)
    g = nx.MultiDiGraph()
    g.graph[NS] = {"partitions": [label for label, _ in named]}
    for label, gd in named:
        nodes = list(gd.node)
        for nd in nodes:
            key = (label, nd.name)
            if key in g:
                raise LoadError(f"partition {label}: node name {nd.name!r} appears twice; each partition "
                                f"GraphDef must have unique node names (pass each instantiation separately)")
            g.add_node(key, op=nd.op, name=nd.name, device=nd.device, partition=label, node_def=nd, **{NS: {}})
        for nd in nodes:
            dst = (label, nd.name)
            data_index = 0
            for text in nd.input:
                inp = parse_input(text)
                src = (label, inp.name)
                if src not in g:
                    raise LoadError(f"partition {label}: node {nd.name!r} has input {text!r}, but no node "
                                    f"{inp.name!r} is in that partition; pass complete partition graphs")
                if inp.control:
                    g.add_edge(src, dst, src_output=-1, dst_input=-1, control=True)
                else:
                    g.add_edge(src, dst, src_output=inp.index, dst_input=data_index, control=False)
                    data_index += 1
    log.debug("loaded %d partitions, %d nodes, %d edges", len(named), g.number_of_nodes(), g.number_of_edges())
    return g


def may_have_transfers(partitions, rules):
    """Cheap check: False only when no partition can hold a `_Send`/`_Recv` (exact for bytes input).

    The native pass sees every eager op as a one-partition function; this lets the planner return
    an empty plan without parsing. For bytes it is a substring search; for messages, an op scan.

    Args:
        partitions: any input ``load`` accepts.
        rules: the ``NativeRules`` (which ops are a pair's halves).

    Returns:
        True when a pair op may be present (then run the full pipeline), False when none is.
    """
    if isinstance(partitions, Mapping):
        items = list(partitions.values())
    elif isinstance(partitions, (bytes, bytearray, memoryview)) or hasattr(partitions, "node"):
        items = [partitions]
    elif hasattr(partitions, "partition_graphs"):
        items = list(partitions.partition_graphs)
    else:
        items = list(partitions)
    pair_op = _pair_op_names(rules.send_ops, rules.recv_ops)
    for item in items:
        if isinstance(item, (bytes, bytearray, memoryview)):
            data = bytes(item)
            if pair_op.search(data):
                return True
        elif hasattr(item, "node"):
            if any(rules.is_pair_op(n.op) for n in item.node):
                return True
        else:
            return True  # let load() report the bad input
    return False


def partition_sets(run_metadata):
    """Return the partition graph sets in a RunMetadata: one list of GraphDefs per instantiation.

    Args:
        run_metadata: a ``RunMetadata`` message (TF's) or its serialized bytes (e.g. a file saved
            with ``export_run_metadata().SerializeToString()``).

    Returns:
        ``[[GraphDef, ...], ...]``: each ``function_graphs[i].partition_graphs`` that is not empty;
        when there are no function graphs (a TF1 session), the top-level ``partition_graphs``. (Eager
        run metadata repeats every function's partitions at top level, so those are skipped.)

    Raises:
        LoadError: the bytes are not a RunMetadata.
    """
    md = run_metadata
    if isinstance(md, (bytes, bytearray, memoryview)):
        try:
            md = _proto.RunMetadata.FromString(bytes(md))
        except DecodeError as exc:
            raise LoadError(f"not a serialized RunMetadata ({exc}); save it with "
                            f"context.context().export_run_metadata().SerializeToString()") from exc
    sets = [list(fg.partition_graphs) for fg in md.function_graphs if len(fg.partition_graphs)]
    if not len(md.function_graphs) and len(md.partition_graphs):
        sets.append(list(md.partition_graphs))
    return sets
