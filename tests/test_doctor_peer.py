"""`rdmadev doctor --peer HOST:PORT`: every failure it names, produced for real and read from
its printed report, the way a user runs it (`python -m rdmadev doctor --peer ...`).

The peers are real tasks: an `rdmadev serve` task on loopback (launch.Cluster), and, as
"another host", a task of tests/control_task.py (the real Runtime and its control service,
without TensorFlow, which would cost 7 s more to start) in a network namespace and a pid
namespace of its own, joined to the doctor's namespace by a veth pair. Its own pid
namespace is what another host has too: with a network namespace alone the two ends share a
kernel and a pid namespace, and the pair uses (and can use) shm.

The verbs comparisons (link layer, GID type, MTU, memlock) need two RDMA ports, which this
machine does not have: check_verbs and check_memlock are plain functions over the two sides'
facts, tested here with facts gathered on this host (and a verbs port as a Soft-RoCE guest
reports it) with values altered. test_verbs_pair_in_a_soft_roce_guest runs them for real
where verbs is viable.
"""
import json
import os
import re
import select
import socket
import subprocess
import sys
import tempfile
import time

import pytest

import netns
import rdmadev
from rdmadev import config
from rdmadev.cluster import facts
from rdmadev.cluster.control import control_address
from rdmadev.testing import launch
from rdmadev.tools import doctor_peer

HERE = os.path.dirname(os.path.abspath(__file__))
#: The cluster secret of this module's tasks (not conftest's: under pytest-xdist another
#: directory's conftest module may be the one `import conftest` finds).
SECRET = b"rdmadev-doctor-peer-secret"
#: Seconds a doctor run may take: ~0.4 s here, its own timeouts at most a few.
DOCTOR_TIMEOUT_S = 60


def doctor(peer, *args, ns=None, **env):
    """(exit status, stdout) of `rdmadev doctor --peer peer *args`, in namespace `ns`, with
    the cluster secret and RDMADEV_FABRIC=auto unless `env` says otherwise."""
    full = {**os.environ, "RDMADEV_SECRET": SECRET.decode(), "RDMADEV_FABRIC": "auto", **env}
    cmd = [sys.executable, "-m", "rdmadev", "doctor", "--peer", peer, *args]
    done = subprocess.run((["ip", "netns", "exec", ns] if ns else []) + cmd, env=full,
                          capture_output=True, text=True, timeout=DOCTOR_TIMEOUT_S)
    assert not done.stderr, done.stderr  # quiet: the report is all it prints
    return done.returncode, done.stdout


def control_port(port):
    """The control port of a task at TF port `port`, as the doctor derives it."""
    return control_address(f"127.0.0.1:{port}")[1]


def line(report, check):
    """The report's line of `check` ("  secret    : ok: ..."), without its padding."""
    found = re.search(rf"^  {check} +: (.*)$", report, re.M)
    assert found, f"no {check} line in:\n{report}"
    return found.group(1)


# --- loopback: an `rdmadev serve` task on this host ---

@pytest.fixture(scope="module")
def served():
    """The TF address of an `rdmadev serve` task (ps:0) on 127.0.0.1."""
    with launch.Cluster(num_ps=1, num_workers=0,
                        env={"RDMADEV_SECRET": SECRET.decode(), "RDMADEV_FABRIC": "auto"}) as c:
        yield c.spec["ps"][0]


@pytest.mark.tf
def test_a_task_on_this_host_is_healthy_and_the_pair_uses_shm(served):
    status, report = doctor(served)
    assert status == 0, report
    host, port = served.rsplit(":", 1)
    assert f"(its control service: {host}:{control_port(int(port))})" in report
    for check in ("resolved", "reachable", "secret", "version"):
        assert line(report, check).startswith("ok: "), report
    assert line(report, "fabric").startswith("ok: the pair would use shm "), report
    assert line(report, "connects").startswith("ok: a shm endpoint to the peer"), report
    # `rdmadev serve` without RDMADEV_AUTO: a plain-TF coordinator's steps would stay on gRPC
    assert line(report, "rewrites").startswith(
        "warning: only the functions rdmadev.optimize marks"), report
    assert "RDMADEV_AUTO=1" in report
    assert report.rstrip().endswith("the pair is healthy")


