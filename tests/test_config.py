"""Configuration, fabric selection, the CLI and the doctor: clear errors for bad input."""
import json
import os
import re
import resource
import shutil
import subprocess
import sys

import pytest

import rdmadev
from rdmadev import config
from rdmadev.cluster import facts

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


MiB, GiB = 1 << 20, 1 << 30


@pytest.mark.parametrize("ram, fabrics, hard, ipc_lock, budget", [
    (24 * GiB, ("shm", "tcp"), 8 * MiB, False, 12 * GiB),  # no verbs: nothing pinned
    (24 * GiB, ("verbs",), None, False, 12 * GiB),  # unlimited
    (24 * GiB, ("verbs",), 8 * MiB, True, 12 * GiB),  # CAP_IPC_LOCK: no limit applies
    (24 * GiB, ("verbs",), 8 * MiB, False, 4 * MiB),  # half the limit, a peer's staging beside
    (24 * GiB, ("shm", "verbs", "tcp"), GiB, False, 512 * MiB),  # auto with a device
    (24 * GiB, ("verbs",), 6 * MiB, False, 2 * MiB),  # the limit less one staging buffer
    (24 * GiB, ("verbs",), 64 << 10, False, 4 << 10),  # too small for any staging: the floor
    (24 * GiB, ("verbs",), 0, False, 4 << 10),
    (2 * GiB, ("verbs",), 64 * GiB, False, GiB),  # RAM binds first
])
def test_default_budget_is_half_of_ram_and_leaves_verbs_staging_room(ram, fabrics, hard, ipc_lock,
                                                                    budget):
    got = config.default_max_registered_bytes(ram, fabrics, hard, ipc_lock)
    assert got == budget
    # what `rdmadev doctor --peer` checks holds by construction wherever one staging buffer
    # fits at all, and nowhere else
    if "verbs" in fabrics and not ipc_lock and hard is not None:
        assert config.memlock_holds(got, hard) == (
            hard >= config.VERBS_STAGING_BYTES + config.MIN_DEFAULT_MAX_REGISTERED_BYTES)


def test_the_staging_the_budget_leaves_room_for_is_what_verbs_registers():
    # config.py keeps a copy of kStagingBytes so that a Config loads no native code.
    assert config.VERBS_STAGING_BYTES == rdmadev._core.VERBS_STAGING_BYTES


def test_auto_may_open_verbs_only_with_an_rdma_device():
    assert config.fabrics_may_open("shm") == ("shm",)
    assert config.fabrics_may_open("verbs") == ("verbs",)
    auto = config.fabrics_may_open("auto")
    assert {"shm", "tcp"} <= set(auto) and ("verbs" in auto) == bool(facts.rdma_devices())


#: Run in a child that lowers its own locked-memory hard limit: {case: [budget, [warnings]]}
#: of Configs built from real environments at each limit.
_LOWERED = r"""
import json, logging, resource, sys
warnings = []
class Keep(logging.Handler):
    def emit(self, record):
        warnings.append(record.getMessage())
logging.getLogger("rdmadev.config").addHandler(Keep(logging.WARNING))
from rdmadev.config import Config
out = {}
def build(case, limit, **env):
    warnings.clear()
    cfg = Config.from_env(env)
    Config.from_env(env)  # the same warning is logged once a process
    out[case] = [cfg.max_registered_bytes, list(warnings)]
for limit in map(int, sys.argv[1:]):
    resource.setrlimit(resource.RLIMIT_MEMLOCK, (limit, limit))
    for fabric in ("verbs", "shm", "auto"):
        build(f"{fabric} {limit}", limit, RDMADEV_FABRIC=fabric)
    build(f"verbs 1G {limit}", limit, RDMADEV_FABRIC="verbs", RDMADEV_MAX_REGISTERED_BYTES="1G")
    build(f"verbs 2M {limit}", limit, RDMADEV_FABRIC="verbs", RDMADEV_MAX_REGISTERED_BYTES="2M")
    build(f"shm 1G {limit}", limit, RDMADEV_FABRIC="shm", RDMADEV_MAX_REGISTERED_BYTES="1G")
    warnings.clear()
    out[f"Config(verbs) {limit}"] = [Config(fabric="verbs").max_registered_bytes, list(warnings)]
print(json.dumps(out))
"""


