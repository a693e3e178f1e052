"""ParameterServerStrategy with rdmadev over a job's life (functions dropped, tasks dying):
one coordinator process that owns its own loopback cluster (it kills and restarts tasks) and
runs the scenarios of one group on it, one after the other, with one strategy; prints a line
per scenario, "RESULT <scenario> <json>" or "FAILED <scenario>" after its traceback.

    python pss_faults.py shm | tcp | verbs        (GROUPS: which scenarios, on which cluster)

The verbs group needs a viable verbs (the Soft-RoCE tier runs it: tests/softroce/tier.sh).
"""
import gc
import json
import os
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
import tensorflow as tf  # noqa: E402

import rdmadev  # noqa: E402
from e2e_util import ENV  # noqa: E402
from rdmadev.cluster import runtime  # noqa: E402
from rdmadev.cluster.channels import WATCH_INTERVAL_S  # noqa: E402
from rdmadev.testing import faults, launch  # noqa: E402

#: Steps per phase: enough for every worker to run the step several times.
STEPS = 40
#: The tasks the scenarios reset the connection between (cut_*) and restart (restart_grown: W1).
PS, W0, W1 = (f"/job:{job}/replica:0/task:{i}" for job, i in (("ps", 0), ("worker", 0), ("worker", 1)))


_strategies = []


def _strategy(cluster):
    """The process's ParameterServerStrategy and ClusterCoordinator, made at the first call
    (the scenarios of a group share them, as one job's phases would)."""
    if not _strategies:
        _strategies.append(launch.pss_coordinator(cluster.spec))
    return _strategies[0]


def _model(strategy):
    with strategy.scope():
        w = tf.Variable(tf.zeros([256, 256]), name="w")

    @rdmadev.optimize
    @tf.function
    def step():  # adds exactly 1 to every weight: w counts the steps TF applied
        w.assign_add(tf.ones([256, 256]) + tf.reduce_sum(w) * 0.0)
        return tf.reduce_sum(w)

    return w, step


def _instantiated_by(step, pid):
    """Reports of `step`'s instantiations by the task process `pid`."""
    return [str(r) for r in step.reports if f"instance {pid:x}." in str(r)]


def _run(coordinator, step, steps):
    for _ in range(steps):
        coordinator.schedule(step)
    coordinator.join()


#: Keys of rdmadev.counters() that must come back to where they started once the functions
#: holding them are dropped.
HELD = ("channels", "regions", "registered_bytes", "memfd_maps")
#: Seconds to wait for the releases to reach every task (a release takes milliseconds; the
#: coordinator's TF notices the dropped function at its next garbage collection).
RELEASE_WAIT_S = 60


def _held():
    return {task: {k: c[k] for k in HELD} for task, c in rdmadev.counters().items()}


def _settled_held(within=30):
    """_held() once no task has a released region's pages quarantined for late writes (10 s):
    their chunks may go meanwhile, and what is compared must not count them."""
    deadline = time.monotonic() + within
    while time.monotonic() < deadline and any(
            c["quarantined_bytes"] for c in rdmadev.counters().values()):
        time.sleep(0.5)
    return _held()


def release(cluster):
    """Drop scheduled functions, one after another: their instantiations on the workers (which
    planned them, in a TF thread) and on the ps are released, so what the tasks hold goes back
    to where it started, every time."""
    strategy, coordinator = _strategy(cluster)
    start = _settled_held()
    rounds = []
    for _ in range(3):
        _, step = _model(strategy)
        _run(coordinator, step, STEPS)
        holding = _held()
        swapped = sum("transfers swapped" in str(r) for r in step.reports)
        del step
        deadline = time.monotonic() + RELEASE_WAIT_S
        while True:
            gc.collect()
            after = _held()
            if after == start or time.monotonic() > deadline:
                break
            time.sleep(0.5)
        rounds.append({"holding": holding, "after": after, "swapped": swapped})
    return {"start": start, "rounds": rounds}


def restart_worker(cluster):
    """kill -9 a worker mid-training, go on with the other, start it again at the same address:
    the coordinator gives it steps again and it runs them through rdmadev (new channels)."""
    strategy, coordinator = _strategy(cluster)
    w, step = _model(strategy)
    _run(coordinator, step, STEPS)
    before = _settled_held()
    old_pid = cluster.pid("worker", 1)
    for _ in range(STEPS):  # in flight while the worker dies
        coordinator.schedule(step)
    cluster.kill("worker", 1)
    coordinator.join()
    cluster.restart("worker", 1)
    deadline = time.monotonic() + 120
    new_pid = cluster.pid("worker", 1)
    reports = []
    applied = 2 * STEPS
    # the coordinator reconnects to the restarted worker on its own schedule: go on training
    # until that worker has instantiated the step (bounded)
    while time.monotonic() < deadline:
        _run(coordinator, step, STEPS)
        applied += STEPS
        reports = [str(r) for r in step.reports]
        if _instantiated_by(step, new_pid):
            break
    # the dead incarnation's channels on the ps and the other worker go (dead-peer sweep)
    while time.monotonic() < deadline and _held() != before:
        time.sleep(0.5)
    return {"applied": applied, "in_flight": STEPS, "w": float(w[0, 0].numpy()), "old_pid": old_pid,
            "new_pid": new_pid, "reports": reports, "before": before, "after": _held()}


