"""Configuration, fabric selection, the CLI and the doctor: clear errors for bad input."""
import json
import os
import re
import subprocess
import sys

import pytest

import rdmadev

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.mark.parametrize("env, match", [
    ({"RDMADEV_FABRIC": "infiniband"}, "RDMADEV_FABRIC='infiniband' is not a fabric"),
    ({"RDMADEV_SLOTS": "0"}, "RDMADEV_SLOTS='0' is out of range"),
    ({"RDMADEV_SLOTS": "two"}, "RDMADEV_SLOTS='two' is not a number"),
    ({"RDMADEV_SPIN_US": "-5"}, "RDMADEV_SPIN_US='-5' is out of range"),
    ({"RDMADEV_DEADLINE_S": "0"}, "RDMADEV_DEADLINE_S='0' is out of range"),
    ({"RDMADEV_TCP_ADDR": "nohostport"}, "RDMADEV_TCP_ADDR='nohostport' is not host:port"),
    ({"RDMADEV_SECRET_FILE": "/nonexistent/secret"}, "cannot be read"),
    ({"RDMADEV_SECRET": "a", "RDMADEV_SECRET_FILE": "/x"}, "both"),
    ({"RDMADEV_DYNAMIC_CAPACITY": "0"}, "RDMADEV_DYNAMIC_CAPACITY='0' is not a positive byte count"),
    ({"RDMADEV_BUNDLE_BELOW_BYTES": "-1"}, "RDMADEV_BUNDLE_BELOW_BYTES='-1' is not a byte count"),
])
def test_bad_environment_names_the_variable_and_the_fix(env, match):
    with pytest.raises(rdmadev.ConfigError) as e:
        rdmadev.Config.from_env(env)
    assert match in str(e.value) and "Fix:" in str(e.value)


def test_environment_values_are_read(tmp_path):
    secret = tmp_path / "secret"
    secret.write_text("from-a-file\n")
    cfg = rdmadev.Config.from_env({"RDMADEV_FABRIC": "TCP", "RDMADEV_SLOTS": "4",
                                   "RDMADEV_SECRET_FILE": str(secret),
                                   "RDMADEV_TCP_ADDR": "127.0.0.1:0"})
    assert (cfg.fabric, cfg.slots, cfg.secret) == ("tcp", 4, b"from-a-file")
    # 0 turns these off, and the planner takes the bundles' threshold from here
    off = rdmadev.Config.from_env({"RDMADEV_BUNDLE_BELOW_BYTES": "0", "RDMADEV_STAGE_BELOW_SLOT_BYTES": "0"})
    assert (off.bundle_below_bytes, off.stage_below_slot_bytes) == (0, 0)
    from rdmadev.tf.bridge import plan_config
    assert plan_config(off).bundle_below_bytes == 0
    assert plan_config(rdmadev.Config.from_env({"RDMADEV_BUNDLE_BELOW_BYTES": "4K"})).bundle_below_bytes == 4096


def test_unviable_fabric_is_a_clear_error():
    with pytest.raises(rdmadev.FabricError, match="verbs is not viable here"):
        rdmadev.open_domain("x", rdmadev.Config(fabric="verbs"))
    with pytest.raises(rdmadev.ConfigError, match="unknown fabric 'bogus'"):
        rdmadev.Domain("x", ["bogus"])
    with pytest.raises(rdmadev.ConfigError, match="RDMADEV_SECRET"):
        rdmadev.Domain("x", ["tcp"], secret=b"")


def test_auto_prefers_shm_on_one_host_and_tcp_across_hosts():
    with rdmadev.open_domain("a", rdmadev.Config(secret=b"k")) as a, \
            rdmadev.open_domain("b", rdmadev.Config(secret=b"k")) as b:
        assert a.fabrics == rdmadev.viable_fabrics()
        assert a.choose(b.address) == "shm"
        elsewhere = re.sub(r"shm=[^:;]+", "shm=another-boot-id.0", b.address)
        assert a.choose(elsewhere) == "tcp"
        assert a.connect(elsewhere).fabric == "tcp"
        with pytest.raises(rdmadev.FabricError, match="can reach none the peer offers"):
            a.choose(elsewhere.split(";")[0])
        with pytest.raises(rdmadev.ProtocolError, match="not fabric=reach"):
            a.choose("garbage")


def _run(*args):
    return subprocess.run([sys.executable, "-m", "rdmadev", *args], capture_output=True,
                          text=True, timeout=300, cwd=ROOT)


def test_doctor_reports_fabrics_and_limits():
    out = _run("doctor", "--json")
    assert out.returncode == 0, out.stderr
    info = json.loads(out.stdout)
    fabrics = {f["fabric"]: f for f in info["fabrics"]}
    assert fabrics["shm"]["viable"] and fabrics["tcp"]["viable"]
    assert not fabrics["verbs"]["viable"] and fabrics["verbs"]["reason"]
    assert info["memlock"]["soft"] and info["config"] == "ok"
    text = _run("doctor")
    assert text.returncode == 0 and "fabric shm" in text.stdout and "memlock" in text.stdout


def test_doctor_flags_bad_configuration():
    out = subprocess.run([sys.executable, "-m", "rdmadev", "doctor"], capture_output=True, text=True,
                         timeout=300, env={**os.environ, "RDMADEV_FABRIC": "nope"})
    assert out.returncode == 1 and "RDMADEV_FABRIC='nope'" in out.stdout


def test_cli_rejects_unknown_command():
    out = _run("frobnicate")
    assert out.returncode == 2 and "unknown command" in out.stderr


def test_demo_moves_checked_tensors_over_every_fabric():
    out = _run("demo", "--sizes", "4,4100,65536", "--count", "3")
    assert out.returncode == 0, out.stdout + out.stderr
    for fabric in rdmadev.viable_fabrics():
        assert re.search(rf"^{fabric}\s+65536\s+3\s+\S+\s+ok$", out.stdout, re.M), out.stdout
    assert "all tensors arrived intact" in out.stdout
