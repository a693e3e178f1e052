"""Static shapes of transferred tensors, from the graph's own shape information plus a few rules.

Partition graphs carry little shape information: ``_Arg`` nodes have ``_output_shapes``, resource
arguments ``_handle_shapes``, Consts their value's shape, fused oneDNN ops ``_input_shapes``. The
authoritative source is an ``_output_shapes`` attr (on the `_Recv`, or on the node feeding the
`_Send`); the native pass may attach it after running TF's shape refiner. Otherwise a small set of
forward rules (variable reads, elementwise ops, matmul, reshape, reductions, conv/BN gradients)
runs from the producer, following a `_Recv` to its peer `_Send` when both halves are loaded, and
two backward rules look at the consumers of a `_Recv` (``_input_shapes``; the value input of
``Assign*VariableOp`` has the variable's shape). What no rule proves stays unknown (-1 / None).
"""

import logging

from .attrs import attr, parse_input, tensor_ints, tensor_shape

__all__ = ["ShapeInference", "fully_defined", "merge", "broadcast"]

log = logging.getLogger(__name__)
log.addHandler(logging.NullHandler())

#: Deepest producer chain followed for one shape. Transferred tensors are variable reads (2 hops),
#: arguments (1) or gradients (a few dozen hops through elementwise ops); 200 keeps recursion well
#: inside Python's default limit of 1000 frames, and results are memoized, so cost stays linear.
MAX_DEPTH = 200
#: Op-name prefixes of oneDNN rewrites; they take the original op's inputs first (then extras).
_OP_PREFIXES = ("_MklNative", "_Mkl", "_")
#: Output 0 has the shape of input 0.
UNARY_SAME = frozenset({
    "Identity", "Snapshot", "StopGradient", "PreventGradient", "Cast", "Relu", "Relu6", "Elu", "Selu",
    "LeakyRelu", "Sigmoid", "Tanh", "Softplus", "Softsign", "Neg", "Abs", "Square", "Sqrt", "Rsqrt",
    "Exp", "Log", "Log1p", "Reciprocal", "Floor", "Ceil", "Round", "Sign", "OnesLike", "ZerosLike",
    "Softmax", "LogSoftmax", "ReluGrad", "Relu6Grad", "EluGrad", "SeluGrad", "LeakyReluGrad",
    "SigmoidGrad", "TanhGrad", "SqrtGrad", "RsqrtGrad", "BiasAdd", "CheckNumerics", "Erf", "AddN",
    "ClipByValue", "FusedBatchNorm", "FusedBatchNormV2", "FusedBatchNormV3", "FusedBatchNormGrad",
    "FusedBatchNormGradV2", "FusedBatchNormGradV3",
})
#: Output 0 is the broadcast of inputs 0 and 1.
BINARY_BROADCAST = frozenset({
    "Add", "AddV2", "Sub", "Mul", "RealDiv", "Div", "DivNoNan", "Maximum", "Minimum", "Pow",
    "SquaredDifference", "FloorDiv", "FloorMod", "MulNoNan", "Xdivy", "Xlogy", "BiasAddV1",
})
#: Matrix products (``transpose_a``/``transpose_b``; oneDNN fused variants share the first inputs).
MATMUL = frozenset({"MatMul", "FusedMatMul"})
#: Batched products (``adj_x``/``adj_y``).
BATCH_MATMUL = frozenset({"BatchMatMul", "BatchMatMulV2", "BatchMatMulV3"})
#: Reductions with a Const axis input 1 and ``keep_dims``.
REDUCTIONS = frozenset({"Sum", "Mean", "Max", "Min", "Prod", "All", "Any"})
#: Ops whose output 0 shape is the value of a Const input (op -> input index).
SHAPE_FROM_CONST_INPUT = {"Conv2DBackpropFilter": 1, "Conv2DBackpropInput": 0, "Fill": 0,
                          "Conv3DBackpropFilterV2": 1, "Conv3DBackpropInputV2": 0, "Zeros": 0}
#: Consumers whose input (op -> index) takes the shape of the variable at input 0.
ASSIGN_VALUE_INPUT = {"AssignVariableOp": 1, "AssignAddVariableOp": 1, "AssignSubVariableOp": 1,
                      "ResourceApplyGradientDescent": 2}
#: FusedBatchNormGrad*: outputs 1 and 2 (scale and offset gradients) have the shape of input 2 (scale).
FBN_GRAD_OUTPUTS = {1: 2, 2: 2}
#: FusedBatchNorm* (forward): outputs 1-4 (batch mean/variance, reserve spaces 1-2) have the shape of
#: input 1 (scale), i.e. [channels].
FBN_OUTPUTS = {1: 1, 2: 1, 3: 1, 4: 1}


def fully_defined(shape):
    """True when ``shape`` is a known rank with every dim known."""
    return shape is not None and all(d >= 0 for d in shape)


