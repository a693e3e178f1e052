"""Registered memory as a budgeted cache (rdmadev/cluster/evictions.py), on a real loopback
cluster of `rdmadev serve` tasks (1 ps, 2 workers) whose RDMADEV_MAX_REGISTERED_BYTES holds
about eleven instantiations of one training step (benchmarks/retrace.py's): the step called
with 60 batch sizes (60 traces, every one kept alive by TF) stays within the budget on every
task, the instantiations evicted on the way are set up again when called, and training is
bit for bit gRPC's; a plan larger than the whole budget stays on gRPC and says why. The
eviction policy itself (which go, never one running, a call waiting for an eviction in
flight) is tested first, without TF."""
import json
import os
import subprocess
import sys
import threading
import time

import pytest

from held import other_fds
from rdmadev import Config
from rdmadev.cluster import evictions, runtime
from rdmadev.errors import ProtocolError
from rdmadev.testing import launch

RETRACE = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                       "benchmarks", "retrace.py")
#: Each task's budget: about eleven instantiations of the benchmark's step (its SMALL_BUDGET).
BUDGET = 768 << 10
ENV = {"RDMADEV_SECRET": "rdmadev-eviction-secret", "RDMADEV_DEADLINE_S": "60",
       "RDMADEV_MAX_REGISTERED_BYTES": str(BUDGET)}
TRACES, AGAIN = 60, 5
#: A coordinator tracing and instantiating 60 functions on a loaded 2-core box.
DRIVER_TIMEOUT_S = 900


class _Owner:
    """Stands for an AtomicFunction: what evictions keys instantiations by (weakly)."""


def _kept(ev, count, task="ps", size=100):
    """`count` instantiations kept in `ev`, oldest first: their owners, and the log of what
    was released and set up again."""
    owners, log = [_Owner() for _ in range(count)], []
    for i, owner in enumerate(owners):
        ev.keep(owner, f"i{i}", lambda again, i=i: log.append(("setup", i)) or ({}, {task: size}),
                lambda quiescent, i=i: log.append(("release", i, quiescent)), {task: size})
    return owners, log


def test_the_idle_longest_go_first_a_running_one_never_and_a_call_sets_it_up_again():
    ev = evictions.Evictions()
    owners, log = _kept(ev, 4)
    with ev.calling(owners[0]):  # the oldest, but running now: kept, and now the newest
        assert ev.make_room("ps", 150)  # two of 100 B cover 150 B
    assert log == [("release", 1, True), ("release", 2, True)]
    assert ev.make_room("other-task", 1) is False  # nothing held there
    with ev.calling(owners[2]):  # evicted: set up again before the call runs
        assert log[-1] == ("setup", 2)
    assert ev.counters() == {"planned": 4, "evicted_now": 1, "evicted": 2, "set_up_again": 1}
    with pytest.raises(RuntimeError), ev.calling(owners[3]):
        raise RuntimeError("the step failed")  # a transfer of it may still be in flight
    assert ev.make_room("ps", 300)  # all three left, the one that failed last
    assert log[-3:] == [("release", 0, True), ("release", 2, True), ("release", 3, False)]
    del owners[3]  # TF dropped that function: its instantiation is no longer kept
    assert ev.counters()["planned"] == 3


def test_a_call_waits_for_an_eviction_in_flight_then_sets_it_up_again():
    ev = evictions.Evictions()
    released, go_on = threading.Event(), threading.Event()
    owner, log = _Owner(), []

    def release(quiescent):
        released.set()
        go_on.wait(30)
        log.append("released")
    ev.keep(owner, "i", lambda again: log.append("setup") or ({}, {"ps": 1}), release, {"ps": 1})
    evictor = threading.Thread(target=ev.make_room, args=("ps", 1))
    evictor.start()
    assert released.wait(30)
    caller = threading.Thread(target=lambda: ev.calling(owner).__enter__())
    caller.start()
    caller.join(0.5)
    assert caller.is_alive() and log == []  # at the gate while the release runs
    go_on.set()
    caller.join(30)
    evictor.join(30)
    assert log == ["released", "setup"]


def test_a_refusal_that_is_not_for_room_is_raised_as_it_is():
    ev = evictions.Evictions()
    _kept(ev, 1)
    refused = ProtocolError("receiving task ps could not set up channels: reset")

    def setup():
        raise refused
    with pytest.raises(ProtocolError) as e:
        ev._within_budget(setup, {"ps": 1}, exclude=None)
    assert e.value is refused and ev.counters()["evicted"] == 0


@pytest.fixture(scope="module")
def cluster():
    with launch.Cluster(num_ps=1, num_workers=2, env=ENV) as c:
        yield c