@pytest.mark.tf
def test_json_says_the_same_as_data(served):
    status, out = doctor(served, "--json")
    report = json.loads(out)
    assert status == 0 and report["healthy"] and report["fabric"] == "shm"
    statuses = {c["name"]: c["status"] for c in report["checks"]}
    assert [statuses[c] for c in ("resolved", "reachable", "secret", "version", "fabric",
                                  "connects")] == ["ok"] * 6, statuses
    assert "verbs" in statuses and "memlock" in statuses
    theirs = report["peer_facts"]
    assert theirs["task"] == "/job:ps/replica:0/task:0"
    assert theirs["rdmadev"] == rdmadev.__version__
    assert [f["fabric"] for f in theirs["fabrics"]] == [n for n, _, _ in rdmadev.fabric_report()]
    # one kernel and pid namespace: the shm reach of both ends starts with the same key
    key = lambda side: facts.reach(side["address"], "shm").rsplit(":", 1)[0]
    assert key(theirs) == key(report["here"])


@pytest.mark.tf
def test_a_wrong_secret_is_named_apart_from_unreachable(served):
    status, report = doctor(served, RDMADEV_SECRET="not-the-cluster-secret")
    assert status == 1
    assert line(report, "reachable").startswith("ok: "), report
    assert line(report, "secret").startswith(
        "PROBLEM: the control service at 127.0.0.1:"), report
    assert "rejected this RDMADEV_SECRET: the task's secret differs" in report
    assert "fix: set the same RDMADEV_SECRET" in report
    assert not re.search(r"^  fabric", report, re.M)  # nothing judged without its facts


def test_no_task_listening_at_that_port():
    port = launch.free_ports(1)[0]
    status, report = doctor(f"127.0.0.1:{port}")
    assert status == 1
    assert line(report, "reachable") == (f"PROBLEM: 127.0.0.1:{control_port(port)}: connection "
                                         "refused: no process listens there"), report
    assert "fix: start the task with `rdmadev serve`" in report
    assert "TF port + RDMADEV_CONTROL_PORT_OFFSET" in report
    assert line(report, "secret") == "skipped: not reachable"


def test_something_else_at_the_control_port_is_not_a_control_service():
    """A port that accepts but never speaks rdmadev's handshake (the control port given
    where the TF port was due lands on another service like this)."""
    port = launch.free_ports(1)[0]
    with socket.create_server(("127.0.0.1", control_port(port))):
        status, report = doctor(f"127.0.0.1:{port}", "--timeout", "1")
    assert status == 1
    assert line(report, "reachable").startswith("ok: "), report
    assert line(report, "secret").startswith(
        f"PROBLEM: what listens at 127.0.0.1:{control_port(port)} is not an rdmadev control "
        "service"), report
    assert "pass the task's TF port" in report


def test_no_secret_here():
    status, report = doctor("127.0.0.1:2222", RDMADEV_SECRET="")
    assert status == 1
    assert line(report, "secret") == ("PROBLEM: RDMADEV_SECRET is not set here, so no task can "
                                      "authenticate this host")


def test_an_address_that_is_not_host_port():
    status, report = doctor("ps0-without-a-port")
    assert status == 1
    assert line(report, "configuration") == "PROBLEM: --peer 'ps0-without-a-port' is not HOST:PORT"


# --- another host: a task in a network and pid namespace of its own ---

class Hosts:
    """Namespace A (the doctor's) and B (the task's), joined by a veth pair."""

    def __init__(self, net, peer):
        self.net, self.peer = net, peer
        self.doctor_ns, self.task_ns = net.names

    def nft(self, ns, script):
        subprocess.run(["ip", "netns", "exec", ns, "nft", "-f", "-"], input=script, text=True,
                       check=True, capture_output=True, timeout=30)


def _start_task(net, port, log):
    """tests/control_task.py as ps:0 at SUBNET.2:port, in namespace B and a new pid namespace
    (unshare --kill-child: it dies with the unshare process the test kills)."""
    spec = json.dumps({"ps": [f"{net.addresses[1]}:{port}"]})
    proc = subprocess.Popen(
        ["ip", "netns", "exec", net.names[1], "unshare", "--pid", "--fork", "--kill-child",
         sys.executable, os.path.join(HERE, "control_task.py"), "--cluster", spec, "--job",
         "ps", "--task", "0"],
        env=dict(os.environ, RDMADEV_SECRET=SECRET.decode(), RDMADEV_FABRIC="auto"),
        stdout=subprocess.PIPE, stderr=log, text=True)
    ready, _, _ = select.select([proc.stdout], [], [], 60)
    if not ready or "CONTROL_TASK_READY" not in proc.stdout.readline():
        proc.kill()
        proc.wait(10)
        log.seek(0)
        pytest.fail(f"the task in {net.names[1]} did not start: {log.read()[-3000:]}")
    return proc