def merge(a, b):
    """Combine two descriptions of one shape, keeping every known dim (``a`` wins on conflict)."""
    if a is None:
        return b
    if b is None or len(a) != len(b):
        return a
    return tuple(x if x >= 0 else y for x, y in zip(a, b))


def broadcast(a, b):
    """NumPy broadcast of two shapes; None when a rank is unknown or the dims conflict."""
    if a is None or b is None:
        return None
    n = max(len(a), len(b))
    a, b = (1,) * (n - len(a)) + tuple(a), (1,) * (n - len(b)) + tuple(b)
    out = []
    for x, y in zip(a, b):
        if x == 1 or x == y:
            out.append(y)
        elif y == 1:
            out.append(x)
        elif x < 0 or y < 0:
            out.append(max(x, y) if min(x, y) < 0 and max(x, y) > 1 else -1)
        else:
            return None
    return tuple(out)


def _base_op(op):
    for prefix in _OP_PREFIXES:
        if op.startswith(prefix):
            return op[len(prefix):]
    return op


class ShapeInference:
    """Memoized shape lookups over a loaded graph.

    Args:
        graph: the networkx graph from ``load``.
        peer_send: ``{recv node key: send node key}`` for pairs whose both halves are loaded.
    """

    def __init__(self, graph, peer_send):
        self.g = graph
        self.peer_send = peer_send
        self._memo = {}
        self._inputs = {}

    def data_inputs(self, key):
        """Return the data inputs of node ``key`` as ``[(source key, output index), ...]``."""
        if key not in self._inputs:
            part = key[0]
            ins = [parse_input(s) for s in self.g.nodes[key]["node_def"].input]
            self._inputs[key] = [((part, i.name), i.index) for i in ins if not i.control]
        return self._inputs[key]

    def output_shape(self, key, index=0, depth=0):
        """Return ``(shape, source)`` of output ``index`` of node ``key`` (shape None if unknown)."""
        memo_key = (key, index)
        if memo_key in self._memo:
            return self._memo[memo_key]
        if depth > MAX_DEPTH:
            return None, "unknown (too deep)"
        self._memo[memo_key] = (None, "unknown")  # cycle guard; graphs are DAGs, but be safe
        result = self._compute(key, index, depth)
        self._memo[memo_key] = result
        return result

    def _compute(self, key, index, depth):
        nd = self.g.nodes[key]["node_def"]
        declared = attr(nd, "_output_shapes")
        declared = declared[index] if declared and index < len(declared) else None
        if fully_defined(declared):
            return declared, f"_output_shapes of {nd.name}"
        shape, source = self._rule(key, nd, index, depth)
        shape = merge(declared, shape)
        if declared is not None and source == "unknown":
            source = f"_output_shapes of {nd.name}"
        return shape, source

    def _in(self, key, i, depth):
        ins = self.data_inputs(key)
        return self.output_shape(*ins[i], depth + 1)[0] if i < len(ins) else None

    def _const_ints(self, key, i):
        ins = self.data_inputs(key)
        if i >= len(ins):
            return None
        nd = self.g.nodes[ins[i][0]]["node_def"]
        value = attr(nd, "value") if nd.op == "Const" else None
        return tensor_ints(value) if value is not None else None

    def handle_shape(self, key, depth=0):
        """Return the variable shape behind resource-producing node ``key`` (None if unknown)."""
        for _ in range(MAX_DEPTH - depth):
            nd = self.g.nodes[key]["node_def"]
            if nd.op == "_Arg" or nd.op == "Placeholder":
                shapes = attr(nd, "_handle_shapes")
                return shapes[0] if shapes else None
            if nd.op == "VarHandleOp":
                return attr(nd, "shape")
            if nd.op != "Identity" or not self.data_inputs(key):
                return None
            key = self.data_inputs(key)[0][0]
        return None

    def _rule(self, key, nd, index, depth):
        op = nd.op
        base = _base_op(op)
        if op == "Const" and index == 0:
            return tensor_shape(attr(nd, "value")), f"value of Const {nd.name}"
        if op in ("Placeholder", "PlaceholderWithDefault") and index == 0:
            return attr(nd, "shape"), f"shape attr of {nd.name}"
        if op == "ReadVariableOp" and index == 0:
            ins = self.data_inputs(key)
            shape = self.handle_shape(ins[0][0], depth) if ins else None
            return shape, f"variable shape read by {nd.name}"
        if op in ("_Recv", "_HostRecv") and key in self.peer_send:
            ins = self.data_inputs(self.peer_send[key])
            if ins:
                shape, source = self.output_shape(*ins[0], depth + 1)
                return shape, source
            return None, "unknown"
        if base in UNARY_SAME:
            if index == 0:
                return self._in(key, 0, depth), f"inferred ({op})"
            if base.startswith("FusedBatchNormGrad") and index in FBN_GRAD_OUTPUTS:
                return self._in(key, FBN_GRAD_OUTPUTS[index], depth), f"inferred ({op})"
            if base.startswith("FusedBatchNorm") and index in FBN_OUTPUTS:
                return self._in(key, FBN_OUTPUTS[index], depth), f"inferred ({op})"
            return None, "unknown"
        if index != 0:
            return None, "unknown"
        if base in BINARY_BROADCAST:
            return broadcast(self._in(key, 0, depth), self._in(key, 1, depth)), f"inferred ({op})"
        if base in MATMUL or base in BATCH_MATMUL:
            return self._matmul(key, nd, base, depth), f"inferred ({op})"
        if base == "Reshape":
            return self._reshape(key, depth), f"inferred ({op})"
        if base in REDUCTIONS:
            return self._reduce(key, nd, depth), f"inferred ({op})"
        if base in SHAPE_FROM_CONST_INPUT:
            ints = self._const_ints(key, SHAPE_FROM_CONST_INPUT[base])
            return (tuple(ints) if ints is not None else None), f"inferred ({op})"
        if base == "BiasAddGrad":
            x = self._in(key, 0, depth)
            if x is None or not x:
                return None, "unknown"
            return (x[1] if attr(nd, "data_format", "NHWC") == "NCHW" else x[-1],), f"inferred ({op})"
        if base == "Transpose":
            x, perm = self._in(key, 0, depth), self._const_ints(key, 1)
            if x is None or perm is None or len(perm) != len(x):
                return None, "unknown"
            return tuple(x[p] for p in perm), f"inferred ({op})"
        return None, "unknown"

    def _matmul(self, key, nd, base, depth):
        a, b = self._in(key, 0, depth), self._in(key, 1, depth)
        if a is None or b is None or len(a) < 2 or len(b) < 2:
            return None
        if base in MATMUL:
            if len(a) != 2 or len(b) != 2:
                return None
            ta, tb = attr(nd, "transpose_a", False), attr(nd, "transpose_b", False)
            return (a[1] if ta else a[0], b[0] if tb else b[1])
        ta, tb = attr(nd, "adj_x", False), attr(nd, "adj_y", False)
        batch = broadcast(a[:-2], b[:-2])
        if batch is None:
            return None
        return batch + (a[-1] if ta else a[-2], b[-2] if tb else b[-1])

    def _reshape(self, key, depth):
        target = self._const_ints(key, 1)
        if target is None:
            return None
        if target.count(-1) == 1:
            x = self._in(key, 0, depth)
            known = 1
            for d in target:
                known *= d if d != -1 else 1
            if fully_defined(x) and known > 0:
                total = 1
                for d in x:
                    total *= d
                target = [total // known if d == -1 else d for d in target]
        return tuple(target)

    def _reduce(self, key, nd, depth):
        x, axes = self._in(key, 0, depth), self._const_ints(key, 1)
        if x is None or axes is None:
            return None
        axes = {a % len(x) for a in axes} if x else set()
        if attr(nd, "keep_dims", False):
            return tuple(1 if i in axes else d for i, d in enumerate(x))
        return tuple(d for i, d in enumerate(x) if i not in axes)

    def consumer_shape(self, recv_key):
        """Return ``(shape, source)`` for a `_Recv`'s output as its consumers see it."""
        found, source = None, "unknown"
        for _, dst, data in self.g.out_edges(recv_key, data=True):
            if data["control"] or data["src_output"] != 0:
                continue
            nd = self.g.nodes[dst]["node_def"]
            j = data["dst_input"]
            shapes = attr(nd, "_input_shapes")
            if shapes and j < len(shapes) and shapes[j] is not None:
                found, source = merge(found, shapes[j]), f"_input_shapes of {nd.name}"
            elif ASSIGN_VALUE_INPUT.get(nd.op) == j:
                ins = self.data_inputs(dst)
                var = self.handle_shape(ins[0][0]) if ins else None
                if var is not None:
                    found, source = merge(found, var), f"variable assigned by {nd.name}"
            if fully_defined(found):
                break
        return found, source

    def transfer_shape(self, send_key, recv_key):
        """Return ``(shape, source)`` of the tensor a pair carries, from either or both halves.

        Args:
            send_key: the `_Send` node key, or None when only the receiving half is loaded.
            recv_key: the `_Recv` node key, or None when only the sending half is loaded.
        """
        shape, source = None, "unknown"
        if recv_key is not None:
            declared = attr(self.g.nodes[recv_key]["node_def"], "_output_shapes")
            if declared and fully_defined(declared[0]):
                return declared[0], f"_output_shapes of {recv_key[1]}"
        if send_key is not None:
            ins = self.data_inputs(send_key)
            if ins:
                shape, source = self.output_shape(*ins[0])
        if not fully_defined(shape) and recv_key is not None:
            back, back_source = self.consumer_shape(recv_key)
            if back is not None:
                merged = merge(shape, back)
                if merged != shape:
                    shape, source = merged, back_source
        return shape, source
