"""The TF bridge's side of the Plan contract: what it tells the planner, what it refuses."""
import re

import pytest

import rdmadev
from graph_pass.pass_view import PassView
import graph_pass as gp
from rdmadev.tf import bridge
from rdmadev._core import PLANNER_RULES as RULES


def test_planner_is_told_what_the_ops_carry_and_the_deadline():
    cfg = rdmadev.Config(slots=3, deadline_s=42.0, dynamic_capacity=4096)
    planned = bridge.plan_config(cfg)
    assert planned.slots == 3 and planned.deadline_s == 42.0
    assert bridge.OPS_CARRY == {"dynamic_shapes": True, "half_pairs": True, "dead_tensors": True, "loops": True}
    # Half pairs only where the task's runtime can meet their peers (a TF1 GraphMgr's pass).
    assert planned.carries == {"dynamic_shapes": True, "half_pairs": False, "dead_tensors": True, "loops": True}
    assert planned.half_pair_capacity is None
    assert planned.default_dynamic_capacity == 4096  # RDMADEV_DYNAMIC_CAPACITY
    halves = bridge.plan_config(cfg, halves=True)
    assert halves.carries == bridge.OPS_CARRY and halves.half_pair_capacity == 4096


def test_a_plan_with_the_native_wire_layout_is_accepted():
    plan = _bundled_plan()  # laid out with the bindings' layout (channel.h)
    assert plan.layout == rdmadev._core.wire_layout()
    assert gp.validate(plan, rules=RULES) is plan


@pytest.mark.parametrize("field, value", [
    ("seq_offset", 8), ("length_offset", 16), ("slot_header_bytes", 128), ("alignment", 128),
    ("length_bytes", 4), ("shape_block_offset", 128), ("shape_dims_offset", 16),
])
def test_a_plan_whose_slot_layout_differs_from_the_native_one_is_refused(field, value):
    plan = _bundled_plan()
    plan.layout[field] = value  # e.g. a plan saved by another graph_pass
    with pytest.raises(gp.ValidationError, match=f"plan layout differs from the native one in \\['{field}'\\]: "
                                                 f"{field}={value} \\(native "):
        gp.validate(plan, rules=RULES)


def test_a_function_keeps_its_lineage_scope_across_retraces_tokens_and_coordinators():
    """What a channel learned is kept per function (opening.lineage): TF's instantiation
    counter and an optimized function's opt-in token (new per tf.function object and per
    coordinator) are not part of its name; the name it was given is."""
    marker = bridge.opt_in_marker()
    assert bridge.lineage_scope(f"__inference_step{marker}6c891183_22") == "__inference_step"
    assert bridge.lineage_scope(f"__inference_step{marker}1e12de9d_67") == "__inference_step"
    assert bridge.lineage_scope("__inference_one_step_on_data_1234") == "__inference_one_step_on_data"
    assert bridge.lineage_scope("__inference_step_2") != bridge.lineage_scope("__inference_other_2")
    assert bridge.lineage_scope("") == ""  # a TF1 GraphMgr's pass: no function


def _bundled_plan(big=False):
    """A plan of 6 small reads bundled with 6 control edges (ps -> worker) and, with `big`, a
    large read and a gradient of a shape known only at run time, each on a channel of its own."""
    import os
    import sys
    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "planner"))
    import gp_builders as B
    import graph_pass as gp

    ps, w = B.Partition(B.dev("ps")), B.Partition(B.dev("worker", 0))
    for i in range(6):
        ps.var(f"v{i}", (128,))
        B.pair(ps, w, f"edge_{i}_v{i}", f"v{i}/read", recv_name=f"v{i}/_recv", shape=(128,))
        ps.node(f"ready{i}", "NoOp")
        B.control_pair(ps, w, f"edge_{10 + i}_ready", f"ready{i}", f"after{i}")
    if big:
        ps.var("big", (1 << 16,))
        B.pair(ps, w, "edge_20_big", "big/read", recv_name="big/_recv", shape=(1 << 16,))
        w.node("use", "MatMul", ["big/_recv", "big/_recv"], T=("type", B.FLOAT))
        w.node("y", "_Arg", T=("type", B.FLOAT), index=0)
        B.pair(w, ps, "edge_21_grad", "y", recv_name="grad/_recv", shape=(-1, 4))
    config = gp.Config(default_dynamic_capacity=1 << 20, carries=dict(bridge.OPS_CARRY))
    return gp.plan_partitions(B.partitions(ps, w), config, instance_id="o", rules=RULES)