@pytest.fixture(scope="module")
def hosts():
    netns.require("nft", "unshare")
    port = launch.free_ports(1)[0]
    with netns.VethPair(f"rdd{os.getpid() % 10000}-") as net, \
            tempfile.TemporaryFile("w+") as log:
        proc = _start_task(net, port, log)
        try:
            yield Hosts(net, f"{net.addresses[1]}:{port}")
        finally:
            proc.kill()
            proc.wait(10)


@pytest.mark.netns
def test_across_hosts_the_pair_uses_tcp_never_shm(hosts):
    status, report = doctor(hosts.peer, ns=hosts.doctor_ns)
    assert status == 0, report
    fabric = line(report, "fabric")
    assert fabric.startswith("ok: the pair would use tcp (here shm, tcp"), report
    assert "shm not between these two: it needs one kernel and pid namespace" in fabric
    assert line(report, "connects").startswith(
        f"ok: a tcp endpoint to the peer ({hosts.net.addresses[1]}:"), report
    assert line(report, "rewrites").startswith("skipped: the peer has no partition pass"), report


@pytest.mark.netns
def test_no_fabric_both_ends_can_use(hosts):
    """shm alone here, and the task on another host: nothing the pair can use."""
    status, report = doctor(hosts.peer, ns=hosts.doctor_ns, RDMADEV_FABRIC="shm")
    assert status == 1
    assert line(report, "fabric").startswith(
        "PROBLEM: no fabric the pair can use: here shm, at the peer shm, tcp: "), report
    assert "between hosts that is tcp or verbs" in report


@pytest.mark.netns
def test_a_name_that_does_not_resolve(hosts):
    """.invalid never resolves (RFC 6761); in namespace A no resolver is reachable either,
    so the lookup fails at once."""
    status, report = doctor(f"ps0.rdmadev.invalid:{hosts.peer.rsplit(':')[1]}",
                            ns=hosts.doctor_ns)
    assert status == 1
    assert line(report, "resolved").startswith(
        "PROBLEM: DNS: cannot resolve 'ps0.rdmadev.invalid': "), report
    assert "or add ps0.rdmadev.invalid to DNS or /etc/hosts" in report


@pytest.mark.netns
def test_a_peer_with_no_route_to_it(hosts):
    """The doctor's link down: its namespace has no route to the task's network."""
    dev = f"{hosts.doctor_ns}v"
    set_link = lambda state: subprocess.run(
        ["ip", "netns", "exec", hosts.doctor_ns, "ip", "link", "set", dev, state], check=True,
        capture_output=True, timeout=30)
    set_link("down")
    try:
        status, report = doctor(hosts.peer, ns=hosts.doctor_ns)
    finally:
        set_link("up")
    assert status == 1
    assert line(report, "reachable").endswith(
        ": no route: the network is unreachable from here"), report
    assert "fix: route this host to the peer's network" in report


@pytest.mark.netns
def test_a_firewall_that_drops_the_control_port(hosts):
    host, port = hosts.peer.rsplit(":", 1)
    control = control_port(int(port))
    hosts.nft(hosts.task_ns, "add table inet doctor\n"
                             "add chain inet doctor input { type filter hook input priority 0; }\n"
                             f"add rule inet doctor input tcp dport {control} drop\n")
    try:
        started = time.monotonic()
        status, report = doctor(hosts.peer, "--timeout", "1", ns=hosts.doctor_ns)
        took = time.monotonic() - started
    finally:
        hosts.nft(hosts.task_ns, "delete table inet doctor\n")
    assert status == 1
    assert line(report, "reachable") == (f"PROBLEM: {host}:{control}: timed out after 1 s: "
                                         "nothing answered (a firewall drops the packets, or "
                                         "the host is down)"), report
    assert "let the control port through the firewall" in report
    assert took < 30


