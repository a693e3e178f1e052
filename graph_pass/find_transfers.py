"""Pass 2, find_transfers: the cross-task `_Send`/`_Recv` pairs of a loaded graph, with their facts.

A pair is matched by its rendezvous attrs (``tensor_name``, ``send_device``, ``recv_device``,
``send_device_incarnation``); pairs whose two devices are on one task are not cross-task traffic
and are skipped. Which ops are a pair's halves, when a pair crosses tasks, the mark of a half in
a conditional's branch and the shape rules are the native side's (``NativeRules``, given by the
caller: the pass decides them, rules.h). A half whose peer is not loaded (TF1: each task rewrites only its own partitions)
is still a transfer, with ``send_node`` or ``recv_node`` None. This pass records facts only; every
decision is ``plan_regions``'s. Results are also kept on the graph: each pair node gets
``data["rdmadev"] = {"channel_id": ..., "end": "send" | "recv"}``, a matched pair gets an edge
send -> recv with ``transfer=True``, and ``graph.graph["rdmadev"]["transfers"]`` holds the list.
"""

import logging

from .attrs import attr, tensor_shape
from .devices import task_of
from .dtypes import dtype_name, dtype_size
from .errors import PlanError
from .load import NS
from .plan import Transfer, channel_id
from .shapes import data_input, fully_defined, transfer_bound, transfer_shape

__all__ = ["find_transfers", "RENDEZVOUS_ATTRS"]

log = logging.getLogger(__name__)
log.addHandler(logging.NullHandler())

#: The attrs both halves of a pair carry; together they are the rendezvous key.
RENDEZVOUS_ATTRS = ("tensor_name", "send_device", "recv_device", "send_device_incarnation")


def _rendezvous(key, data):
    nd = data["node_def"]
    values = tuple(attr(nd, a) for a in RENDEZVOUS_ATTRS)
    missing = [a for a, v in zip(RENDEZVOUS_ATTRS, values) if v is None]
    if missing:
        raise PlanError(f"{data['op']} node {key[1]!r} on {key[0]} lacks attr(s) {missing}; pass the partition "
                        f"graphs exactly as TF's partitioner produced them")
    for name, device in zip(RENDEZVOUS_ATTRS[1:3], values[1:3]):
        try:
            task_of(device)
        except ValueError as exc:
            raise PlanError(f"{data['op']} node {key[1]!r} on {key[0]}: attr {name} {exc}; pass the partition "
                            f"graphs exactly as TF's partitioner produced them") from None
    return values


def _is_control_send(g, send_key):
    """A control edge's `_Send` sends an empty dummy Const that has only control inputs."""
    src = data_input(g.nodes[send_key]["node_def"])
    if src is None or (send_key[0], src[0]) not in g:
        return False
    src = g.nodes[(send_key[0], src[0])]
    if src["op"] != "Const" or data_input(src["node_def"]) is not None:
        return False
    shape = tensor_shape(attr(src["node_def"], "value"))
    return shape is not None and 0 in shape


def _is_control_recv(g, recv_key):
    """A control edge's `_Recv` feeds only control edges, directly or through an Identity."""
    out = list(g.out_edges(recv_key, data=True))
    if not out:
        return False
    for _, dst, data in out:
        if data["control"]:
            continue
        if g.nodes[dst]["op"] != "Identity":
            return False
        if not all(d["control"] for _, _, d in g.out_edges(dst, data=True)):
            return False
    return True


#: Ops that open and close a while loop's frame in a lowered graph (TF's v1 control flow,
#: which multi-device functions and TF1 graphs run): what lies between runs once per iteration.
ENTER_OPS = frozenset({"Enter", "RefEnter"})
EXIT_OPS = frozenset({"Exit", "RefExit"})


def _between(g, starts, opens, closes, across_pairs):
    """Keys of the nodes reachable from `starts` past more nodes that `opens` than that
    `closes` (predicates on a key; each start counts as one open, nested regions count),
    following pair edges only when `across_pairs`. branch_exits.cc's Between is the same walk
    over the graph before partitioning, which marks the pairs leaving a branch (the rules'
    branch_mark); tests/e2e/test_e2e.py and tests/test_between_graph.py run branches across
    tasks through both."""
    todo = [(key, 1) for key in starts]
    seen = set(todo)
    while todo:
        key, depth = todo.pop()
        for _, nxt, edge in g.out_edges(key, data=True):
            if edge.get("transfer") and not across_pairs:
                continue
            d = depth + opens(nxt) - closes(nxt)
            if d >= 1 and (nxt, d) not in seen:
                seen.add((nxt, d))
                todo.append((nxt, d))
    return {key for key, _ in seen}