def kill_ps(cluster):
    """kill -9 the ps mid-training: the coordinator gets TF's error for a lost ps, promptly."""
    strategy, coordinator = _strategy(cluster)
    w, step = _model(strategy)
    _run(coordinator, step, STEPS)
    for _ in range(STEPS):
        coordinator.schedule(step)
    cluster.kill("ps", 0)
    t0 = time.monotonic()
    error, classified = "", {}
    try:
        coordinator.join()
        _run(coordinator, step, STEPS)
    except Exception as e:  # TF's Unavailable or Aborted, naming the ps as gRPC does
        from tensorflow.python.distribute.coordinator import cluster_coordinator as cc
        error = f"{type(e).__name__}: {e}"
        classified = {"ps_failure": cc._is_ps_failure(e), "worker_failure": cc._is_worker_failure(e)}
    return {"error": error[:500], "seconds": time.monotonic() - t0, **classified}


def _cut_and_train_on(cluster, coordinator, step):
    """Resets the tcp connection between worker:0 and the ps with STEPS steps in flight, and
    trains on until both tasks set the pairs between them up again (bounded), then STEPS more
    on the rings set up again. Returns (connections reset, steps run)."""
    reopened = _reopened()
    ps = runtime.current().call(PS, {"op": "ping"})["address"]
    for _ in range(STEPS):  # in flight while the connection breaks
        coordinator.schedule(step)
    cut = faults.reset_connections(ps, cluster.pid("worker", 0), "tcp")
    coordinator.join()
    applied, deadline = STEPS, time.monotonic() + 120
    while time.monotonic() < deadline:
        _run(coordinator, step, STEPS)
        applied += STEPS
        if all(_reopened()[t] > reopened[t] for t in (PS, W0)):
            break
    _run(coordinator, step, STEPS)
    return cut, applied + STEPS


def cut_connection(cluster):
    """Reset the tcp connection from worker:0 to the ps mid-training, both running on: the
    channels between them are set up again (counted as "reopened") and training goes on
    through rdmadev, no step lost, nothing left over once the old rings went."""
    strategy, coordinator = _strategy(cluster)
    w, step = _model(strategy)
    applied, deadline = 0, time.monotonic() + 120
    while not applied or (PS not in rdmadev.counters()[W0]["peers"] and
                          time.monotonic() < deadline):  # until worker:0 ran a step (bounded)
        _run(coordinator, step, STEPS)
        applied += STEPS
    before, reopened = _held(), _reopened()
    cut, steps = _cut_and_train_on(cluster, coordinator, step)
    applied += steps
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and _held() != before:
        time.sleep(0.5)
    now = rdmadev.counters()
    return {"applied": applied, "in_flight": STEPS, "w": float(w[0, 0].numpy()), "cut": cut,
            "reopened": {t: c["reopened"] - reopened[t] for t, c in now.items()},
            # receives of retried steps' stale parts that the next step's took the place of
            "superseded": {t: c["superseded"] for t, c in now.items()},
            "swapped": sum("transfers swapped" in str(r) for r in step.reports),
            "before": before, "after": _held()}


#: Rows of cut_grown's table, and ids each step looks up (tf.unique'd: half are repeats).
ROWS, IDS = 1000, 200


