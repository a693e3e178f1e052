"""zero_copy: which swapped transfers may hand their receive slot to TF without a copy.

A received tensor that aliases its slot returns the slot to the sender only when TF frees
it, and credits return in order: a tensor that outlives its step (returned to the caller,
forwarded into a variable -- AssignVariableOp shares its input buffer -- or kept by any
op whose output may alias its input) stalls the channel K transfers later. So a transfer
is marked zero-copy only when it carries at least ``plan.config.zero_copy_min_bytes`` (see
``graph_pass.plan.DEFAULT_ZERO_COPY_MIN_BYTES`` for why) and every consumer of the received tensor is an op that reads it
and keeps nothing: its outputs are fresh allocations (TF does not forward a buffer it does
not own, and slot buffers do not own their memory) and it stores nothing past the step.

Results go on the Transfer (``zero_copy``) and on the receiving node under ``data["rdmadev"]``.
"""
import logging

from .load import NS

__all__ = ["mark_zero_copy", "NON_RETAINING_OPS"]

log = logging.getLogger(__name__)
log.addHandler(logging.NullHandler())

# Ops that read a tensor input and neither return it, nor alias it, nor store it.
# Deliberately absent: Identity, Reshape, Slice/StridedSlice, Cast, ExpandDims, Squeeze,
# _Retval, AssignVariableOp, Enter/Switch/Merge, TensorList*/TensorArray* (alias or retain).
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
})


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
        if t.decision != "swap" or t.rank_capacity is not None or not t.recv_node \
                or (t.bytes or 0) < plan.config.zero_copy_min_bytes:
            continue
        keys = [k for k in recvs.get(t.recv_node, ()) if graph.nodes[k].get("device") in ("", t.recv_device)
                or k[0] == t.recv_device] or recvs.get(t.recv_node, [])
        if len(keys) != 1:
            continue
        consumers = [graph.nodes[dst]["op"] for _, dst, e in graph.out_edges(keys[0], data=True)
                     if not e.get("control")]
        t.zero_copy = bool(consumers) and all(op in NON_RETAINING_OPS for op in consumers)
        graph.nodes[keys[0]].setdefault(NS, {})["zero_copy"] = t.zero_copy
        if t.zero_copy:
            log.debug("zero-copy: %s (consumers %s)", t.tensor_name, consumers)
    return plan
