"""rdmadev.testing.launch: its port picks (below the kernel's ephemeral range, with the task's
control port, so that no bind of port 0, a task's own rdmadev listeners or any outgoing
connection, can take one before the task binds it), and a task that exits while its cluster
runs named on stderr."""
import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time

from rdmadev.cluster.control import control_address
from rdmadev.testing import launch


def test_free_ports_are_distinct_bindable_and_below_the_ephemeral_range():
    floor = launch.ephemeral_floor()
    ports = launch.free_ports(40)
    controls = [control_address(f"{launch.HOST}:{p}")[1] for p in ports]
    assert len(set(ports + controls)) == 2 * len(ports)
    if floor > launch.PORT_FLOOR:  # Linux's default range starts at 32768
        assert all(launch.PORT_FLOOR <= p < floor for p in ports + controls), (floor, ports)
    ephemeral = socket.socket()
    ephemeral.bind((launch.HOST, 0))
    try:
        assert ephemeral.getsockname()[1] not in ports + controls
        for p in ports + controls:
            with socket.socket() as s:
                s.bind((launch.HOST, p))
    finally:
        ephemeral.close()


#: A task that listens at its address, then exits with code 3 once told (a file appears).
_EXITS_WHEN_TOLD = """
import os, socket, sys, time
host, port = sys.argv[1].rsplit(":", 1)
s = socket.create_server((host, int(port)))
deadline = time.monotonic() + 120
while not os.path.exists(sys.argv[2]) and time.monotonic() < deadline:
    time.sleep(0.05)
print("the reason it gave up", flush=True)
sys.exit(3)
"""


def test_a_task_that_exits_while_the_cluster_runs_is_named_with_its_log(tmp_path, capfd):
    """TF waits for a lost task, so a job whose task died would hang with no word of why:
    the cluster says which task exited, its code and its log; a task ended by kill() is not
    reported."""
    told = tmp_path / "exit-now"
    spec = {"ps": [f"{launch.HOST}:{p}" for p in launch.free_ports(2)]}

    def launcher(job, index, _):
        return [sys.executable, "-c", _EXITS_WHEN_TOLD, spec[job][index], str(told)]

    with launch.Cluster(spec=spec, launcher=launcher) as cluster:
        cluster.kill("ps", 1)
        told.touch()
        said = ""
        deadline = time.monotonic() + 60
        while "exited with code 3" not in said and time.monotonic() < deadline:
            time.sleep(0.1)
            said += capfd.readouterr().err
    assert "TF task ps:0" in said and "exited with code 3 while the cluster runs" in said, said
    assert "the reason it gave up" in said and "ps:1" not in said, said


#: A coordinator: starts a Cluster of tasks that only listen, prints their pids, then waits to
#: be killed without stopping them.
_COORDINATOR = """
import json, sys, time
from rdmadev.testing import launch
spec = json.loads(sys.argv[1])
def launcher(job, index, _):
    return [sys.executable, "-c", "import socket, sys, time; host, port = sys.argv[1].rsplit(':', 1); "
            "s = socket.create_server((host, int(port))); time.sleep(300)", spec[job][index]]
cluster = launch.Cluster(spec=spec, launcher=launcher).start()
print(json.dumps([cluster.pid(job, i) for job, i, _ in cluster.tasks()]), flush=True)
time.sleep(300)
"""


def _running(pid):
    """True while ``pid`` runs (a zombie has exited: its parent just has not waited for it)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def test_the_tasks_of_a_coordinator_killed_without_stopping_them_are_ended():
    """The tasks run in sessions of their own and `rdmadev serve` serves until killed: a
    coordinator killed by SIGKILL (or the OOM killer) used to leave them running, holding their
    ports, for good. Its reaper ends them."""
    spec = {"ps": [f"{launch.HOST}:{p}" for p in launch.free_ports(2)]}
    coordinator = subprocess.Popen([sys.executable, "-c", _COORDINATOR, json.dumps(spec)],
                                   stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    pids = []
    try:
        pids = json.loads(coordinator.stdout.readline() or "[]")
        assert len(pids) == 2 and all(_running(p) for p in pids), coordinator.stderr.read()
        coordinator.kill()
        coordinator.wait(timeout=30)
        deadline = time.monotonic() + 60  # a SIGTERM ends these at once; SIGKILL after 10 s
        while any(_running(p) for p in pids) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not any(_running(p) for p in pids), f"tasks {pids} outlived their coordinator"
        assert "exited without stopping them" in coordinator.stderr.read()
    finally:
        coordinator.kill()
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pid, signal.SIGKILL)


def test_a_stopped_cluster_leaves_no_reaper_and_a_killed_task_is_not_ended_again(tmp_path):
    """stop() ends the reaper with the tasks; kill() takes a task off its list."""
    spec = {"ps": [f"{launch.HOST}:{p}" for p in launch.free_ports(1)]}

    def launcher(job, index, _):
        return [sys.executable, "-c", _EXITS_WHEN_TOLD, spec[job][index], str(tmp_path / "never")]

    cluster = launch.Cluster(spec=spec, launcher=launcher).start()
    reaper = cluster._reaper
    assert reaper.poll() is None
    cluster.kill("ps", 0)
    cluster.stop()
    assert reaper.returncode == 0 and cluster._reaper is None