def test_a_bundles_rewrites_list_its_tensors_in_the_order_of_their_bytes():
    """A control edge's empty tensor may start where the next tensor does: the native kernels
    need each tensor at or after the end of the one before, so the view orders a bundle's
    members by offset, then size (a resnet50 step had one at 2560 next to 512 B there)."""
    import dataclasses

    plan = _bundled_plan()
    members = plan.swapped()
    assert {t.bundle for t in members} == {members[0].bundle}
    offsets = [t.bundle_offset for t in members]
    assert len(set(offsets)) < len(offsets)  # empty tensors share an offset with the next
    views = [PassView.of(dataclasses.replace(plan, transfers=order))  # ties in either order
             for order in (plan.transfers, plan.transfers[::-1])]
    for view in views:
        assert not view.halves and [b.side for b in view.bundles] == ["send", "recv"]
        for b in view.bundles:
            assert b.channel == members[0].channel_key and len(b.members) == len(members)
            by_node = {getattr(t, f"{b.side}_node"): t for t in plan.swapped()}
            end = 0
            for m in b.members:
                assert m.offset >= end, b.members
                end = m.offset + by_node[m.facts.node].bytes


def _read_natively(view):
    """What the pass reads of `view` (planner_call.cc ReadPassView): ({field path: value},
    None), or (None, the error)."""
    import ctypes

    from rdmadev.tf import ops

    ops.load()
    lib = ctypes.PyDLL(ops.library_path())  # PyDLL: the call keeps the GIL, as the pass does
    lib.rdmadev_read_pass_view.argtypes = [ctypes.py_object, ctypes.POINTER(ctypes.c_void_p)]
    lib.rdmadev_free.argtypes = [ctypes.c_void_p]
    out = ctypes.c_void_p()
    rc = lib.rdmadev_read_pass_view(view, ctypes.byref(out))
    try:
        text = ctypes.string_at(out).decode()
    finally:
        lib.rdmadev_free(out)
    if rc:
        return None, text
    return dict(line.split("=", 1) for line in text.splitlines()), None


def test_the_pass_reads_the_view_field_by_field_by_name():
    """Every field the pass reads of a view is the one of that name on the Python side."""
    from tensorflow.core.framework import types_pb2

    view = PassView.of(_bundled_plan(big=True), max_bytes=1 << 30)
    fields, error = _read_natively(view)
    assert error is None, error
    assert len(view.halves) == 4 and len(view.bundles) == 2

    def facts(at, f):
        assert fields[f"{at}.node"] == f.node and fields[f"{at}.device"] == f.device
        assert int(fields[f"{at}.dtype"]) == types_pb2.DataType.Value(f.dtype)
        assert fields[f"{at}.shape"] == ("None" if f.shape is None else "(" + "".join(f"{d}," for d in f.shape) + ")")

    def limits(at, lim):
        assert float(fields[f"{at}.timeout_s"]) == lim.timeout_s == 300.0
        assert int(fields[f"{at}.zero_copy_min_bytes"]) == lim.zero_copy_min_bytes == 64 << 10
        assert int(fields[f"{at}.max_bytes"]) == lim.max_bytes == 1 << 30

    for i, h in enumerate(view.halves):
        at = f"halves[{i}]"
        assert fields[f"{at}.side"] == h.side
        facts(f"{at}.facts", h.facts)
        d = h.decision
        assert fields[f"{at}.decision.channel"] == d.channel == h.transfer.channel_key
        for name in ("zero_copy", "owned", "dead", "loop"):
            assert fields[f"{at}.decision.{name}"] == str(int(getattr(d, name)))
        assert fields[f"{at}.decision.host"] == d.host
        limits(f"{at}.limits", h.limits)
    assert [(h.side, h.decision.zero_copy) for h in view.halves] == [
        ("send", False), ("recv", True), ("send", False), ("recv", False)]  # the read aliases
    assert view.halves[3].facts.shape == (-1, 4)
    for i, b in enumerate(view.bundles):
        at = f"bundles[{i}]"
        assert (fields[f"{at}.side"], fields[f"{at}.device"], fields[f"{at}.channel"]) == (b.side, b.device, b.channel)
        assert fields[f"{at}.host"] == b.host
        limits(f"{at}.limits", b.limits)
        for j, m in enumerate(b.members):
            facts(f"{at}.members[{j}].facts", m.facts)
            assert int(fields[f"{at}.members[{j}].offset"]) == m.offset


