"""zero_copy: which swapped transfers may hand their receive slot to TF without a copy.

A received tensor that aliases its slot returns the slot to the sender only when TF frees
it, and credits return in order: a tensor that outlives its step (returned to the caller,
forwarded into a variable -- AssignVariableOp shares its input buffer -- or a view of it
that is) stalls the channel K transfers later. So a transfer is marked zero-copy only when
every consumer of the received tensor, followed through every op whose result may still be
its buffer (views, reductions, and past a slice the ops that compute in place), is an op
that only reads it: its outputs are fresh allocations and it stores nothing past the step.
The size threshold, ``plan.config.zero_copy_min_bytes`` (see
``graph_pass.plan.DEFAULT_ZERO_COPY_MIN_BYTES`` for why), is applied here to a static
channel, whose bytes are known, and by the receiving op to each tensor of a dynamic or half
pair channel (the bridge passes it along); a dynamic tensor that was staged or came in chunks is copied.

Results go on the Transfer (``zero_copy``) and on the receiving node under ``data["rdmadev"]``.
"""
import logging

from .load import NS

__all__ = ["mark_zero_copy", "READ_ONLY_OPS", "IN_PLACE_OPS", "VIEW_OPS", "SLICE_OPS"]

log = logging.getLogger(__name__)
log.addHandler(logging.NullHandler())

# What each op listed here may do with the received tensor's buffer. The slot's own buffer
# does not own its memory, so TF never writes an op's result into it ("forwarding" needs
# OwnsMemory). A slice of it is a SubBuffer, which TF does count as owning memory: past a
# slice, any op that forwards may return (and a variable may take over) the slot itself.

#: Ops whose results are fresh allocations or that have none: the received tensor is only
#: read. oneDNN's input gradient of a conv reads the filter (TF's CPU build rewrites
#: Conv2DBackpropInput to it before the pass sees the graph; tests/e2e: the conv scenario);
#: embedding lookups and sparse updates read the ids or rows (tests/e2e: the sparse
#: scenario); a lookup sharded over several tables stitches each shard's rows into a fresh
#: tensor, and segment reductions (an embedding bag's combiner) sum rows into one; ConcatV2
#: always allocates its output, even when all inputs but one are empty (tests/e2e: the views
#: scenario).
READ_ONLY_OPS = frozenset({
    "MatMul", "BatchMatMulV2", "_MklMatMul", "_MklNativeMatMul",
    "Conv2D", "Conv2DBackpropInput", "Conv2DBackpropFilter", "_MklConv2D", "_MklNativeConv2D",
    "DepthwiseConv2dNative", "_MklNativeConv2DBackpropInput", "BiasAddGrad",
    "AssignAddVariableOp", "AssignSubVariableOp",
    "ResourceApplyGradientDescent", "ResourceApplyMomentum", "ResourceApplyKerasMomentum",
    "ResourceApplyAdam", "ResourceApplyAdagrad", "ResourceApplyRMSProp",
    "GatherV2", "ResourceGather", "ResourceScatterSub", "DynamicStitch", "ParallelDynamicStitch",
    "UnsortedSegmentSum", "UnsortedSegmentMax", "UnsortedSegmentMin", "UnsortedSegmentProd",
    "SparseSegmentSum", "SparseSegmentMean", "SparseSegmentSqrtN", "SparseSegmentSumWithNumSegments",
    "SparseSegmentMeanWithNumSegments", "SparseSegmentSqrtNWithNumSegments",
    "ConcatV2",
})
#: Ops that may write their result into an input buffer that owns its memory and has no
#: other user (elementwise ops; fused ops with an addend): read-only for the slot's own
#: buffer, a view of it past a slice.
IN_PLACE_OPS = frozenset({
    "Add", "AddV2", "AddN", "Sub", "Mul", "RealDiv", "Maximum", "Minimum", "Neg", "Square",
    "BiasAdd", "Relu", "ReluGrad", "_FusedMatMul", "_MklFusedMatMul", "_MklNativeFusedMatMul",
    "_FusedConv2D", "_MklFusedConv2D", "_MklNativeFusedConv2D",
})
#: Ops whose output 0 may be input 0's buffer itself: views (a same-type Cast returns its
#: input; a transpose that moves only dimensions of size 1, or none, returns it reshaped; a
#: Pack of one tensor returns it reshaped, of several a fresh tensor) and reductions, which
#: return their input when every reduced dimension has size 1. Their other inputs (a shape,
#: axes, a permutation, the rest of a Pack) are only read. TF1 graphs read a received
#: variable value through an Identity. Where TF's oneDNN opts are on (x86 CPUs with
#: AVX512-VNNI or newer), its layout pass renames the transposes to _MklTranspose and
#: _MklConjugateTranspose before the pass sees the graph; their kernels keep TransposeOp's
#: Compute, so they return their input as the transposes do.
VIEW_OPS = frozenset({"Identity", "Reshape", "ExpandDims", "Squeeze", "Cast", "Transpose",
                      "ConjugateTranspose", "_MklTranspose", "_MklConjugateTranspose", "Pack",
                      "Sum", "Mean", "Max", "Min", "Prod"})
