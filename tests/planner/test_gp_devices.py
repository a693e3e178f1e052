"""graph_pass.devices: the one parser of TF device and task names."""

import pytest

import gp_builders as B
import graph_pass as gp
from graph_pass.devices import Device, job_of, parse_device, split_task, task_name, task_of
from rdmadev._core import PLANNER_RULES as RULES


def test_full_names_with_device_kind():
    assert parse_device("/job:ps/replica:0/task:1/device:CPU:0") == Device("ps", 0, 1, "CPU", 0)
    assert parse_device("/job:worker/replica:2/task:3/device:GPU:7") == Device("worker", 2, 3, "GPU", 7)
    assert task_of("/job:worker/replica:2/task:3/device:GPU:7") == "/job:worker/replica:2/task:3"
    assert job_of("/job:worker/replica:2/task:3/device:GPU:7") == "worker"


@pytest.mark.parametrize("name,expected", [
    ("/job:ps", Device("ps", 0, 0, None, None)),
    ("/job:ps/task:1", Device("ps", 0, 1, None, None)),
    ("/job:ps/replica:1", Device("ps", 1, 0, None, None)),
    ("/job:worker/task:2/device:CPU:0", Device("worker", 0, 2, "CPU", 0)),
    ("/job:worker/replica:0/task:2/", Device("worker", 0, 2, None, None)),
    ("/job:worker/replica:0/task:0/device:CPU:*", Device("worker", 0, 0, "CPU", None)),
])
def test_partial_names_default_replica_and_task_to_zero(name, expected):
    assert parse_device(name) == expected
    assert task_of(name) == task_name(expected.job, expected.task, expected.replica)


def test_legacy_kind_without_device_prefix():
    assert parse_device("/job:ps/replica:0/task:0/cpu:0") == Device("ps", 0, 0, "cpu", 0)
    assert parse_device("/cpu:0") == Device(None, None, None, "cpu", 0)


@pytest.mark.parametrize("name", ["", "/device:CPU:0", "/cpu:0"])
def test_local_names_have_no_task(name):
    d = parse_device(name)
    assert d.job is None and d.task_name == "" and task_of(name) == "" and job_of(name) == ""
    with pytest.raises(ValueError, match=f"{name!r} names no job"):
        split_task(name)


def test_task_name_and_split_task_are_inverse():
    assert task_name("worker", 3) == "/job:worker/replica:0/task:3"
    assert task_name("ps", "1", replica=2) == "/job:ps/replica:2/task:1"
    assert split_task("/job:worker/replica:0/task:3/device:CPU:0") == ("worker", 3)
    assert split_task(task_name("chief", 0)) == ("chief", 0)


@pytest.mark.parametrize("garbage", ["ps:0", "job:ps", "/job:ps/task:x", "/job:/task:0", "/job:ps/task:0/extra",
                                     "/job:ps/device:CPU:0/task:0", "worker"])
def test_garbage_is_a_value_error_quoting_the_input(garbage):
    for fn in (parse_device, task_of, job_of, split_task):
        with pytest.raises(ValueError, match=f"{garbage!r} is not a TF device name"):
            fn(garbage)


def test_planner_reports_a_garbage_device_attr_naming_the_node():
    ps, w = B.Partition(B.dev("ps")), B.Partition(B.dev("worker"))
    ps.node("c", "Const", dtype=("type", B.FLOAT), value=("tensor", (B.FLOAT, (2,), None)))
    ps.send("c/_send", "c", "edge_1_c", "worker:0")
    with pytest.raises(gp.PlanError, match=r"_Send node 'c/_send' .* recv_device 'worker:0' is not a TF device name"):
        gp.find_transfers(gp.load(B.partitions(ps, w)), rules=RULES)


def test_explain_short_task_uses_the_parser():
    from graph_pass.explain import short_task

    assert short_task("/job:worker/replica:0/task:1") == "worker:1"
    assert short_task("/job:ps/replica:2/task:0/device:CPU:0") == "ps:r2:0"
    assert short_task("") == "?"
