"""Workers that compute on a device other than the CPU (issue 58): TF's XLA_CPU device and the
tests' own PluggableDevice RDMADEV_TEST (tests/devices/). rdmadev's kernels run on a task's
CPU, so a pair with an end on such a device crosses through the task's host memory: the pass
leaves the end's node on its device as TF's transfer to or from the CPU, where rdmadev's node
runs (_native/tf/pass/host_hop.h). Each scenario runs the same unchanged script
(tests/device_client.py) over gRPC and over grpc+rdmadev on one cluster of real TF servers,
results compared bitwise; every cross-task tensor is swapped but those whose reason the
report gives (a while loop on a device)."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import device_plugin
import tf_cluster
from rdmadev.tf import protocol

HERE = Path(__file__).resolve().parent
ENV = {"RDMADEV_SECRET": "rdmadev-device-secret", "RDMADEV_DEADLINE_S": "60", "TF_CPP_MIN_LOG_LEVEL": "2",
       "TF_XLA_FLAGS": "--tf_xla_enable_xla_devices"}
# A coordinator process: TF import, connecting, tracing and a few steps on a loaded 2-core box.
CLIENT_TIMEOUT_S = 300
DEVICES = ["XLA_CPU", device_plugin.DEVICE_TYPE]

device_env = device_plugin.device_env


@pytest.fixture(scope="module")
def cluster(device_env):
    """1 ps + 1 worker serving grpc+rdmadev, each with XLA devices and RDMADEV_TEST."""
    env = {**{k: device_env[k] for k in ("PYTHONPATH",)}, **ENV}
    c = tf_cluster.Cluster(num_ps=1, num_workers=1, env=env,
                           launcher=tf_cluster.protocol_launcher(protocol.PROTOCOL))
    c.start()
    c.client_env = {**device_env, **ENV}
    yield c
    c.stop()


def _client(cluster, proto, mode, device):
    proc = subprocess.run([sys.executable, str(HERE / "device_client.py"), json.dumps(cluster.spec), proto,
                           mode, device], capture_output=True, text=True, timeout=CLIENT_TIMEOUT_S,
                          env=cluster.client_env)
    lines = [l for l in proc.stdout.splitlines() if l.startswith("RESULT ")]
    assert proc.returncode == 0 and lines, (proc.stdout + proc.stderr)[-4000:]
    return json.loads(lines[-1][len("RESULT "):])


def _compare(cluster, mode, device):
    grpc = _client(cluster, "grpc", mode, device)
    ours = _client(cluster, protocol.PROTOCOL, mode, device)
    report = "\n".join(ours["reports"])
    assert ours["results"] == grpc["results"], f"grpc+rdmadev must compute what gRPC computes\n{report}"
    for task, n in ours["transfers"].items():
        assert n > grpc["transfers"][task], f"{task}: nothing moved over rdmadev ({mode})\n{report}"
    assert ours["via_host"], f"no swapped tensor crossed via host\n{report}"
    assert all(f"device:{device}:0" in d for ds in ours["via_host"].values() for d in ds), report
    assert "device copies a step" in report, report
    return ours


@pytest.mark.tf
@pytest.mark.parametrize("device", DEVICES)
def test_in_graph_steps_with_worker_compute_on_a_device_match_grpc(cluster, device):
    """Static, run-time-shaped, bundled and conditional tensors cross via host; the while loop
    on the device stays on gRPC, and the report says why."""
    ours = _compare(cluster, "in_graph", device)
    kept = {reason for _, reason in ours["kept"]}
    assert kept <= {"device_loop", "client_task", "below_min_bytes"}, ours["kept"]
    assert "device_loop" in kept, ours["kept"]
    report = "\n".join(ours["reports"])
    assert " bundle " in report and "run-time shape" in report, report


@pytest.mark.tf
@pytest.mark.parametrize("device", DEVICES)
def test_pss_steps_with_worker_compute_on_a_device_match_grpc(cluster, device):
    ours = _compare(cluster, "pss", device)
    assert not [k for k in ours["kept"] if k[1] != "client_task"], ours["kept"]


@pytest.mark.tf
def test_keras_fit_under_pss_with_worker_compute_on_a_device_matches_grpc(cluster):
    ours = _compare(cluster, "keras", device_plugin.DEVICE_TYPE)
    assert not [k for k in ours["kept"] if k[1] not in ("client_task", "below_min_bytes")], ours["kept"]


@pytest.mark.tf
def test_tf1_between_graph_worker_on_a_device_matches_grpc(cluster):
    """A TF1 session (the worker's own task partitions, each half planned where it runs) with
    an embedding of run-time shape: every pair the worker's device ends crosses via host."""
    ours = _compare(cluster, "tf1", device_plugin.DEVICE_TYPE)
    assert not [k for k in ours["kept"] if k[1] != "client_task"], ours["kept"]