#: Ops whose output 0 may be a slice of input 0 (a SubBuffer: counted as owning memory).
SLICE_OPS = frozenset({"Slice", "StridedSlice"})
#: Views followed from one received tensor before giving up.
MAX_VIEWS = 4


def _keeps_nothing(graph, key, sliced=False, views=0):
    """True when every data consumer of `key`'s output keeps nothing of it, following what
    may still be its buffer for up to MAX_VIEWS ops; False without consumers (the tensor is
    a result). `sliced`: that buffer is a slice of the slot (see IN_PLACE_OPS)."""
    consumers = [(dst, e["dst_input"]) for _, dst, e in graph.out_edges(key, data=True) if not e.get("control")]
    if not consumers:
        return False
    for dst, index in consumers:
        op = graph.nodes[dst]["op"]
        if op in IN_PLACE_OPS:
            follow = sliced  # it computes into its input only when that is a slice
        elif op in VIEW_OPS or op in SLICE_OPS:
            follow = index == 0  # its other inputs (a shape, axes, bounds) are only read
        elif op in READ_ONLY_OPS:
            follow = False
        else:
            return False
        if follow and (views >= MAX_VIEWS or not _keeps_nothing(graph, dst, sliced or op in SLICE_OPS, views + 1)):
            return False
    return True


def mark_zero_copy(plan, graph):
    """Sets ``zero_copy`` on each swapped transfer whose receiver consumes it safely.

    Args:
        plan: a Plan from plan_regions.
        graph: the networkx graph the plan was made from (load + find_transfers).
    Returns:
        The same plan.
    """
    recvs = {}
    for key, data in graph.nodes(data=True):
        if data.get("op") in ("_Recv", "_HostRecv"):
            recvs.setdefault(key[1], []).append(key)
    for t in plan.transfers:
        t.zero_copy = False
        if t.decision != "swap" or not t.recv_node or t.capacity_bytes == 0 or t.bundle:
            continue  # a bundle's tensors are copied out of the slot they share
        if t.rank_capacity is None and t.bytes < plan.config.zero_copy_min_bytes:
            continue
        keys = [k for k in recvs.get(t.recv_node, ()) if graph.nodes[k].get("device") in ("", t.recv_device)
                or k[0] == t.recv_device] or recvs.get(t.recv_node, [])
        if len(keys) != 1:
            continue
        t.zero_copy = _keeps_nothing(graph, keys[0])
        graph.nodes[keys[0]].setdefault(NS, {})["zero_copy"] = t.zero_copy
        if t.zero_copy:
            log.debug("zero-copy: %s", t.tensor_name)
    return plan