@pytest.mark.netns
def test_a_firewall_that_drops_the_fabric_port(hosts):
    """The control port open, every other port dropped, the tcp fabric's own among them
    (the task picked it at start): the doctor finds the pair's data path closed."""
    control = control_port(int(hosts.peer.rsplit(":", 1)[1]))
    hosts.nft(hosts.task_ns, "add table inet doctor\n"
                             "add chain inet doctor input { type filter hook input priority 0; }\n"
                             f"add rule inet doctor input tcp dport != {control} drop\n")
    try:
        status, out = doctor(hosts.peer, "--timeout", "1", "--json", ns=hosts.doctor_ns)
    finally:
        hosts.nft(hosts.task_ns, "delete table inet doctor\n")
    report = json.loads(out)
    tcp = facts.reach(report["peer_facts"]["address"], "tcp")
    checks = {c["name"]: c for c in report["checks"]}
    assert status == 1 and not report["healthy"] and report["fabric"] == "tcp"
    assert checks["connects"]["status"] == "problem", checks
    assert checks["connects"]["detail"].startswith(f"tcp to the peer's {tcp} failed: "), checks
    assert "a firewall must pass that range" in checks["connects"]["fix"]


# --- the comparisons, as functions of both sides' facts ---

@pytest.fixture(scope="module")
def here():
    """facts() of this host, with a verbs port as a Soft-RoCE guest's facts give it (none
    here)."""
    config = rdmadev.Config(secret=SECRET)
    with rdmadev.open_domain("test:facts", config) as dom:
        mine = facts.facts(config, dom)
    mine["verbs"] = {"device": "rxe0", "port": 1, "gid_index": 1, "gid": "::ffff:10.9.9.1",
                     "link_layer": "Ethernet", "gid_type": "RoCE v2", "netdev": "eth0",
                     "netdev_mtu": 1500, "active_mtu": 1024}
    return mine


def altered(facts, **verbs):
    out = json.loads(json.dumps(facts))
    out["verbs"].update(verbs)
    return out


def test_what_the_peers_pass_rewrites_is_said(here):
    """Each of the pass's modes as a task would report it (the served task above shows the
    default one, and the control-plane task the absent pass, for real)."""
    said = {mode: doctor_peer.check_rewrites({**here, "pass_mode": mode})
            for mode in ("all", "marked", "off", None)}
    assert said["all"].status == "ok"
    assert said["marked"].status == "warning" and "RDMADEV_AUTO=1" in said["marked"].fix
    assert said["off"].status == "warning" and "RDMADEV_ENABLED" in said["off"].fix
    assert said[None].status == "skipped"


def test_versions_are_compared(here):
    assert doctor_peer.check_version(here, here).status == "ok"
    other = dict(here, rdmadev="0.0.9")
    check = doctor_peer.check_version(here, other)
    assert check.status == "problem"
    assert "the peer rdmadev 0.0.9 built against" in check.detail
    assert "install the same rdmadev" in check.fix


def test_verbs_ports_of_one_kind_agree(here):
    checks = doctor_peer.check_verbs(here["verbs"], here["verbs"])
    assert [(c.name, c.status) for c in checks] == [("verbs", "ok"), ("mtu", "ok")]
    assert checks[0].detail.startswith("Ethernet, RoCE v2 on both")
    assert checks[1].detail == "active MTU 1024 on both"


def test_infiniband_against_roce_is_a_problem(here):
    ib = altered(here, link_layer="InfiniBand", gid_type="IB")
    check = doctor_peer.check_verbs(here["verbs"], ib["verbs"])[0]
    assert check.status == "problem"
    assert check.detail.startswith("link layers differ: Ethernet here, InfiniBand at the peer")
    assert "RDMADEV_DEVICE" in check.fix


def test_roce_v1_against_v2_is_a_problem(here):
    v1 = altered(here, gid_type="IB/RoCE v1", gid_index=0)
    check = doctor_peer.check_verbs(here["verbs"], v1["verbs"])[0]
    assert check.status == "problem"
    assert check.detail.startswith("GID types differ: RoCE v2 here, IB/RoCE v1 at the peer")
    assert "RDMADEV_GID_INDEX" in check.fix


def test_mtus_that_differ_work_at_the_smaller(here):
    jumbo = altered(here, netdev_mtu=9000, active_mtu=4096)
    mtu = doctor_peer.check_verbs(here["verbs"], jumbo["verbs"])[1]
    assert (mtu.status, mtu.detail) == ("warning", "active MTU 1024 here, 4096 at the peer: the "
                                                   "pair's QPs use the smaller")
    no_pyverbs = altered(here, active_mtu=None, netdev_mtu=9000)  # the netdevs' then
    mtu = doctor_peer.check_verbs(here["verbs"], no_pyverbs["verbs"])[1]
    assert mtu.detail.startswith("netdev MTU 1500 here, 9000 at the peer")