class _Changed:
    """`obj` with the fields `changes` changed (a value) or gone (GONE)."""

    GONE = object()

    def __init__(self, obj, **changes):
        self._obj, self._changes = obj, changes

    def __getattr__(self, name):
        if name in self._changes:
            if self._changes[name] is self.GONE:
                raise AttributeError(name)
            return self._changes[name]
        return getattr(self._obj, name)


def _changed(view, where, field, value):
    """`view` with `field` of the part `where` ("halves[0].decision", "bundles[1].members[0]",
    "view") set to `value` (or gone, _Changed.GONE)."""
    if where == "view":
        return _Changed(view, **{field: value})
    steps = where.replace("]", "").replace("[", ".").split(".")
    objs = [view]
    for step in steps:
        objs.append(objs[-1][int(step)] if step.isdigit() else getattr(objs[-1], step))
    changed = _Changed(objs[-1], **{field: value})
    for step, obj in zip(steps[::-1], objs[-2::-1]):
        if step.isdigit():
            changed = tuple(changed if i == int(step) else o for i, o in enumerate(obj))
        else:
            changed = _Changed(obj, **{step: changed})
    return changed


@pytest.mark.parametrize("where, field, value, message", [
    ("halves[1].decision", "zero_copy", "yes", r"halves\[1\]\.decision\.zero_copy has type str, expected bool"),
    ("halves[1].decision", "zero_copy", _Changed.GONE,
     r"halves\[1\]\.decision \(_Changed\) has no field 'zero_copy'"),
    ("halves[0]", "facts", _Changed.GONE, r"halves\[0\] \(_Changed\) has no field 'facts'"),
    ("halves[0].facts", "node", None, r"halves\[0\]\.facts\.node has type NoneType, expected str"),
    ("halves[0].facts", "dtype", "DT_FLAOT", r"halves\[0\]\.facts\.dtype is 'DT_FLAOT', not a TensorFlow DataType name"),
    ("halves[3].facts", "shape", (-1, "4"), r"halves\[3\]\.facts\.shape\[1\] has type str, expected int"),
    ("halves[3].facts", "shape", 4, r"halves\[3\]\.facts\.shape has type int, expected tuple of ints or None"),
    ("halves[2].limits", "timeout_s", "300", r"halves\[2\]\.limits\.timeout_s has type str, expected float"),
    ("halves[2].limits", "max_bytes", True, r"halves\[2\]\.limits\.max_bytes has type bool, expected int"),
    ("halves[2]", "side", "sned", r"halves\[2\]\.side is 'sned', expected 'send' or 'recv'"),
    ("halves[0].decision", "host", None, r"halves\[0\]\.decision\.host has type NoneType, expected str"),
    ("bundles[0]", "host", _Changed.GONE, r"bundles\[0\] \(_Changed\) has no field 'host'"),
    ("bundles[1].members[0]", "offset", 0.5, r"bundles\[1\]\.members\[0\]\.offset has type float, expected int"),
    ("bundles[0]", "members", (), r"bundles\[0\]\.members is empty"),
    ("view", "halves", None, r"view\.halves has type NoneType, expected tuple"),
    ("view", "bundles", _Changed.GONE, r"view \(_Changed\) has no field 'bundles'"),
])
def test_a_field_missing_or_of_another_type_is_an_error_that_names_it(where, field, value, message):
    view = PassView.of(_bundled_plan(big=True))
    assert _read_natively(view)[1] is None
    fields, error = _read_natively(_changed(view, where, field, value))
    assert fields is None and re.fullmatch(message, error), error


