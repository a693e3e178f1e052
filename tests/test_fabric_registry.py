"""The fabric registry: every fabric registers once with a priority, unknown names and
options are configuration errors naming the choices, and fabric options travel from the
environment (read once, by rdmadev.Config) to the fabric that validates them."""
import os
import re

import pytest

import rdmadev
from rdmadev import _core
from rdmadev.config import FABRIC_OPTION_VARIABLES

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CORE = os.path.join(ROOT, "_native", "core")
# The file set every fabric folder has (documented in _native/core/fabric.h).
FABRIC_FILES = ("{0}.h", "{0}.cc", "{0}_options.h", "{0}_factory.cc")
# What a fabric has beyond that set, each file with a job of its own (fabric.h says which).
FABRIC_EXTRAS = {
    "shm": set(),
    "tcp": {"frame.h", "frame.cc"},
    "verbs": {"ibv_lib.h", "ibv_lib.cc"} | {f"verbs_{part}.{ext}" for part in (
        "device", "memory", "qp", "send_queue", "endpoint") for ext in ("h", "cc")},
}


def test_priority_order_and_each_fabric_registered_once():
    names = _core.fabric_priority()
    assert names == ["shm", "verbs", "tcp"]
    assert len(set(names)) == len(names)
    assert [name for name, _, _ in rdmadev.fabric_report()] == names


def test_every_fabric_folder_has_the_same_file_set():
    for name in _core.fabric_priority():
        for pattern in FABRIC_FILES:
            path = os.path.join(CORE, name, pattern.format(name))
            assert os.path.isfile(path), f"{path} is missing"


def test_every_fabric_folder_holds_the_file_set_and_only_its_documented_extras():
    assert set(FABRIC_EXTRAS) == set(_core.fabric_priority())
    for name, extras in FABRIC_EXTRAS.items():
        files = set(os.listdir(os.path.join(CORE, name)))
        assert files == {p.format(name) for p in FABRIC_FILES} | extras, name


def test_every_factory_is_the_shared_template_in_one_line():
    # TensorPipe-style: the shared part of a registry entry is FabricFactoryOf (fabric.h); a
    # fabric's factory file only names its backend.
    for name in _core.fabric_priority():
        text = open(os.path.join(CORE, name, f"{name}_factory.cc")).read()
        code = [line for line in text.splitlines()
                if line.strip() and not line.lstrip().startswith(("//", "#", "namespace", "}"))]
        assert code == [f"const FabricRegistration kRegistration(FabricFactoryOf<"
                        f"{name.capitalize()}Backend>());"], (name, code)


def test_unknown_fabric_names_the_choices():
    with pytest.raises(rdmadev.ConfigError, match=r"unknown fabric 'bogus' \(choose one of shm, verbs, tcp\)"):
        rdmadev.Domain("x", ["bogus"])
    with pytest.raises(rdmadev.ConfigError, match="unknown fabric 'bogus'"):
        _core.unviable_reason("bogus")


def test_auto_opens_viable_fabrics_in_priority_order():
    with rdmadev.open_domain("a", rdmadev.Config(secret=b"k")) as dom:
        assert dom.fabrics == rdmadev.viable_fabrics()
        assert [item.split("=", 1)[0] for item in dom.address.split(";")] == dom.fabrics


def test_config_reads_fabric_options_from_the_environment():
    cfg = rdmadev.Config.from_env({"RDMADEV_DEVICE": " rxe0 ", "RDMADEV_PORT": "1",
                                   "RDMADEV_GID_INDEX": "3", "RDMADEV_ACK_TIMEOUT": "18"})
    assert cfg.fabric_options() == {"verbs.device": "rxe0", "verbs.port": "1",
                                    "verbs.gid_index": "3", "verbs.ack_timeout": "18"}
    assert rdmadev.Config.from_env({}).fabric_options() == {}
    assert [var for var, _, _ in FABRIC_OPTION_VARIABLES] == [
        "RDMADEV_DEVICE", "RDMADEV_PORT", "RDMADEV_GID_INDEX", "RDMADEV_ACK_TIMEOUT"]


@pytest.mark.parametrize("var, value, what", [
    ("RDMADEV_PORT", "abc", r"not an integer in \[1, 255\]"),
    ("RDMADEV_PORT", "0", r"not an integer in \[1, 255\]"),
    ("RDMADEV_GID_INDEX", "70000", r"not an integer in \[0, 65535\]"),
    ("RDMADEV_GID_INDEX", "-2", r"not an integer in \[0, 65535\]"),
    # 0 is "wait forever" to the NIC; past 18 a write may outlive the late-write grace.
    ("RDMADEV_ACK_TIMEOUT", "0", r"not an integer in \[1, 18\]"),
    ("RDMADEV_ACK_TIMEOUT", "19", r"not an integer in \[1, 18\]"),
])
def test_bad_fabric_variable_reaches_the_verbs_validation_and_names_the_variable(var, value, what):
    # Config reads the text; the verbs fabric's parser judges it (even when only tcp opens:
    # every registered fabric checks its options), and the error names the variable.
    # fabric_report (what `rdmadev doctor` shows) lists verbs as not viable for that reason.
    env = {var: value, "RDMADEV_SECRET": "k"}
    for fabric in ("tcp", "auto", "verbs"):
        cfg = rdmadev.Config.from_env({**env, "RDMADEV_FABRIC": fabric})
        with pytest.raises(rdmadev.ConfigError) as e:
            rdmadev.open_domain("x", cfg)
        text = str(e.value)
        assert text.startswith(f"{var}={value!r} is invalid"), text
        assert re.search(what, text) and f"Fix: set {var} to an integer" in text, text
    report = {name: (ok, why) for name, ok, why in rdmadev.fabric_report(cfg)}
    assert report["verbs"][0] is False and report["verbs"][1].startswith(f"{var}={value!r}")


def test_unknown_fabric_option_names_the_key_and_the_known_ones():
    with pytest.raises(rdmadev.ConfigError, match="unknown option 'verbs.colour'") as e:
        rdmadev.Domain("x", ["shm"], fabric_options={"verbs.colour": "blue"})
    assert "verbs.device, verbs.port, verbs.gid_index, verbs.ack_timeout" in str(e.value)
    with pytest.raises(rdmadev.ConfigError, match="the shm fabric takes no options"):
        rdmadev.Domain("x", ["shm"], fabric_options={"shm.size": "1"})
    with pytest.raises(rdmadev.ConfigError, match="option 'ib.device' names no fabric"):
        rdmadev.Domain("x", ["shm"], fabric_options={"ib.device": "mlx5_0"})


def test_valid_options_of_an_unopened_fabric_are_accepted():
    opts = {"verbs.device": "rxe0", "verbs.port": "1", "verbs.gid_index": "0",
            "verbs.ack_timeout": "18"}
    with rdmadev.Domain("x", ["shm"], fabric_options=opts) as dom:
        assert dom.fabrics == ["shm"]


def test_the_native_core_reads_no_environment():
    for folder, _, files in os.walk(CORE):
        for f in files:
            text = open(os.path.join(folder, f)).read()
            assert "getenv" not in text, f"{f} reads the environment; rdmadev.Config does that"