def _lowered(*limits, ipc_lock=False):
    """What _LOWERED prints, run with `limits` (bytes, each below the last), keeping
    CAP_IPC_LOCK or dropping it (setpriv, from the bounding set it execs with)."""
    hard = resource.getrlimit(resource.RLIMIT_MEMLOCK)[1]
    if hard != resource.RLIM_INFINITY and hard < limits[0]:
        pytest.skip(f"the locked-memory hard limit here is below {limits[0]}, which a test "
                    "process may only lower")
    has = config.locked_memory()[1]
    if has and not ipc_lock and not shutil.which("setpriv"):
        pytest.skip("this process has CAP_IPC_LOCK and no setpriv (util-linux) to drop it")
    if ipc_lock and not has:
        pytest.skip("this process lacks CAP_IPC_LOCK (not root)")
    drop = ["setpriv", "--inh-caps=-ipc_lock", "--bounding-set=-ipc_lock"] if has and not ipc_lock \
        else []
    env = {k: v for k, v in os.environ.items() if not k.startswith("RDMADEV_")}
    done = subprocess.run([*drop, sys.executable, "-c", _LOWERED, *map(str, limits)], env=env,
                          capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_lowered_memlock_lowers_the_default_budget_on_verbs_only():
    """A real process without CAP_IPC_LOCK lowers its locked-memory hard limit to 8 MiB, then
    64 KiB, and builds Configs from real environments."""
    out = _lowered(8 * MiB, 64 << 10)
    half = config.physical_memory() // 2
    auto = half if not facts.rdma_devices() else None
    budget, warned = out[f"verbs {8 * MiB}"]
    assert budget == 4 * MiB and len(warned) == 1, out
    assert "defaults to 4.0 MiB" in warned[0] and "hard limit is 8.0 MiB" in warned[0]
    assert "staging buffer verbs pins for each peer a task writes to (1 here)" in warned[0]
    assert "ulimit -l unlimited" in warned[0]
    assert out[f"Config(verbs) {8 * MiB}"] == [4 * MiB, []]  # built directly: the same default
    assert out[f"shm {8 * MiB}"] == [half, []]
    if auto is not None:  # no RDMA device: auto cannot open verbs
        assert out[f"auto {8 * MiB}"] == [auto, []]
    # an explicit budget wins; past the limit less one staging buffer, with a WARNING
    budget, warned = out[f"verbs 1G {8 * MiB}"]
    assert budget == GiB and len(warned) == 1, out
    assert "RDMADEV_MAX_REGISTERED_BYTES=1073741824 (1.0 GiB)" in warned[0]
    assert "hard limit of 8.0 MiB" in warned[0] and f"at most {4 * MiB}" in warned[0]
    assert out[f"verbs 2M {8 * MiB}"] == [2 * MiB, []]
    assert out[f"shm 1G {8 * MiB}"] == [GiB, []]
    # a limit too small for one staging buffer: the floor, every plan over budget
    budget, warned = out[f"verbs {64 << 10}"]
    assert budget == 4 << 10 and len(warned) == 1, out
    assert "defaults to 4 KiB" in warned[0] and "hard limit is 64 KiB, too small to pin one " \
        "verbs peer's 4.0 MiB staging buffer" in warned[0]
    budget, warned = out[f"verbs 1G {64 << 10}"]  # only raising the limit helps there
    assert budget == GiB and len(warned) == 1 and "at most" not in warned[0], out


def test_cap_ipc_lock_keeps_half_of_ram_under_any_memlock():
    out = _lowered(8 * MiB, ipc_lock=True)
    half = config.physical_memory() // 2
    assert out[f"verbs {8 * MiB}"] == [half, []]
    assert out[f"verbs 1G {8 * MiB}"] == [GiB, []]


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