def _sparse_model(strategy):
    with strategy.scope():
        table = tf.Variable(tf.zeros([ROWS, 16]), name="table")

    @rdmadev.optimize
    @tf.function
    def step():  # adds exactly 1 to rows 0..IDS/2-1: each counts the steps TF applied
        # on the worker (shuffled: nothing for grappler to fold), ids -> ps
        ids, _ = tf.unique(tf.random.shuffle(tf.range(IDS) % (IDS // 2)))
        rows = tf.gather(table, ids)  # on the ps: rows -> worker
        # ids and ones -> ps. The ND scatter, as TF's ResourceScatterAdd of a float runs
        # under a shared lock: two workers' steps at once may lose an increment (it did,
        # in about one run of restart_grown in twenty), on gRPC as well.
        table.scatter_nd_add(ids[:, None], rows * 0.0 + 1.0)
        return tf.reduce_sum(rows)

    return table, step


def _moved(task_counters):
    """What a task did for tensors larger than their slots: rings grown, tensors staged and
    the stages registered for them."""
    return {k: task_counters[k] for k in ("grown", "staged", "stages")}


def _until_nothing_grows(coordinator, step, worker, tasks):
    """Trains until `worker` ran the step and no task of `tasks` grew a ring or staged a
    tensor in a round of STEPS (bounded). Returns (steps run, what `tasks` did: _moved)."""
    applied, last, deadline = 0, None, time.monotonic() + 120
    while time.monotonic() < deadline:
        _run(coordinator, step, STEPS)
        applied += STEPS
        time.sleep(2 * WATCH_INTERVAL_S)  # how often the watchers grow channels
        now = rdmadev.counters()
        moved = {t: _moved(now[t]) for t in tasks}
        if PS in now[worker]["peers"] and moved == last:
            break
        last = moved
    return applied, last


def cut_grown(cluster):
    """cut_connection's reset, after the channels of a step with run-time shapes (tf.unique'd
    ids, gathered rows, scattered updates) outgrew their 256-byte slots and grew: the pairs
    set up again keep the slots their channels grew to, so neither task registers a larger
    ring or a stage again."""
    strategy, coordinator = _strategy(cluster)
    table, step = _sparse_model(strategy)
    applied, last = _until_nothing_grows(coordinator, step, W0, (PS, W0))
    reopened = _reopened()
    cut, steps = _cut_and_train_on(cluster, coordinator, step)
    applied += steps
    time.sleep(2 * WATCH_INTERVAL_S)  # a growth the steps asked for is under way by now
    now = rdmadev.counters()
    return {"applied": applied, "in_flight": STEPS, "rows": table[:IDS // 2, 0].numpy().tolist(),
            "cut": cut, "reopened": {t: c["reopened"] - reopened[t] for t, c in now.items()},
            "grown_before": last, "grown_after": {t: _moved(now[t]) for t in (PS, W0)},
            "swapped": sum("transfers swapped" in str(r) for r in step.reports),
            "reports": [str(r) for r in step.reports][:2]}


def restart_grown(cluster):
    """restart_worker's kill -9 and restart of worker:1, after the channels of the step with
    run-time shapes outgrew their 256-byte slots and grew: the ps sets up the restarted
    worker's channels to it (its new incarnation: new keys) with the slots they grew to, so
    the ps grows no ring again and the restarted worker stages nothing. (What the worker
    itself had learned of the rows it receives died with it.)"""
    strategy, coordinator = _strategy(cluster)
    table, step = _sparse_model(strategy)
    applied, before = _until_nothing_grows(coordinator, step, W1, (PS, W1))
    old_pid = cluster.pid("worker", 1)
    for _ in range(STEPS):  # in flight while the worker dies
        coordinator.schedule(step)
    cluster.kill("worker", 1)
    coordinator.join()
    applied += STEPS
    cluster.restart("worker", 1)
    new_pid = cluster.pid("worker", 1)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:  # until the restarted worker ran the step (bounded)
        _run(coordinator, step, STEPS)
        applied += STEPS
        if _instantiated_by(step, new_pid):
            break
    steps, after = _until_nothing_grows(coordinator, step, W1, (PS, W1))
    return {"applied": applied + steps, "in_flight": STEPS,
            "rows": table[:IDS // 2, 0].numpy().tolist(), "old_pid": old_pid,
            "new_pid": new_pid, "before": before, "after": after,
            "restarted": bool(_instantiated_by(step, new_pid))}


def _reopened():
    return {task: c["reopened"] for task, c in rdmadev.counters().items()}


#: The scenarios of each group, in the order they run on one cluster (kill_ps last: the ps
#: stays dead), and the group's environment beyond ENV: a tcp connection to break, and
#: 256-byte slots for the steps of run-time shapes to outgrow (the other steps' shapes are
#: static: the setting changes nothing for them).
GROUPS = {
    "shm": ({"RDMADEV_DYNAMIC_CAPACITY": "256"},
            (release, restart_worker, restart_grown, kill_ps)),
    "tcp": ({"RDMADEV_FABRIC": "tcp", "RDMADEV_DYNAMIC_CAPACITY": "256"},
            (cut_connection, cut_grown, kill_ps)),
    # Only kill_ps: the other scenarios' code above the fabric is the same on every fabric,
    # and each TF process costs ~75 s in the Soft-RoCE guest (below).
    "verbs": ({"RDMADEV_FABRIC": "verbs"}, (kill_ps,)),
}
#: Seconds the group's three servers may take to listen, past launch's default (120 s) where a
#: group runs in the Soft-RoCE guest: its CPU is emulated (TCG), where importing TF alone took
#: 73 s (180 s with a cold page cache) in one process on 2 vCPUs, and three start at once.
READY_TIMEOUT_S = {"verbs": 600}


def main():
    extra, scenarios = GROUPS[sys.argv[1]]
    env = {**ENV, **extra}
    os.environ.update(env)
    ready_s = READY_TIMEOUT_S.get(sys.argv[1], launch.READY_TIMEOUT_S)
    cluster = launch.Cluster(num_ps=1, num_workers=2, env=env, ready_timeout=ready_s).start()
    code = 0
    try:
        for scenario in scenarios:
            try:
                result = scenario(cluster)
            except Exception:
                import traceback
                traceback.print_exc()
                print(f"FAILED {scenario.__name__}", flush=True)
                code = 1
                continue
            print(f"RESULT {scenario.__name__} {json.dumps(result)}", flush=True)
    finally:
        cluster.stop()
    os._exit(code)  # the coordinator's threads still retry the dead tasks: do not wait for them


if __name__ == "__main__":
    main()
