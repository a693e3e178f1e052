"""TF's own shape inference over partition graphs, for offline planning (``rdmadev plan``).

Partition graphs from run metadata carry almost no shapes (``_output_shapes`` on ``_Arg`` nodes,
``_handle_shapes`` on resource arguments). rdmadev's pass fills them in before it calls the
planner (``_native/tf/pass/shapes.h``: TF's ShapeRefiner across the partitions, each pair's shape
and, for a run-time shape, its bound); this module runs that same code on graphs planned
offline, through the op library's ``rdmadev_annotate_partitions``, so an offline plan is the one
the pass would make. It imports TensorFlow and rdmadev's op library; ``rdmadev plan``
(rdmadev.tools.plan) uses it, the planner (graph_pass) never does.
"""

import ctypes
import functools
import logging
import struct

from graph_pass.attrs import attr
from graph_pass.errors import GraphPassError

from .._core import PLANNER_RULES

__all__ = ["annotate", "library"]

log = logging.getLogger(__name__)
log.addHandler(logging.NullHandler())


@functools.lru_cache(maxsize=None)
def library():
    """rdmadev's op library, loaded into this process (its ops registered with TF), for ctypes.

    Raises:
        ConfigError: the library is missing or was built against another TensorFlow.
    """
    from ..tf import ops  # the op library registers its ops (RdmadevSend/Recv) with TF

    ops.load()
    lib = ctypes.CDLL(ops.library_path())
    lib.rdmadev_annotate_partitions.argtypes = [ctypes.c_char_p, ctypes.c_uint64, ctypes.POINTER(ctypes.c_void_p)]
    lib.rdmadev_annotate_partitions.restype = ctypes.c_int
    lib.rdmadev_free.argtypes = [ctypes.c_void_p]
    return lib


def _pair_key(nd):
    return "|".join(str(attr(nd, a, "")) for a in ("tensor_name", "send_device", "recv_device"))


def _native_shapes(gds):
    """``{pair key: {attr: dims}}`` the op library gives the partitions ``gds``."""
    framed = b"".join(struct.pack("<Q", len(b)) + b for b in (gd.SerializeToString() for gd in gds))
    lib, out = library(), ctypes.c_void_p()
    rc = lib.rdmadev_annotate_partitions(framed, len(framed), ctypes.byref(out))
    try:
        text = ctypes.string_at(out).decode() if out.value else ""
    finally:
        lib.rdmadev_free(out)
    if rc != 0:
        raise GraphPassError(f"rdmadev's shape annotation refused the partitions: {text}")
    shapes = {}
    for line in text.splitlines():
        key, name, dims = line.split("\t")
        shapes.setdefault(key, {})[name] = [int(d) for d in dims.split(",")] if dims else []
    return shapes


def annotate(partitions):
    """Return copies of ``partitions`` whose `_Send` and `_Recv` nodes carry what rdmadev's pass
    would write on them: ``_output_shapes`` where TF's shape functions prove the pair's shape,
    the pass's bound attr (``PLANNER_RULES.bound_attr``) where they bound a run-time one.

    Args:
        partitions: the GraphDefs of one instantiation (TF's messages, graph_pass's, or bytes).

    Returns:
        A list of TF GraphDef messages (the inputs are not modified). A partition TF cannot
        build here (an op not registered in this process) adds nothing, but its halves get what
        the other partitions say.

    Raises:
        GraphPassError: a partition is not a GraphDef.

    Example:
        >>> plan = plan_partitions(annotate(partition_sets(run_metadata)[0]), rules=PLANNER_RULES)  # doctest: +SKIP
    """
    from tensorflow.core.framework import graph_pb2

    gds = []
    for p in partitions:
        data = bytes(p) if isinstance(p, (bytes, bytearray, memoryview)) else p.SerializeToString()
        gds.append(graph_pb2.GraphDef.FromString(data))
    shapes = _native_shapes(gds)
    for gd in gds:
        for nd in gd.node:
            if not PLANNER_RULES.is_pair_op(nd.op):
                continue
            for name, dims in shapes.get(_pair_key(nd), {}).items():
                nd.attr[name].list.Clear()
                proto = nd.attr[name].list.shape.add()
                for d in dims:
                    proto.dim.add(size=d)
    log.debug("TF shape inference: %d transfer shapes or bounds known", len(shapes))
    return gds