DEVICE_PAIRS = [  # (send device, recv device): full names, TF's legacy and partial ones
    ("/job:ps/replica:0/task:0/device:CPU:0", "/job:worker/replica:0/task:0/device:CPU:0"),
    ("/job:worker/replica:0/task:0/device:CPU:0", "/job:worker/replica:0/task:0/device:GPU:0"),
    ("/job:worker/replica:0/task:0/device:CPU:0", "/job:worker/replica:0/task:1/device:CPU:0"),
    ("/job:worker/replica:0/task:1/cpu:0", "/job:worker/replica:0/task:1/device:CPU:0"),
    ("/job:worker/replica:0/task:1/cpu:0", "/job:worker/replica:0/task:2/cpu:0"),
    ("/job:ps/replica:0/task:10/device:CPU:0", "/job:ps/replica:0/task:1/device:CPU:0"),
    ("/job:ps/replica:1/task:0/device:CPU:0", "/job:ps/replica:0/task:0/device:CPU:0"),
]


@pytest.mark.parametrize("send, recv", DEVICE_PAIRS)
def test_the_pass_and_the_planner_tell_a_cross_task_pair_alike(send, recv):
    """The planner asks the pass's rule (rules.h, through the bindings) whether a pair crosses
    tasks, and groups regions by graph_pass.devices.task_of: the two must agree."""
    from graph_pass.devices import task_of

    assert RULES.crosses_tasks(send, recv) == (task_of(send) != task_of(recv))


@pytest.mark.parametrize("device, kernel", [
    ("/job:ps/replica:0/task:0/device:CPU:0", "/job:ps/replica:0/task:0/device:CPU:0"),
    ("/job:worker/replica:0/task:1/cpu:0", "/job:worker/replica:0/task:1/cpu:0"),
    ("/job:worker/replica:0/task:1/device:GPU:0", "/job:worker/replica:0/task:1/device:CPU:0"),
    ("/job:worker/replica:0/task:1/device:XLA_CPU:0", "/job:worker/replica:0/task:1/device:CPU:0"),
    ("/job:worker/replica:0/task:0/device:RDMADEV_TEST:0", "/job:worker/replica:0/task:0/device:CPU:0"),
    ("/job:worker/replica:0/task:0/gpu:1", "/job:worker/replica:0/task:0/device:CPU:0"),
])
def test_a_half_on_a_device_other_than_a_cpu_runs_rdmadevs_node_on_its_tasks_cpu(device, kernel):
    """rdmadev's kernels are CPU kernels: the rule (rules.h, KernelDevice) the planner asks."""
    assert RULES.kernel_device(device) == kernel


def test_the_planner_rules_are_the_native_libraries():
    from rdmadev._native import rules

    assert RULES.send_ops == rules.SEND_OPS and RULES.recv_ops == rules.RECV_OPS
    assert not RULES.send_ops & RULES.recv_ops and {"_Send", "_Recv"} <= RULES.send_ops | RULES.recv_ops
    assert (RULES.branch_mark, RULES.bound_attr) == (rules.BRANCH_MARK, rules.BOUND_ATTR)
    assert RULES.kernel_device is rules.kernel_device
    assert RULES.layout.to_dict() == rdmadev._core.wire_layout()


def test_a_pass_mode_the_op_library_does_not_know_is_refused_naming_it():
    from rdmadev.tf import pass_mode

    with pytest.raises(rdmadev.ConfigError, match="no pass mode 'sometimes'"):
        pass_mode._set_mode("sometimes")  # the library keeps its mode: -1, nothing set