def test_memlock_must_hold_what_a_task_may_register(here):
    locked = dict(here, memlock={"soft": 64 << 10, "hard": 64 << 10, "ipc_lock": False},
                  max_registered_bytes=1 << 30)
    check = doctor_peer.check_memlock(locked, "the peer")
    assert check.status == "problem"
    assert check.detail.startswith("the peer: locked-memory hard limit 64 KiB is below the "
                                   "1.0 GiB a task may register (RDMADEV_MAX_REGISTERED_BYTES) "
                                   "and a verbs peer's 4.0 MiB staging buffer")
    assert "ulimit -l unlimited" in check.fix and "at most" not in check.fix  # raising it only
    assert doctor_peer.check_memlock(dict(locked, memlock={**locked["memlock"], "hard": None}),
                                     "the peer").status == "ok"
    assert doctor_peer.check_memlock(dict(locked, memlock={**locked["memlock"], "ipc_lock": True}),
                                     "the peer").detail.startswith("the peer: CAP_IPC_LOCK")
    # this host's own limits, as gathered: root here has CAP_IPC_LOCK
    assert here["memlock"]["ipc_lock"] == (os.geteuid() == 0)


@pytest.mark.parametrize("hard", [8 << 20, 6 << 20, 1 << 30, 64 << 30])
def test_memlock_holds_the_default_budget_and_not_one_set_above_it(here, hard):
    """The default budget (config.default_max_registered_bytes, for a task without
    CAP_IPC_LOCK on verbs) passes the check by construction; a budget set past the limit less
    a staging buffer fails it, with the largest budget that passes in its fix."""
    memlock = {"soft": hard, "hard": hard, "ipc_lock": False}
    budget = config.default_max_registered_bytes(config.physical_memory(), ("verbs",), hard,
                                                 False)
    check = doctor_peer.check_memlock(dict(here, memlock=memlock, max_registered_bytes=budget),
                                      "this host")
    assert check.status == "ok", check
    peers = (hard - budget) >> 22
    assert check.detail.endswith(f"staging buffers of {peers} verbs peer{'s' * (peers > 1)}")
    fits = hard - config.VERBS_STAGING_BYTES
    assert doctor_peer.check_memlock(dict(here, memlock=memlock, max_registered_bytes=fits),
                                     "this host").status == "ok"
    over = doctor_peer.check_memlock(dict(here, memlock=memlock, max_registered_bytes=fits + 1),
                                     "this host")
    assert over.status == "problem" and f"to at most {fits} there" in over.fix, over


def test_memlock_too_small_for_one_staging_buffer_fails_even_with_the_default(here):
    hard = 64 << 10
    budget = config.default_max_registered_bytes(config.physical_memory(), ("verbs",), hard,
                                                 False)
    check = doctor_peer.check_memlock(
        dict(here, memlock={"soft": hard, "hard": hard, "ipc_lock": False},
             max_registered_bytes=budget), "the peer")
    assert check.status == "problem" and "is below the 4 KiB a task may register" in check.detail


def test_verbs_pair_in_a_soft_roce_guest():
    """Where verbs is viable (the Soft-RoCE guest), a task and the doctor on verbs: the
    port's facts come from sysfs on both ends and agree."""
    if "verbs" not in rdmadev.viable_fabrics():
        if os.environ.get("RDMADEV_REQUIRE_VERBS") == "1":
            pytest.fail("verbs is not viable, and RDMADEV_REQUIRE_VERBS=1 says it must be")
        pytest.skip("verbs is not viable here (`rdmadev doctor` says why)")
    port = launch.free_ports(1)[0]
    spec = json.dumps({"ps": [f"127.0.0.1:{port}"]})
    with tempfile.TemporaryFile("w+") as log:
        proc = subprocess.Popen(
            [sys.executable, os.path.join(HERE, "control_task.py"), "--cluster", spec, "--job",
             "ps", "--task", "0"], env=dict(os.environ, RDMADEV_SECRET=SECRET.decode()),
            stdout=subprocess.PIPE, stderr=log, text=True)
        try:
            ready, _, _ = select.select([proc.stdout], [], [], 300)
            assert ready and "CONTROL_TASK_READY" in proc.stdout.readline()
            status, report = doctor(f"127.0.0.1:{port}", RDMADEV_FABRIC="verbs")
        finally:
            proc.kill()
            proc.wait(10)
    assert status == 0, report
    assert line(report, "fabric").startswith("ok: the pair would use verbs"), report
    assert line(report, "connects").startswith("ok: a verbs endpoint"), report
    assert re.match(r"ok: Ethernet, RoCE v[12] on both", line(report, "verbs")), report
    assert line(report, "mtu").startswith("ok: "), report
