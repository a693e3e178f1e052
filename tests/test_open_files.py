"""The open-file limit (rdmadev/cluster/open_files.py), with real processes and no TF: a task
raises its soft RLIMIT_NOFILE (and RLIMIT_MEMLOCK, limits.py) to the hard one and warns when
its cluster may need more; a
process out of descriptors gets errors that name the limit, from the core (a region's memfd),
from a control connection and from the heartbeats when a ping needs one, and recovers once
descriptors are free; heartbeats by datagram need none.

Each case runs in a child process with its own limits, so the test process keeps its own.
"""
import json
import os
import resource
import subprocess
import sys

import pytest

from rdmadev.cluster import open_files
from rdmadev.testing import launch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import netns  # noqa: E402

ENV = {"RDMADEV_SECRET": "rdmadev-open-files-secret",
       "PYTHONPATH": os.pathsep.join([os.path.dirname(HERE), HERE, os.environ.get("PYTHONPATH", "")])}
#: Seconds a child may take: it imports numpy and rdmadev on a loaded 2-core machine.
CHILD_TIMEOUT_S = 300

#: (soft, hard) RLIMIT_MEMLOCK bytes of the child: 64 KiB, a common default, under this
#: process's hard limit (which it may not raise), or 64 MiB when that is unlimited.
_HARD_MEMLOCK = resource.getrlimit(resource.RLIMIT_MEMLOCK)[1]
MEMLOCK = (64 << 10, 64 << 20 if _HARD_MEMLOCK == resource.RLIM_INFINITY else _HARD_MEMLOCK)

#: Runs argv[2:] as a new program with RLIMIT_NOFILE set to (soft, hard) from argv[1], and
#: RLIMIT_MEMLOCK to MEMLOCK.
WITH_LIMIT = f"""
import os, resource, sys
soft, hard = map(int, sys.argv[1].split(":"))
resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
resource.setrlimit(resource.RLIMIT_MEMLOCK, {MEMLOCK})
os.execv(sys.executable, [sys.executable] + sys.argv[2:])
"""


def limits_of(pid, row="Max open files"):
    """(soft, hard) of process `pid`'s limit on `row` of /proc/PID/limits."""
    with open(f"/proc/{pid}/limits") as f:
        line = next(l for l in f if l.startswith(row))
    soft, hard = line[len(row):].split()[:2]
    return int(soft), int(hard)


@pytest.mark.parametrize("hard, workers, warned", [(8192, 2, False), (1024, 99, True)])
def test_a_task_raises_its_soft_limit_and_warns_when_its_cluster_may_need_more(hard, workers, warned):
    ports = launch.free_ports(1 + workers)  # only ps:0 is started; the spec sizes the need
    spec = {"ps": [f"127.0.0.1:{ports[0]}"], "worker": [f"127.0.0.1:{p}" for p in ports[1:]]}

    def launcher(job, index, _):
        return [sys.executable, "-c", WITH_LIMIT, f"256:{hard}", os.path.join(HERE, "control_task.py"),
                "--cluster", json.dumps(spec), "--job", job, "--task", str(index)]

    with launch.Cluster(spec={"ps": spec["ps"]}, env=ENV, launcher=launcher) as cluster:
        assert limits_of(cluster.pid("ps", 0)) == (hard, hard)
        assert limits_of(cluster.pid("ps", 0), "Max locked memory") == (MEMLOCK[1], MEMLOCK[1])
        log = cluster.log_path("ps", 0).read_text()
    need = open_files.needed(1 + workers)  # every other task and the coordinator
    assert (need > hard) == warned, (need, hard)
    assert ("may run out of file descriptors" in log) == warned, log
    if warned:
        assert (f"its open-file limit is {hard}, and exchanging tensors with the {1 + workers} "
                f"other tasks") in log and f"may take about {need}" in log, log
        assert "LimitNOFILE=" in log, log  # the fix


