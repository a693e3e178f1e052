"""Both guests' part of the two-guest tier (run by two_guests.sh through run-two-vms.sh, which
runs it in guest a and in guest b; RDMADEV_GUEST says which).

Guest b serves, guest a tests:

- b starts, for each fabric of CLUSTER_PORTS, ps:0 and worker:0 of a cluster whose worker:1
  is in guest a (tests/control_task.py: rdmadev's runtime and control plane, no TF), and a
  peer service: each connection to PEER_PORT gets a process of its own with a Domain on the
  fabric the connection names, running tests/remote_ops.py's calls as tests/remote.py's
  RemotePeer does (the same protocol, over the wire instead of a pipe). Then it writes
  "b.ready" in RDMADEV_GUESTS_DIR and runs until a writes "a.done" (or DONE_TIMEOUT_S).
- a waits for "b.ready", runs pytest on tests/softroce/across_guests.py (every test's other
  end is in b), writes "a.done" and exits with pytest's status.

b exits nonzero when a task it started died before a was done.
"""
import json
import os
import multiprocessing
import subprocess
import sys
import threading
import time
from multiprocessing.connection import Listener

HERE = os.path.dirname(os.path.abspath(__file__))
TESTS = os.path.dirname(HERE)
sys.path.insert(0, TESTS)

SECRET = b"rdmadev-test-cluster-secret"   # conftest.SECRET: the fixtures' `secret`
CONTROL_SECRET = "rdmadev-channel-setup-secret"   # test_channel_setup.SECRET
A, B = "10.9.8.1", "10.9.8.2"   # run-two-vms.sh's guests
# Each guest has a network stack of its own: these ports are free there whatever the host runs.
PEER_PORT = 23100
CLUSTER_PORTS = {"verbs": (23000, 23001, 23002), "tcp": (23010, 23011, 23012)}
# A task in the guest (one emulated vCPU) imports rdmadev and numpy in 10-40 s.
READY_TIMEOUT_S = 300
DONE_TIMEOUT_S = 1500


def cluster_spec(fabric):
    """ps:0 and worker:0 in guest b, worker:1 (the test process) in guest a."""
    ps, w0, w1 = CLUSTER_PORTS[fabric]
    return {"ps": [f"{B}:{ps}"], "worker": [f"{B}:{w0}", f"{A}:{w1}"]}


def _mark(name):
    return os.path.join(os.environ["RDMADEV_GUESTS_DIR"], name)


def _wait_for(path, timeout):
    end = time.monotonic() + timeout
    while not os.path.exists(path):
        if time.monotonic() > end:
            return False
        time.sleep(0.5)
    return True


def _serve_peer(conn):
    """One peer: a Domain on the fabric the connection asks for, driven by remote_ops."""
    import remote
    try:
        name, fabric = conn.recv()
        remote._main(conn, name, fabric, SECRET, f"{B}:0", None)
    except (EOFError, OSError):
        pass  # the test end closed the connection: a killed peer


def _peers(listener):
    """Accepts peer connections for good (a daemon thread): a forked process for each, which
    starts with rdmadev imported (serve() imported it before any thread or Domain)."""
    fork = multiprocessing.get_context("fork")
    while True:
        conn = listener.accept()
        fork.Process(target=_serve_peer, args=(conn,), daemon=True).start()
        conn.close()
        multiprocessing.active_children()  # reaps the peers that ended


def _start_task(fabric, job, index):
    env = {**os.environ, "RDMADEV_SECRET": CONTROL_SECRET, "RDMADEV_DEADLINE_S": "60",
           "RDMADEV_FABRIC": fabric,
           "PYTHONPATH": os.pathsep.join([os.path.dirname(TESTS), TESTS, os.environ.get("PYTHONPATH", "")])}
    return subprocess.Popen([sys.executable, os.path.join(TESTS, "control_task.py"), "--cluster",
                             json.dumps(cluster_spec(fabric)), "--job", job, "--task", str(index)],
                            env=env, stdout=subprocess.PIPE, text=True)


def serve():
    import remote  # noqa: F401  (imported once here: each forked peer starts with it loaded)
    import remote_ops  # noqa: F401
    listener = Listener((B, PEER_PORT), authkey=SECRET)
    threading.Thread(target=_peers, args=(listener,), daemon=True).start()
    tasks = {(f, job): _start_task(f, job, 0) for f in CLUSTER_PORTS for job in ("ps", "worker")}
    try:
        for name, proc in tasks.items():
            line = proc.stdout.readline()   # the task's first line, or "" if it died
            if "CONTROL_TASK_READY" not in line:
                print(f"guest b: {name} did not start: {line!r}", flush=True)
                return 1
        open(_mark("b.ready"), "w").close()
        if not _wait_for(_mark("a.done"), DONE_TIMEOUT_S):
            print(f"guest b: guest a was not done within {DONE_TIMEOUT_S} s", flush=True)
            return 1
        died = {name: p.returncode for name, p in tasks.items() if p.poll() is not None}
        if died:
            print(f"guest b: tasks died while guest a tested: {died}", flush=True)
        return 1 if died else 0
    finally:
        for p in tasks.values():
            p.kill()
            p.wait(30)


def test(pytest_args):
    if not _wait_for(_mark("b.ready"), READY_TIMEOUT_S):
        print(f"guest a: guest b was not ready within {READY_TIMEOUT_S} s", flush=True)
        return 1
    try:
        return subprocess.call([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                                os.path.join(HERE, "across_guests.py"), *pytest_args])
    finally:
        open(_mark("a.done"), "w").close()


if __name__ == "__main__":
    guest = os.environ.get("RDMADEV_GUEST")
    if guest not in ("a", "b"):
        sys.exit("run this through tests/softroce/two_guests.sh (run-two-vms.sh sets RDMADEV_GUEST)")
    sys.exit(serve() if guest == "b" else test(sys.argv[1:]))
