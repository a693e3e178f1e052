"""zero_copy: which swapped transfers may hand their receive slot to TF without a copy.

A received tensor that aliases its slot returns the slot to the sender only when TF frees
it, and credits return in order: a tensor that outlives its step (returned to the caller,
forwarded into a variable -- AssignVariableOp shares its input buffer -- or a view of it
that is) stalls the channel K transfers later. So a transfer
is marked zero-copy only when every consumer of the received tensor (seen through the ops
whose output may be a view of it, ``FORWARDING_OPS``) is an op that reads it and keeps
nothing: its outputs are fresh allocations (TF does not forward a buffer it does not own, and
slot buffers do not own their memory) and it stores nothing past the step.
The size threshold, ``plan.config.zero_copy_min_bytes`` (see
``graph_pass.plan.DEFAULT_ZERO_COPY_MIN_BYTES`` for why), is applied here to a static
channel, whose bytes are known, and by the receiving op to each tensor of a dynamic or half
pair channel (the bridge passes it along); a dynamic tensor that was staged or came in chunks is copied.

Results go on the Transfer (``zero_copy``) and on the receiving node under ``data["rdmadev"]``.
"""
import logging

from .load import NS

__all__ = ["mark_zero_copy", "NON_RETAINING_OPS", "FORWARDING_OPS"]

log = logging.getLogger(__name__)
log.addHandler(logging.NullHandler())

# Ops that read a tensor input and neither return it, nor alias it, nor store it.
# Deliberately absent: _Retval, AssignVariableOp, Enter/Switch/Merge,
# TensorList*/TensorArray* (alias or retain); the views below are FORWARDING_OPS.
NON_RETAINING_OPS = frozenset({
    "MatMul", "BatchMatMulV2", "_MklMatMul", "_MklNativeMatMul", "_MklFusedMatMul",
    "_MklNativeFusedMatMul", "_FusedMatMul",
    "Conv2D", "Conv2DBackpropInput", "Conv2DBackpropFilter", "_MklConv2D", "_MklNativeConv2D",
    "_FusedConv2D", "_MklFusedConv2D", "_MklNativeFusedConv2D", "DepthwiseConv2dNative",
    "Add", "AddV2", "AddN", "Sub", "Mul", "RealDiv", "Maximum", "Minimum", "Neg", "Square",
    "BiasAdd", "BiasAddGrad", "Relu", "ReluGrad", "Sum", "Mean", "Max", "Min", "Prod",
    "AssignAddVariableOp", "AssignSubVariableOp",
    "ResourceApplyGradientDescent", "ResourceApplyMomentum", "ResourceApplyKerasMomentum",
    "ResourceApplyAdam", "ResourceApplyAdagrad", "ResourceApplyRMSProp",
    # oneDNN's input gradient of a conv, which reads the filter (TF's CPU build rewrites
    # Conv2DBackpropInput to it before the pass sees the graph; tests/e2e: the conv scenario
    # with RDMADEV_ZERO_COPY_MIN_BYTES=1).
    "_MklNativeConv2DBackpropInput",
    # Embedding lookups and their sparse updates: each allocates its output (gathered rows)
    # or writes into a variable, reading the received ids or rows only (tests/e2e: the sparse
    # scenario with RDMADEV_ZERO_COPY_MIN_BYTES=1).
    "GatherV2", "ResourceGather", "ResourceScatterSub",
    # A lookup sharded over several tables stitches each shard's gathered rows into a fresh
    # tensor (memcpy per row; tests/e2e: the views scenario).
    "DynamicStitch", "ParallelDynamicStitch",
})

# Ops whose output 0 may be input 0's buffer or a view into it (a slice along the first
# dimension shares its input's buffer; a same-type Cast returns its input): safe exactly when
# what consumes that output is. Their other inputs (a shape, slice bounds) are only read. TF1
# graphs read a received variable value through an Identity; each view is run in TF by
# tests/e2e's views scenario.
FORWARDING_OPS = frozenset({"Identity", "Reshape", "ExpandDims", "Squeeze", "Slice", "StridedSlice", "Cast"})
#: Forwarding ops followed from one received tensor before giving up (a chain of Identities).
MAX_FORWARDS = 4


def _keeps_nothing(graph, key, forwards=0):
    """True when every data consumer of `key`'s output keeps nothing of it, looking through
    up to MAX_FORWARDS views of it; False without consumers (the tensor is a result)."""
    consumers = [(dst, e["dst_input"]) for _, dst, e in graph.out_edges(key, data=True) if not e.get("control")]
    if not consumers:
        return False
    for dst, index in consumers:
        op = graph.nodes[dst]["op"]
        if op in FORWARDING_OPS:
            if index == 0 and not (forwards < MAX_FORWARDS and _keeps_nothing(graph, dst, forwards + 1)):
                return False
        elif op not in NON_RETAINING_OPS:
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
        if t.decision != "swap" or not t.recv_node or t.capacity_bytes == 0:
            continue
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