#: Fills this process's descriptors (soft limit: what is open + 64), then tries what needs one.
OUT_OF_DESCRIPTORS = """
import json, os, resource, socket, sys
import rdmadev
from rdmadev.cluster.control import ControlClient, ControlServer

dom = rdmadev.open_domain("t:0", rdmadev.Config(fabric="tcp", secret=b"k"))
server = ControlServer(("127.0.0.1", 0), b"k", lambda r: {"echo": r})
open_now = len(os.listdir("/proc/self/fd"))
resource.setrlimit(resource.RLIMIT_NOFILE, (open_now + 64, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
fillers = []
try:
    while len(fillers) < 1000:
        fillers.append(os.open(os.devnull, os.O_RDONLY))
except OSError:
    pass
out = {"filled": len(fillers)}
try:
    dom.allocate(4096)
except rdmadev.RdmadevError as e:
    out["region"] = [type(e).__name__, str(e)]
try:
    ControlClient(server.server_address, b"k", timeout=30)
except rdmadev.RdmadevError as e:
    out["control"] = [type(e).__name__, str(e)]
for fd in fillers:
    os.close(fd)
region = dom.allocate(4096)  # descriptors are free again: both work
client = ControlClient(server.server_address, b"k", timeout=30)
out["recovered"] = client.call({"op": "x"}) == {"echo": {"op": "x"}} and region.size == 4096
print("RESULT " + json.dumps(out), flush=True)
"""


def run_child(code, *args):
    proc = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True,
                          timeout=CHILD_TIMEOUT_S, env={**os.environ, **ENV})
    lines = [l for l in proc.stdout.splitlines() if l.startswith("RESULT ")]
    assert proc.returncode == 0 and lines, (proc.stdout + proc.stderr)[-4000:]
    return json.loads(lines[-1][len("RESULT "):]), proc.stderr


def test_out_of_descriptors_errors_name_the_open_file_limit_and_the_fix():
    out, _ = run_child(OUT_OF_DESCRIPTORS)
    assert out["filled"] < 1000, out  # the table did fill
    for what in ("region", "control"):
        kind, text = out[what]
        assert "Too many open files" in text, (what, text)
        assert "open-file limit (RLIMIT_NOFILE, `ulimit -n`)" in text and "LimitNOFILE=" in text, (what, text)
    assert out["region"][0] == "RegionError"
    assert "start every task with" not in out["control"][1]  # the peer is not to blame
    assert out["recovered"], out