def run(cluster, mode, traces=TRACES, again=AGAIN):
    proc = subprocess.run([sys.executable, RETRACE, "--one", json.dumps(cluster.spec), mode,
                           str(traces), str(again)],
                          capture_output=True, text=True, timeout=DRIVER_TIMEOUT_S,
                          env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2", **ENV})
    lines = [l for l in proc.stdout.splitlines() if l.startswith("RESULT ")]
    assert proc.returncode == 0 and lines, (proc.stdout + proc.stderr)[-4000:]
    return json.loads(lines[-1][len("RESULT "):])


@pytest.fixture(scope="module")
def runs(cluster):
    return {mode: run(cluster, mode) for mode in ("grpc", "rdmadev")}


@pytest.mark.tf
def test_sixty_traces_train_bit_for_bit_as_grpc(runs):
    grpc, rdma = runs["grpc"], runs["rdmadev"]
    assert rdma["traces"] == grpc["traces"] == TRACES
    assert len(rdma["swapped"]) == TRACES and all(rdma["swapped"]), rdma["swapped"]
    assert rdma["losses"] == grpc["losses"]  # the 60 steps, then 5 run again after eviction
    assert rdma["w0"] == grpc["w0"] and rdma["w1"] == grpc["w1"]


@pytest.mark.tf
def test_sixty_traces_stay_within_the_budget_where_ten_were(runs):
    rdma = runs["rdmadev"]
    for task, end in rdma["end"].items():
        ten = rdma["after_10"][task]
        assert end["budget_bytes"] == BUDGET
        assert end["registered_bytes"] <= BUDGET, (task, end["registered_bytes"])
        assert end["registered_bytes"] <= ten["registered_bytes"] + (100 << 20)
        assert end["planned_bytes"] <= end["registered_bytes"], (task, end)
        assert other_fds(end) <= other_fds(ten) + 8, (task, other_fds(ten), other_fds(end))
        assert end["memfd_maps"] <= ten["memfd_maps"] + 16, (task, ten["memfd_maps"],
                                                             end["memfd_maps"])


@pytest.mark.tf
def test_evicted_instantiations_are_set_up_again_when_called(runs):
    rdma = runs["rdmadev"]
    here = rdma["evictions"]
    assert here["planned"] == TRACES
    # Most of the 60 went to make room; the first AGAIN sizes, evicted long before, ran again.
    assert here["evicted"] >= TRACES - 15 and here["set_up_again"] >= AGAIN, here
    tasks = rdma["end"].values()
    assert sum(c["evicted"] for c in tasks) >= here["evicted"], rdma["end"]
    assert sum(c["set_up_again"] for c in tasks) >= here["set_up_again"], rdma["end"]


@pytest.mark.tf
def test_the_budget_holds_the_first_ten_instantiations(runs):
    """Nothing is evicted before the budget binds: after 10 traces every task held all ten
    instantiations' channels."""
    rdma = runs["rdmadev"]
    for task, ten in rdma["after_10"].items():
        assert ten["planned_bytes"] <= BUDGET and ten["evicted"] == 0, (task, ten)
    # ps, worker:0 and worker:1 each receive from both others: 2 pairs per instantiation
    assert all(ten["regions"] >= 10 * 2 for ten in rdma["after_10"].values()), rdma["after_10"]


@pytest.mark.tf
def test_nothing_is_left_on_the_tasks_once_the_coordinators_exit(cluster, runs):
    """Evicted, set up again, evicted again: every instantiation's channels go when its
    coordinator exits, none left bound or registered (a leak would show here)."""
    rt = runtime.Runtime(cluster.spec, config=Config(secret=ENV["RDMADEV_SECRET"].encode()))
    held = ("channels", "regions", "registered_bytes", "planned_bytes", "memfd_maps")
    tasks = list(runs["rdmadev"]["end"])
    now = lambda: {t: {k: rt.call(t, {"op": "counters"})[k] for k in held} for t in tasks}
    try:
        deadline = time.monotonic() + 60  # releases take milliseconds once the sockets close
        while any(any(c.values()) for c in now().values()) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not any(any(c.values()) for c in now().values()), now()
    finally:
        rt.close()


#: A coordinator whose one step moves a 1 MiB variable to worker:0 and back: more than a
#: task's whole budget, with nothing of this process's to evict.
TOO_BIG = """
import json, sys
import tensorflow as tf
import rdmadev
from graph_pass.devices import task_name
from rdmadev.cluster import runtime
spec = json.loads(sys.argv[1])
tf.config.experimental_connect_to_cluster(tf.train.ClusterSpec(spec))
runtime.start(spec)
with tf.device(task_name("ps", 0)):
    v = tf.Variable(tf.zeros([512, 512]))

@rdmadev.optimize
@tf.function
def step():
    with tf.device(task_name("worker", 0)):
        u = v + 1.0
    with tf.device(task_name("ps", 0)):
        v.assign(u)

for _ in range(3):
    step()
print("RESULT " + json.dumps({"sum": float(tf.reduce_sum(v)), "report": step.report}))
"""


def _drive(script, cluster):
    """Runs coordinator `script` against `cluster`: (its RESULT line's object, the process)."""
    proc = subprocess.run([sys.executable, "-c", script, json.dumps(cluster.spec)],
                          capture_output=True, text=True, timeout=DRIVER_TIMEOUT_S,
                          env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2", **ENV})
    lines = [l for l in proc.stdout.splitlines() if l.startswith("RESULT ")]
    assert proc.returncode == 0 and lines, (proc.stdout + proc.stderr)[-4000:]
    return json.loads(lines[-1][len("RESULT "):]), proc


@pytest.mark.tf
def test_a_plan_larger_than_the_budget_runs_on_grpc_and_says_why(cluster):
    """Where rdmadev has no room it keeps TF's path, as TF would run the step: the report
    names the reason and one WARNING the task and the fix."""
    r, proc = _drive(TOO_BIG, cluster)
    assert r["sum"] == 3.0 * 512 * 512
    assert "0 transfers swapped" in r["report"] and "(over_budget)" in r["report"], r["report"]
    warned = [l for l in proc.stderr.splitlines() if "stays on gRPC" in l]
    assert len(warned) == 1 and "RDMADEV_MAX_REGISTERED_BYTES" in warned[0], proc.stderr[-4000:]


#: A ParameterServerStrategy step that reads a 1 MiB ps variable on worker 0: the worker plans
#: it, and the pair's ring (on the worker itself) is past the worker's own budget.
WORKER_OVER_BUDGET = """
import json, socket, sys
import tensorflow as tf
import rdmadev
from graph_pass.devices import task_name
from rdmadev.cluster import runtime
spec = json.loads(sys.argv[1])
with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    full = dict(spec, chief=[f"127.0.0.1:{s.getsockname()[1]}"])
resolver = tf.distribute.cluster_resolver.SimpleClusterResolver(
    tf.train.ClusterSpec(full), task_type="chief", task_id=0, rpc_layer="grpc")
strategy = tf.distribute.ParameterServerStrategy(resolver)
coordinator = tf.distribute.coordinator.ClusterCoordinator(strategy)
rt = runtime.start(spec)
with strategy.scope():
    v = tf.Variable(tf.ones([512, 512]))

@rdmadev.optimize
@tf.function
def step():
    return strategy.run(lambda: tf.reduce_sum(v * 2.0))

out = [coordinator.schedule(step) for _ in range(3)]
coordinator.join()
reports = [r for w in range(len(spec["worker"])) for r in rt.call(task_name("worker", w), {"op": "reports"})]
print("RESULT " + json.dumps({"sums": [float(r.fetch()) for r in out], "reports": reports}))
"""


@pytest.mark.tf
def test_a_worker_past_its_own_budget_runs_the_step_on_grpc(cluster):
    """A ParameterServerStrategy worker plans its instantiation in its own process: when the
    ring it would receive into is past its own RDMADEV_MAX_REGISTERED_BYTES, the step runs on
    TF's path, as TF would run it, and the worker's report says why (it failed the
    instantiation with FailedPrecondition before: the refusal, raised in the planner's own
    process, had no `kind` to read)."""
    r, _ = _drive(WORKER_OVER_BUDGET, cluster)
    assert r["sums"] == [2.0 * 512 * 512] * 3
    kept = [k for rep in r["reports"] for k in rep["kept"]]
    assert kept and all(k[2] == "over_budget" for k in kept), r["reports"]
    assert not any(rep["swapped"] for rep in r["reports"]), r["reports"]


@pytest.mark.tf
def test_setting_up_again_fails_with_the_error_class_a_step_would():
    """TF's retrying callers read the class: a task gone is Unavailable, no room left is TF's
    out-of-memory class."""
    import tensorflow as tf

    from rdmadev.tf import calls
    refused = ProtocolError("receiving task ps could not set up channels: past its limit")
    refused.over_budget = "/job:ps/replica:0/task:0"
    assert isinstance(calls.as_tf_error(refused), tf.errors.ResourceExhaustedError)
    gone = ProtocolError("receiving task ps could not set up channels: connection refused")
    error = calls.as_tf_error(gone)
    assert isinstance(error, tf.errors.UnavailableError) and "connection refused" in str(error)
