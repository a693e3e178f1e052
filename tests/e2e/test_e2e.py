"""rdmadev.optimize end to end on a real loopback cluster of `rdmadev serve` tasks: the
same numbers as TF's own gRPC path, bit for bit, with the tensors moved by rdmadev."""
import re

import pytest

from e2e_util import run_driver

pytestmark = pytest.mark.tf


def _swapped(report):
    return [int(n) for n in re.findall(r"(\d+) transfers swapped", report)]


def test_training_is_bitwise_identical(cluster):
    grpc = run_driver(cluster, "grpc", "train")
    rdma = run_driver(cluster, "rdmadev", "train")
    assert len(rdma["losses"]) == 30
    assert rdma["losses"] == grpc["losses"]
    assert rdma["w"] == grpc["w"] and rdma["b"] == grpc["b"]
    assert _swapped(rdma["report"]) and _swapped(rdma["report"])[0] >= 6
    # Both directions moved: variable reads ps -> workers, gradients workers -> ps.
    assert re.search(r"ps/replica:0/task:0 -> /job:worker", rdma["report"])
    assert re.search(r"worker/replica:0/task:\d -> /job:ps", rdma["report"])


def test_function_without_cross_task_pair_is_left_alone(cluster):
    grpc = run_driver(cluster, "grpc", "noop")
    rdma = run_driver(cluster, "rdmadev", "noop")
    assert rdma["values"] == grpc["values"] == [32.0, 48.0, 64.0]
    assert rdma["report"] == "rdmadev: no cross-task transfer in this function (nothing to rewrite)"


def test_64_mib_transfers_both_ways(cluster):
    grpc = run_driver(cluster, "grpc", "big")
    rdma = run_driver(cluster, "rdmadev", "big")
    assert rdma["values"] == grpc["values"] and rdma["digest"] == grpc["digest"]
    assert "67108864 B" in rdma["report"]


def test_retracing_and_two_functions(cluster):
    grpc = run_driver(cluster, "grpc", "retrace")
    rdma = run_driver(cluster, "rdmadev", "retrace")
    assert rdma["values"] == grpc["values"]
    assert all(_swapped(r) for r in rdma["reports"])


def test_wrong_secret_is_a_clear_error_not_a_silent_fallback(cluster):
    proc = run_driver(cluster, "rdmadev", "train", env={"RDMADEV_SECRET": "not-the-secret"},
                      expect_ok=False)
    assert proc.returncode != 0
    assert "rdmadev could not plan this function" in proc.stderr
    assert "RDMADEV_SECRET" in proc.stderr


def test_tasks_started_without_rdmadev_give_a_clear_error():
    """Plain TF servers (no `rdmadev serve`): the optimized call fails and says how to fix it."""
    from e2e_util import tf_cluster
    with tf_cluster.Cluster() as plain:
        proc = run_driver(plain, "rdmadev", "train", expect_ok=False)
    assert proc.returncode != 0
    assert "rdmadev could not plan this function" in proc.stderr
    assert "rdmadev serve" in proc.stderr