#: worker:1 with channels to ps:0 (a control_task process). Out of descriptors, it still hears
#: ps:0: its heartbeats need none (one datagram socket: liveness.py). Then, with datagrams
#: filtered (nftables) and its control link to ps:0 gone, it can ping ps:0 only by dialing a
#: new link, which needs a descriptor: the mark says so.
HEARTBEATS_WITHOUT_DESCRIPTORS = """
import json, os, resource, subprocess, sys, time
from graph_pass.devices import task_name
from rdmadev import Config, _core
from rdmadev.cluster import channels, runtime
from rdmadev.errors import DeadlineExceeded
from rdmadev.testing.timing import wait_until
import control_task
from test_channel_setup import exchange, plan

spec, fabric = json.loads(sys.argv[1]), sys.argv[2]
PS, W1 = task_name("ps", 0), task_name("worker", 1)
WAIT_S = 5.0  # past RDMADEV_LIVENESS_S (1 s) and its ping intervals
runtime.register_handler("t_send", control_task.t_send)
runtime.register_handler("t_recv", control_task.t_recv)
rt = runtime.Runtime(spec, "worker", 1, Config(fabric=fabric, secret=os.environ["RDMADEV_SECRET"].encode(),
                                               deadline_s=120, liveness_s=1.0))
_, swap, regions = plan([(PS, W1)])
channels.open_channels(rt.call, "fds", swap, regions)
into_me = swap[0]
assert wait_until(lambda: rt.heartbeats.heard_by_datagram() == 1, 60)
open_now = len(os.listdir("/proc/self/fd"))
resource.setrlimit(resource.RLIMIT_NOFILE, (open_now + 64, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
fillers = []


def fill():
    try:
        while len(fillers) < 1000:
            fillers.append(os.open(os.devnull, os.O_RDONLY))
    except OSError:
        pass


fill()
out = {"filled": len(fillers), "silent_while_full": []}
until = time.monotonic() + 4.0
while time.monotonic() < until:  # heartbeats need no descriptor: ps:0 stays heard
    out["silent_while_full"] += rt.heartbeats.silent()
    time.sleep(0.05)
for fd in fillers:  # nft needs a few
    os.close(fd)
fillers.clear()
table = "rdmadev_test_fds_%d" % os.getpid()
ports = "%d, %d" % (rt.server.server_address[1], rt._control_address(PS)[1])
subprocess.run(["nft", "-f", "-"], text=True, check=True, capture_output=True, timeout=30,
               input="add table inet %s\\nadd chain inet %s out { type filter hook output priority 0; }\\n"
                     "add rule inet %s out oifname lo udp dport { %s } drop\\n" % (table, table, table, ports))
try:
    peer = rt.heartbeats.peers[PS]
    for attempt in range(10):  # ps:0 may dial a link again before fill() takes its descriptor
        for link in list(rt.links.live.get(PS, ())):
            link.close()  # ps:0 lets go of what this task planned there; the endpoint stays
            link.ended.result(30)  # its descriptor is closed
        fill()  # takes the descriptor the link freed
        if wait_until(lambda: peer.local_failure, 5):
            break
    out["local_failure"], out["attempts"] = peer.local_failure, attempt + 1
    started = time.monotonic()
    try:  # a silent peer does not end the wait (liveness.py): its deadline says why it waited
        _core.channel_recv(into_me.channel_key, timeout=WAIT_S)
    except DeadlineExceeded as e:
        out["error"], out["after_s"] = str(e), time.monotonic() - started
finally:
    for fd in fillers:
        os.close(fd)
    subprocess.run(["nft", "delete", "table", "inet", table], capture_output=True, timeout=30)
out["heard_again"] = wait_until(lambda: rt.table.counters()["silent_peers"] == [], 60)
_, swap, regions = plan([(PS, W1)])
channels.open_channels(rt.call, "fds-again", swap, regions)
out["data_ok"] = exchange(rt, swap[0], 3, seed=5) == []
rt.close()
print("RESULT " + json.dumps(out), flush=True)
"""


@pytest.mark.parametrize("fabric", ["shm", "tcp"])
def test_heartbeats_need_no_descriptor_and_say_so_when_a_ping_needs_one(fabric):
    netns.require("nft")
    ports = launch.free_ports(3)  # worker:0 is never started
    spec = {"ps": [f"127.0.0.1:{ports[0]}"], "worker": [f"127.0.0.1:{p}" for p in ports[1:]]}

    def launcher(job, index, _):
        return [sys.executable, os.path.join(HERE, "control_task.py"), "--cluster", json.dumps(spec),
                "--job", job, "--task", str(index)]

    env = {**ENV, "RDMADEV_FABRIC": fabric, "RDMADEV_LIVENESS_S": "1"}
    with launch.Cluster(spec={"ps": spec["ps"]}, env=env, launcher=launcher):
        out, _ = run_child(HEARTBEATS_WITHOUT_DESCRIPTORS, json.dumps(spec), fabric)
    assert out["filled"] < 1000, out
    assert out["silent_while_full"] == [], out
    assert "Too many open files" in out["local_failure"], out
    assert "silent: no answer to rdmadev heartbeats" in out.get("error", ""), out
    assert "this task could not ping it" in out["error"] and "Too many open files" in out["error"], out
    assert "open-file limit (RLIMIT_NOFILE" in out["error"], out
    assert 4.5 < out["after_s"] < 60, out  # the wait's own deadline (5 s)
    assert out["heard_again"] and out["data_ok"], out
