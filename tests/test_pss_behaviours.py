"""ParameterServerStrategy behaviours that TF's own tests check hold on grpc+rdmadev wherever
they hold on gRPC (issue 59, item 3): tests/pss_behaviours.py runs them unchanged on TF's
in-process cluster, once per protocol, each in a process of its own; every behaviour's result
compared bitwise, and each must have moved its cross-task tensors through rdmadev."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import tf_cluster

pytestmark = pytest.mark.tf

HERE = Path(__file__).resolve().parent
ENV = {"RDMADEV_SECRET": "rdmadev-behaviours-secret", "RDMADEV_DEADLINE_S": "60",
       "TF_CPP_MIN_LOG_LEVEL": "2"}
#: TF import, 5 servers, 9 behaviours tracing ~20 functions, on a loaded 2-core box.
TIMEOUT_S = 400


def _run(protocol):
    proc = tf_cluster.run_picking_ports_again(lambda: subprocess.run(
        [sys.executable, str(HERE / "pss_behaviours.py"), protocol], capture_output=True, text=True,
        timeout=TIMEOUT_S, cwd=HERE, env={**os.environ, **ENV}), lambda p: p.stderr)
    out = {}
    for line in proc.stdout.splitlines():
        if line.startswith("BEHAVIOUR "):
            _, name, body = line.split(" ", 2)
            out[name] = json.loads(body)
    assert proc.returncode == 0 and out, (proc.stdout + proc.stderr)[-4000:]
    return out


@pytest.fixture(scope="module")
def runs():
    return _run("grpc"), _run("grpc+rdmadev")


def test_every_behaviour_that_holds_on_grpc_holds_on_rdmadev_bitwise(runs):
    grpc, ours = runs
    assert sorted(grpc) == sorted(ours), (sorted(grpc), sorted(ours))
    held = [name for name, r in grpc.items() if r["ok"]]
    assert len(held) == len(grpc) == 9, {n: r.get("error") for n, r in grpc.items()}  # all, today
    for name in held:
        assert ours[name]["ok"], f"{name} failed on grpc+rdmadev: {ours[name].get('error')}"
        assert ours[name]["result"] == grpc[name]["result"], f"{name}: results differ"


def test_every_behaviour_moved_its_cross_task_tensors_through_rdmadev(runs):
    grpc, ours = runs
    assert all(r["swapped"] == 0 for r in grpc.values())
    assert all(r["swapped"] > 0 for r in ours.values()), {n: r["swapped"] for n, r in ours.items()}