def _op_in(g, ops, outside=frozenset()):
    """A predicate on node keys: the node's op is one of `ops` and the node is not in `outside`."""
    return lambda key: g.nodes[key]["op"] in ops and key not in outside


def _in_loops(g):
    """Keys of the nodes inside a while loop's frame, in each partition: reachable from an
    Enter with more Enters than Exits on the way (nested loops count; a node after a loop's
    Exit is outside it). TF's partitioner gives a _Recv in a frame a control input from the
    frame (its "_cloop" nodes) and a _Send in a frame takes its input there, so each half
    tells on its own, TF1 halves included."""
    opens = _op_in(g, ENTER_OPS)
    return _between(g, list(filter(opens, g.nodes)), opens, _op_in(g, EXIT_OPS), across_pairs=False)


#: Ops that open and close a lowered conditional (tf.cond and tf.case become Switch ... Merge):
#: what lies between may be dead, and a dead tensor crosses tasks only through a _Send/_Recv
#: pair (TF runs a _Send with a dead input, and it sends "dead"; a custom op never runs on one).
SWITCH_OPS = frozenset({"Switch", "RefSwitch", "_SwitchN"})
MERGE_OPS = frozenset({"Merge", "RefMerge"})


def _leaves_branch(g, keys, mark):
    """Whether a pair half among `keys` is named after a node that rdmadev's pass (branch_exits.cc,
    MarkBranchExitsPass) put, before TF partitioned the graph, between a value of a conditional
    branch and the task it crosses to, and named with `mark` (``NativeRules.branch_mark``): the
    partitioner names both halves of the pair after that node (``_src``), so each half tells from
    its own partition that it is in a branch (a TF1 task plans only its own half)."""
    return any(mark in (attr(g.nodes[key]["node_def"], "_src") or "")
               for key in keys if key is not None)


def _in_conds(g, in_loops):
    """Keys of the nodes a conditional branch may leave dead: reachable from a Switch outside
    any loop past fewer Merges than Switches (a loop's own Switch and Merge, in_loop's, count
    neither way: a loop inside a branch does not close it), through data and control edges
    alike (TF's deadness follows both) and across pairs (a branch's read on ps is dead on ps
    too, and its value on the worker). Only pairs whose two halves are here can be told this
    way; the pass's branch mark tells every half."""
    opens = _op_in(g, SWITCH_OPS, in_loops)
    return _between(g, list(filter(opens, g.nodes)), opens, _op_in(g, MERGE_OPS, in_loops),
                    across_pairs=True)


def find_transfers(graph, rules):
    """Find every cross-task pair (or half) in a graph from ``load``.

    Args:
        graph: the networkx graph returned by ``graph_pass.load``.
        rules: the ``NativeRules`` (``rdmadev._core.PLANNER_RULES``).

    Returns:
        A list of ``Transfer`` (facts only; ``decision`` is None), sorted by rendezvous key.

    Raises:
        PlanError: a pair node lacks a rendezvous attr, two nodes share one rendezvous key on the
            same end, or the two halves disagree on the dtype.

    Example:
        >>> transfers = find_transfers(load(partitions), rules)  # doctest: +SKIP
    """
    sends, recvs, same_task = {}, {}, 0
    for key, data in graph.nodes(data=True):
        op = data["op"]
        if not rules.is_pair_op(op):
            continue
        rv = _rendezvous(key, data)
        client = bool(attr(data["node_def"], "client_terminated", False))
        if not rules.crosses_tasks(rv[1], rv[2]):
            same_task += 1
            continue
        table = sends if op in rules.send_ops else recvs
        if rv in table:
            raise PlanError(f"{op} nodes {table[rv][1]!r} and {key[1]!r} share the rendezvous key {rv}; a key "
                            f"must name one pair: plan each instantiation's partitions separately")
        table[rv] = key
        data[NS]["client_terminated"] = client
    transfers = []
    in_loops = _in_loops(graph) if sends or recvs else set()
    keys = sorted(set(sends) | set(recvs), key=lambda r: (r[0], r[1], r[2], r[3]))
    for rv in keys:
        s_key, r_key = sends.get(rv), recvs.get(rv)
        transfers.append(_transfer(graph, rv, s_key, r_key, rules))
        transfers[-1].in_loop = bool({s_key, r_key} & in_loops)
    in_conds = _in_conds(graph, in_loops) if transfers else set()  # follows the pairs' edges
    for rv, t in zip(keys, transfers):
        both = rv in sends and rv in recvs
        t.in_cond = _leaves_branch(graph, (sends.get(rv), recvs.get(rv)), rules.branch_mark) or (
            both and bool({sends[rv], recvs[rv]} & in_conds))
    graph.graph.setdefault(NS, {})
    graph.graph[NS]["transfers"] = transfers
    graph.graph[NS]["same_task_pairs"] = same_task
    log.debug("found %d cross-task transfers (%d same-task pair nodes skipped)", len(transfers), same_task)
    return transfers


