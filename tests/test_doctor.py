"""`rdmadev doctor` checks the op library the way every task loads it."""
import json

import pytest

from rdmadev.cluster import facts
from rdmadev.tf import ops, protocol
from rdmadev.tools import doctor


def test_doctor_loads_the_op_library():
    info = doctor._op_library()
    assert info["loaded"], info
    assert info["path"] == ops.library_path() and "loads, built against TensorFlow" in info["note"]


def test_doctor_reports_an_op_library_built_for_another_tensorflow(monkeypatch):
    import rdmadev._build_info as build_info
    monkeypatch.setattr(build_info, "TF_VERSION", "0.0.0")
    ops.load.cache_clear()
    try:
        info = doctor._op_library()
    finally:
        ops.load.cache_clear()
    assert not info["loaded"] and "built against TensorFlow 0.0.0" in info["note"]
    assert "pip install" in info["note"]


def test_doctor_says_whether_the_tf_plugin_is_active():
    on = doctor._tf_plugin()
    assert on["active"] and on["path"] == protocol.plugin_path(), on
    off = doctor._tf_plugin({protocol.PLUGIN_SWITCH: "0"})
    assert not off["active"] and "RDMADEV_PLUGIN=0" in off["note"]


def test_doctor_says_tensorflow_run_outside_site_packages_loads_no_plugin(tmp_path):
    """TF on PYTHONPATH (or a Bazel build) skips tensorflow-plugins/: the loader never ran, so
    it printed no warning to point at; doctor names where TF runs from and the fix."""
    import importlib.util
    import os
    import subprocess
    import sys
    tf_dir = os.path.dirname(importlib.util.find_spec("tensorflow").origin)
    (tmp_path / "tensorflow").symlink_to(tf_dir)
    r = subprocess.run([sys.executable, "-c", "import json; from rdmadev.tools import doctor; "
                        "print(json.dumps(doctor._tf_plugin()))"],
                       capture_output=True, text=True, timeout=300,
                       env={**os.environ, "PYTHONPATH": str(tmp_path), "TF_CPP_MIN_LOG_LEVEL": "2"})
    assert r.returncode == 0, r.stderr[-3000:]
    info = json.loads(r.stdout.splitlines()[-1])
    assert not info["active"], info
    assert f"runs from {tmp_path / 'tensorflow'}" in info["note"], info
    assert "rdmadev.tf.protocol.load()" in info["note"], info


@pytest.mark.parametrize("argv", [["--help"], []])
def test_cli_usage_lists_every_command(argv, capsys):
    from rdmadev.tools.cli import main
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert all(cmd in out for cmd in ("doctor", "serve", "demo", "plan"))


@pytest.mark.parametrize("command", ["doctor", "serve", "demo", "plan"])
def test_cli_each_commands_help_is_its_own(command, capsys):
    from rdmadev.tools.cli import main
    assert main([command, "--help"]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"usage: rdmadev {command}"), out


@pytest.mark.parametrize("argv", [["nope"], ["--nope", "doctor"], ["doctor", "--nope"]])
def test_cli_an_unknown_command_or_option_is_an_error_with_status_2(argv, capsys):
    from rdmadev.tools.cli import main
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "nope" in err and "error" in err, err
    if argv == ["nope"]:
        assert "unknown command 'nope'" in err and "doctor" in err, err


def test_cli_version_is_the_packages_and_the_distributions(capsys):
    import importlib.metadata
    import rdmadev
    import tensorflow as tf
    from rdmadev.tools.cli import main
    assert main(["--version"]) == 0
    out = capsys.readouterr().out.strip()
    assert out == f"rdmadev {rdmadev.__version__} (built against TensorFlow {tf.__version__})"
    # pyproject takes the version from rdmadev.__version__: one place to change it
    assert importlib.metadata.version("rdmadev") == rdmadev.__version__


def test_doctor_reports_the_open_file_limits_and_the_peers_they_serve():
    import subprocess
    import sys
    code = ("import json, resource; resource.setrlimit(resource.RLIMIT_NOFILE, (1000, 4000)); "
            "from rdmadev.tools import doctor; print(json.dumps(doctor._open_files()))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    info = json.loads(out.stdout)
    assert info["soft"] == "1000" and info["hard"] == "4000", info
    assert "serves about 328 peer tasks" in info["note"], info  # (4000 - 64) // 12


def test_doctor_lists_every_rdma_device_port_and_gid_from_sysfs(tmp_path, monkeypatch):
    """Whether verbs can run is the core's verdict (fabrics); the devices, ports and GIDs
    behind it are listed from sysfs, zero GIDs left out, each GID's kind named."""
    port = tmp_path / "rxe0" / "ports" / "1"
    files = {"state": "4: ACTIVE", "link_layer": "Ethernet",
             "gids/0": "fe80:0000:0000:0000:0250:56ff:fe00:0001", "gid_attrs/types/0": "IB/RoCE v1",
             "gids/1": "0000:0000:0000:0000:0000:ffff:0a09:0901", "gid_attrs/types/1": "RoCE v2",
             "gid_attrs/ndevs/1": "eth0", "gids/2": "0000:0000:0000:0000:0000:0000:0000:0000"}
    for name, text in files.items():
        (port / name).parent.mkdir(parents=True, exist_ok=True)
        (port / name).write_text(text + "\n")
    monkeypatch.setattr(facts, "SYSFS_IB", str(tmp_path))
    verbs = doctor._verbs()
    assert verbs["devices"] == ["rxe0"]
    [p] = verbs["ports"]
    assert (p["device"], p["port"], p["state"], p["link_layer"]) == ("rxe0", 1, "4: ACTIVE", "Ethernet")
    assert [(g["index"], g["kind"], g["netdev"]) for g in p["gids"]] == [
        (0, "IB/RoCE v1, IPv6 link-local", None), (1, "RoCE v2, IPv4 10.9.9.1", "eth0")]
    monkeypatch.setattr(facts, "SYSFS_IB", str(tmp_path / "none"))
    assert doctor._verbs() == {"devices": [], "ports": []}
