"""Channel lifetimes on a real loopback cluster of `rdmadev serve` tasks (1 ps, 2 workers):
an instantiation's regions, credits and channels are freed once TF drops it, so churning
through functions does not grow any task's registered memory, fds or memfd mappings; and a
step that fails mid-way (an op fails on one task while others wait or send) leaves the
channels in step for the next ones."""
import json
import os
import subprocess
import sys
import time

import pytest

from held import other_fds
from rdmadev import Config
from rdmadev.cluster import runtime
from rdmadev.testing import launch

pytestmark = pytest.mark.tf

HERE = os.path.dirname(os.path.abspath(__file__))
ENV = {"RDMADEV_SECRET": "rdmadev-lifecycle-secret", "RDMADEV_DEADLINE_S": "60"}
#: A coordinator process: TF import, 200 traces and instantiations, on a loaded 2-core box.
DRIVER_TIMEOUT_S = 1200


@pytest.fixture(scope="module")
def cluster():
    with launch.Cluster(num_ps=1, num_workers=2, env=ENV) as c:
        yield c


def run(cluster, *args, env=None):
    proc = subprocess.run([sys.executable, os.path.join(HERE, "e2e", "lifecycle_driver.py"),
                           json.dumps(cluster.spec), *map(str, args)],
                          capture_output=True, text=True, timeout=DRIVER_TIMEOUT_S,
                          env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2", **ENV, **(env or {})})
    lines = [l for l in proc.stdout.splitlines() if l.startswith("RESULT ")]
    assert proc.returncode == 0 and lines, (proc.stdout + proc.stderr)[-4000:]
    return json.loads(lines[-1][len("RESULT "):])


def _of(counters, what):
    return other_fds(counters) if what == "other_fds" else counters[what]


def test_200_dropped_functions_leave_nothing_behind(cluster):
    r = run(cluster, "churn", 200)
    assert r["wrong"] == []
    assert r["tracked"]["live"] == 0 and r["tracked"]["released"] >= 201
    for task, end in r["end"].items():
        start, one = r["start"][task], r["one"][task]
        assert one["channels"] > 0 and one["registered_bytes"] > 0, (task, one)  # it did swap
        assert end["channels"] == start["channels"] == 0, (task, start, end)
        assert end["regions"] == start["regions"], (task, start, end)
        assert end["registered_bytes"] == start["registered_bytes"], (task, start, end)
        # One instantiation's worth of slack (of which the first also opened the endpoints).
        # Control connections are judged apart: a link to a peer task (links.py) may come
        # after `one`, and the coordinators' connections come and go with them.
        for what in ("other_fds", "memfd_maps"):
            worth = max(0, _of(one, what) - _of(start, what))
            assert _of(end, what) <= _of(start, what) + worth, \
                (task, what, _of(start, what), _of(one, what), _of(end, what))
        # One link per peer task, the coordinator's connection and the heartbeat socket;
        # never one per function.
        control = end["control_connections"]
        assert control["links"] <= len(r["end"]) - 1 and control["served"] <= 2 and \
            control["heartbeats"] == 1, (task, control)
        assert end["memfd_maps"] == 0, (task, end)
        assert end["transfers"] - start["transfers"] >= 200 * 2, (task, start, end)


def test_a_step_dropped_by_the_frame_that_scheduled_it_is_gone_at_once(cluster):
    """Telling which TF function an instantiation belongs to must not keep anything alive: it
    once read the locals of every frame on the planning thread (frame.f_locals), whose
    snapshot kept the coordinator's dropped step alive until that frame returned, its
    channels held and TF logging "Failed to remove function remotely" at exit."""
    r = run(cluster, "dropped")
    assert r == {"dropped": True, "w": 2.0}, r


def test_steps_after_failed_steps_match_grpc_bit_for_bit(cluster):
    grpc = run(cluster, "cancel", "grpc")
    # A short plan deadline: a receive whose sender's task failed waits at most this long.
    rdma = run(cluster, "cancel", "rdmadev", env={"RDMADEV_DEADLINE_S": "10"})
    assert "transfers swapped" in rdma["report"]
    ok = [e is None for e in rdma["errors"]]
    assert ok == [e is None for e in grpc["errors"]] == [True, True, False, False, False, True,
                                                         False], (rdma["errors"], grpc["errors"])
    assert rdma["before"] == grpc["before"]  # the steps between failures, too
    assert rdma["losses"] == grpc["losses"]
    assert rdma["w"] == grpc["w"] and rdma["b"] == grpc["b"]
    counters = rdma["counters"].values()
    assert sum(c["abandoned"] for c in counters) > 0  # receives did give up mid-step


def test_a_coordinator_that_exits_releases_its_scheduled_steps_for_the_next_one(cluster):
    # ParameterServerStrategy: the workers planned the step (in TF threads); the coordinator
    # exits normally with the step still alive and tells them to release it
    first = run(cluster, "pss")
    second = run(cluster, "pss")
    workers = ["/job:worker/replica:0/task:0", "/job:worker/replica:0/task:1"]
    for r in (first, second):
        assert r["swapped"] == workers, r
        assert all(r["holding"][t]["channels"] > r["before"][t]["channels"] for t in workers)
    for task, held in second["before"].items():
        for what in ("channels", "regions", "registered_bytes", "memfd_maps"):
            assert held[what] == first["before"][task][what], (task, what, first, second)


def test_a_killed_coordinator_s_scheduled_steps_are_released_on_every_task(cluster):
    # kill -9: the coordinator never asks for release_function, but the control connections
    # it told the tasks it owns the step on (own_function) close with it.
    driver = subprocess.Popen([sys.executable, os.path.join(HERE, "e2e", "lifecycle_driver.py"),
                               json.dumps(cluster.spec), "pss", "killed"], stdout=subprocess.PIPE,
                              text=True, env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2", **ENV})
    try:
        line = next((l for l in driver.stdout if l.startswith("RESULT ")), None)
        assert line is not None, "the driver ended before its result"
        r = json.loads(line[len("RESULT "):])
        workers = ["/job:worker/replica:0/task:0", "/job:worker/replica:0/task:1"]
        assert r["swapped"] == workers, r
    finally:
        driver.kill()
        driver.wait(60)
    rt = runtime.Runtime(cluster.spec, config=Config(secret=ENV["RDMADEV_SECRET"].encode()))
    held = ("channels", "regions", "registered_bytes", "memfd_maps")
    now = lambda: {t: {k: rt.call(t, {"op": "counters"})[k] for k in held} for t in r["before"]}
    want = {t: {k: c[k] for k in held} for t, c in r["before"].items()}
    try:
        deadline = time.monotonic() + 60  # releases take milliseconds once the sockets close
        while now() != want and time.monotonic() < deadline:
            time.sleep(0.2)
        assert now() == want, (r["holding"], now())
    finally:
        rt.close()