def _bytes(dims, size):
    """Bytes of a tensor of fully known `dims` whose elements have `size` bytes (None if either is)."""
    if dims is None or size is None:
        return None
    for d in dims:
        size *= d
    return size


def _host(device, rules):
    """The CPU a half on `device` crosses through (``NativeRules.kernel_device``), or None when
    rdmadev's node runs on `device` itself."""
    kernel = rules.kernel_device(device)
    return None if kernel == device else kernel


def _transfer(g, rv, s_key, r_key, rules):
    tensor_name, send_device, recv_device, incarnation = rv
    cid = channel_id(tensor_name, send_device, recv_device, incarnation)
    s_nd = g.nodes[s_key]["node_def"] if s_key else None
    r_nd = g.nodes[r_key]["node_def"] if r_key else None
    s_type = attr(s_nd, "T") if s_nd is not None else None
    r_type = attr(r_nd, "tensor_type") if r_nd is not None else None
    if s_type is not None and r_type is not None and s_type != r_type:
        raise PlanError(f"pair {tensor_name!r}: _Send {s_key[1]!r} has T={dtype_name(s_type)} but _Recv "
                        f"{r_key[1]!r} has tensor_type={dtype_name(r_type)}; the partition graphs are "
                        f"inconsistent (mixed instantiations?)")
    dtype = s_type if s_type is not None else r_type
    client = any(bool(attr(nd, "client_terminated", False)) for nd in (s_nd, r_nd) if nd is not None)
    if s_key is not None:
        control = _is_control_send(g, s_key)
    else:
        control = _is_control_recv(g, r_key)
    shape, source = transfer_shape(g, s_key, r_key, rules.trusted_output)
    size = dtype_size(dtype) if dtype is not None else None
    nbytes = _bytes(shape, size) if fully_defined(shape) else None
    bound = None if nbytes is not None else transfer_bound(g, s_key, r_key, rules.bound_attr)
    either = s_nd if s_nd is not None else r_nd
    t = Transfer(channel_id=cid, tensor_name=tensor_name, send_device=send_device, recv_device=recv_device,
                 send_device_incarnation=int(incarnation), client_terminated=client,
                 send_node=s_key[1] if s_key else None, recv_node=r_key[1] if r_key else None,
                 send_op=s_nd.op if s_nd is not None else None, recv_op=r_nd.op if r_nd is not None else None,
                 src=attr(either, "_src"), dst=attr(either, "_dst"), kind="control" if control else "data",
                 dtype=dtype_name(dtype) if dtype is not None else "DT_INVALID",
                 shape=list(shape) if shape is not None else None, shape_source=source, bytes=nbytes,
                 bound=list(bound) if bound is not None else None, bound_bytes=_bytes(bound, size),
                 send_host=_host(send_device, rules) if s_key else None,
                 recv_host=_host(recv_device, rules) if r_key else None)
    for end, key in (("send", s_key), ("recv", r_key)):
        if key is not None:
            g.nodes[key][NS].update(channel_id=cid, end=end)
    if s_key is not None and r_key is not None:
        g.add_edge(s_key, r_key, key=NS, src_output=-2, dst_input=-2, control=False, transfer=True,
                   **{NS: {"channel_id": cid}})
    return t
