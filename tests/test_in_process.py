"""TF's in-process cluster on grpc+rdmadev (issue 59, item 1): every ps and worker server and
the coordinator in one process, built by TF's own multi_worker_test_base as TF's tests and its
parameter-server tutorial build it, each task with a runtime of its own. The same unchanged
script (tests/in_process_client.py) runs once over gRPC and once over grpc+rdmadev, each in a
process of its own (in-process servers cannot be stopped); results compared bitwise."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import tf_cluster

pytestmark = pytest.mark.tf

HERE = Path(__file__).resolve().parent
ENV = {"RDMADEV_SECRET": "rdmadev-in-process-secret", "RDMADEV_DEADLINE_S": "60",
       "TF_CPP_MIN_LOG_LEVEL": "2"}
#: TF import, 5 servers and a coordinator, tracing and 26 steps, on a loaded 2-core box.
TIMEOUT_S = 300


def _run(protocol, mode):
    proc = tf_cluster.run_picking_ports_again(lambda: subprocess.run(
        [sys.executable, str(HERE / "in_process_client.py"), protocol, mode], capture_output=True, text=True,
        timeout=TIMEOUT_S, cwd=HERE, env={**os.environ, **ENV}), lambda p: p.stderr)
    lines = [l for l in proc.stdout.splitlines() if l.startswith("RESULT ")]
    assert proc.returncode == 0 and lines, (proc.stdout + proc.stderr)[-4000:]
    return json.loads(lines[-1][len("RESULT "):])


def test_tfs_in_process_cluster_trains_through_rdmadev_bitwise_as_on_grpc():
    grpc, ours = _run("grpc", "pss"), _run("grpc+rdmadev", "pss")
    assert ours["results"] == grpc["results"], "grpc+rdmadev must compute what gRPC computes"
    steps = [p for p in ours["planned"] if p["function"].startswith(("__inference_train",
                                                                     "__inference_add_one"))]
    # each worker instantiated both steps: 4 plans, every cross-task tensor swapped
    assert len(steps) == 4 and all(p["swapped"] and not p["kept"] for p in steps), ours["planned"]
    # tasks of one process share memory: shm, never a socket
    assert {f for p in steps for f in p["fabrics"]} == {"shm"}, ours["planned"]
    # what stayed on gRPC is the coordinator's fetches of the results, TF's client path
    assert all(k[2] == "client_task" for p in ours["planned"] for k in p["kept"]), ours["planned"]
    # every task's runtime holds its halves of the steps' channels (its own Domain), and the
    # process's rdmadev carried the tensors (transfers count per process: the tasks share it)
    tasks = [f"/job:{j}/replica:0/task:{i}" for j in ("ps", "worker") for i in (0, 1)]
    assert sorted(ours["carried"]) == tasks, ours["carried"]
    assert all(c["channels"] > 0 for c in ours["carried"].values()), ours["carried"]
    assert len({c["transfers"] for c in ours["carried"].values()}) == 1, ours["carried"]
    assert ours["carried"][tasks[0]]["transfers"] > 0, ours["carried"]


def test_a_tf1_job_in_one_process_plans_each_tasks_graph_with_that_tasks_runtime():
    """TF1 between-graph, 1 ps and 2 workers in one process: each task's GraphMgr partitions its
    own graph, planned through that task's runtime, whose channel table meets its halves."""
    grpc, ours = _run("grpc", "tf1"), _run("grpc+rdmadev", "tf1")
    assert ours["results"] == grpc["results"], "grpc+rdmadev must compute what gRPC computes"
    planned = ours["planned"]
    assert sorted({p["task"] for p in planned}) == [
        "/job:ps/replica:0/task:0", "/job:worker/replica:0/task:0", "/job:worker/replica:0/task:1"], planned
    assert all(p["swapped"] and not p["kept"] for p in planned), planned
