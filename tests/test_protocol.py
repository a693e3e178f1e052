"""The grpc+rdmadev server protocol and the plugin that brings it into every TF process
(rdmadev/tf/protocol.py, _native/tf/plugin/protocol.cc, _native/tf/plugin/plugin_loader.cc).

Every task and coordinator here is a script that never imports rdmadev for its steps
(tests/protocol_task.py, tests/protocol_client.py): real TF servers, real transfers, results
compared bitwise with the same script over plain gRPC on the same cluster."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import tf_cluster
from rdmadev.tf import protocol

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
SECRET = "rdmadev-protocol-secret"
ENV = {"RDMADEV_SECRET": SECRET, "RDMADEV_DEADLINE_S": "60", "TF_CPP_MIN_LOG_LEVEL": "2"}
# A coordinator process: TF import, connecting, tracing and a few steps on a loaded 2-core box.
CLIENT_TIMEOUT_S = 300
# One `import tensorflow` (3-6 s here), with room for a loaded machine.
IMPORT_TIMEOUT_S = 120



@pytest.fixture(scope="module")
def cluster():
    """1 ps + 1 worker, each a plain script serving grpc+rdmadev."""
    c = tf_cluster.Cluster(num_ps=1, num_workers=1, env=ENV,
                           launcher=tf_cluster.protocol_launcher(protocol.PROTOCOL))
    c.start()
    yield c
    c.stop()


def _run(args, env=None, timeout=IMPORT_TIMEOUT_S):
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, **ENV, **(env or {})})


def _client(cluster, proto, mode):
    proc = _run([str(HERE / "protocol_client.py"), json.dumps(cluster.spec), proto, mode],
                timeout=CLIENT_TIMEOUT_S)
    lines = [l for l in proc.stdout.splitlines() if l.startswith("RESULT ")]
    assert proc.returncode == 0 and lines, (proc.stdout + proc.stderr)[-4000:]
    return json.loads(lines[-1][len("RESULT "):])


@pytest.mark.tf
@pytest.mark.parametrize("mode", ["in_graph", "pss"])
def test_unchanged_scripts_are_swapped_by_the_protocol_alone(cluster, mode):
    # gRPC first: the coordinator's own pass is off, so the tasks carry nothing.
    grpc = _client(cluster, "grpc", mode)
    ours = _client(cluster, protocol.PROTOCOL, mode)
    assert ours["results"] == grpc["results"], "grpc+rdmadev must compute what gRPC computes"
    assert set(ours["transfers"]) == {"/job:ps/replica:0/task:0", "/job:worker/replica:0/task:0"}
    for task, n in ours["transfers"].items():
        assert n > grpc["transfers"][task], f"{task}: nothing moved over rdmadev ({mode})"


PROBE = """
import json, os, sys
import tensorflow as tf
maps = open("/proc/self/maps").read()
print("PROBE " + json.dumps({
    "threads": len(os.listdir("/proc/self/task")),
    "sockets": sum(os.readlink(f"/proc/self/fd/{fd}").startswith("socket:")
                   for fd in os.listdir("/proc/self/fd") if os.path.exists(f"/proc/self/fd/{fd}")),
    "protocol_loaded": "_tf_protocol.so" in maps,
    "rdmadev_native_loaded": "librdmadev_core.so" in maps or "_tf_ops.so" in maps,
    "rdmadev_imported": any(m == "rdmadev" or m.startswith("rdmadev.") for m in sys.modules),
}))
"""


def _probe(env=None):
    proc = _run(["-c", PROBE], env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(next(l for l in proc.stdout.splitlines() if l.startswith("PROBE "))[6:]), proc.stderr


def test_import_tensorflow_loads_only_the_inert_protocol():
    on, on_err = _probe()
    off, _ = _probe({protocol.PLUGIN_SWITCH: "0"})
    assert on["protocol_loaded"] and not off["protocol_loaded"]
    assert not on["rdmadev_native_loaded"] and not on["rdmadev_imported"]
    assert (on["threads"], on["sockets"]) == (off["threads"], off["sockets"]), (on, off)
    assert "rdmadev" not in on_err


@pytest.mark.tf
def test_a_tf1_server_with_the_protocol_starts_the_tasks_rdmadev():
    port = tf_cluster.free_ports(1)[0]
    code = ("import tensorflow as tf\n"
            f"s = tf.compat.v1.train.Server({{'ps': ['127.0.0.1:{port}']}}, 'ps', 0, protocol='grpc+rdmadev')\n"
            "from rdmadev.cluster import control, runtime\n"
            "rt = runtime.current()\n"
            f"c = control.ControlClient(control.control_address('127.0.0.1:{port}'), rt.config.secret,\n"
            "                           timeout=60, name='test')\n"
            "print('TASK', s.target, rt.task, c.call({'op': 'ping'})['task'])")
    proc = _run(["-c", code])
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert f"TASK grpc://127.0.0.1:{port} /job:ps/replica:0/task:0 /job:ps/replica:0/task:0" in proc.stdout


@pytest.mark.tf
def test_several_tasks_in_one_process_each_get_a_runtime_of_their_own():
    """Two grpc+rdmadev servers in one process (as TF's in-process clusters build them): each
    task has its own Domain and control service, answering as itself."""
    ports = tf_cluster.free_ports(2)
    spec = {"ps": [f"127.0.0.1:{ports[0]}"], "worker": [f"127.0.0.1:{ports[1]}"]}
    code = ("import tensorflow as tf\n"
            f"tf.distribute.Server({spec!r}, 'ps', 0, protocol='grpc+rdmadev')\n"
            f"tf.distribute.Server({spec!r}, 'worker', 0, protocol='grpc+rdmadev')\n"
            "from rdmadev.cluster import runtime\n"
            "ps, w = (runtime.of_task(t) for t in ('/job:ps/replica:0/task:0', '/job:worker/replica:0/task:0'))\n"
            "print('TASKS', ps.task, w.task, ps.domain.address != w.domain.address,\n"
            "      w.call(ps.task, {'op': 'ping'})['task'], ps.call(w.task, {'op': 'ping'})['task'])")
    proc = _run(["-c", code])
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert ("TASKS /job:ps/replica:0/task:0 /job:worker/replica:0/task:0 True "
            "/job:ps/replica:0/task:0 /job:worker/replica:0/task:0") in proc.stdout, proc.stdout


@pytest.mark.tf
def test_switched_off_the_protocol_is_unknown_to_tf():
    code = ("import tensorflow as tf\n"
            "tf.distribute.Server({'w': ['127.0.0.1:1']}, 'w', 0, protocol='grpc+rdmadev', start=False)")
    proc = _run(["-c", code], env={protocol.PLUGIN_SWITCH: "0"})
    assert proc.returncode != 0 and "No server factory registered" in proc.stderr, proc.stderr[-2000:]


@pytest.mark.tf
def test_a_task_that_cannot_start_rdmadev_fails_its_server_with_the_fix():
    port = tf_cluster.free_ports(1)[0]
    code = ("import tensorflow as tf\n"
            f"tf.distribute.Server({{'ps': ['127.0.0.1:{port}']}}, 'ps', 0, protocol='grpc+rdmadev')")
    proc = _run(["-c", code], env={"RDMADEV_SECRET": ""})
    assert proc.returncode != 0
    assert "InvalidArgumentError" in proc.stderr and "/job:ps/task:0" in proc.stderr
    assert "RDMADEV_SECRET is not set" in proc.stderr and "Fix:" in proc.stderr, proc.stderr[-2000:]


def _build_loader(out, tf_version, package_dir):
    subprocess.run(["g++", "-std=c++17", "-O2", "-shared", "-fPIC", "-Wall",
                    f'-DRDMADEV_BUILT_TF_VERSION="{tf_version}"', f'-DRDMADEV_PACKAGE_DIR="{package_dir}"',
                    str(ROOT / "_native" / "tf" / "plugin" / "plugin_loader.cc"), "-o", str(out), "-ldl"],
                   check=True, timeout=IMPORT_TIMEOUT_S)


def test_a_mismatched_or_stale_plugin_is_one_warning_and_tensorflow_imports(tmp_path):
    # TF loads tensorflow-plugins/ of every sys.path entry named site-packages.
    plugins = tmp_path / "site-packages" / "tensorflow-plugins"
    plugins.mkdir(parents=True)
    import tensorflow as tf

    _build_loader(plugins / "libold_plugin.so", "0.0.1", ROOT / "rdmadev")
    _build_loader(plugins / "libstale_plugin.so", tf.__version__, tmp_path / "uninstalled")
    env = {"PYTHONPATH": str(tmp_path / "site-packages")}
    probe, err = _probe(env)
    lines = [l for l in err.splitlines() if l.startswith("rdmadev:")]
    assert len(lines) == 2, err[-3000:]
    assert sum(f"built against TensorFlow 0.0.1, this is {tf.__version__}" in l for l in lines) == 1
    assert sum(f"not installed at {tmp_path / 'uninstalled'}" in l for l in lines) == 1
    assert probe["protocol_loaded"]  # the real plugin still did its job
    _, quiet = _probe({**env, protocol.PLUGIN_SWITCH: "0"})
    assert "rdmadev:" not in quiet
