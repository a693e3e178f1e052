"""ParameterServerStrategy's fault tolerance, as TF's own fault-tolerance tests check it, on
TF's gRPC path and through rdmadev, on one loopback cluster of 1 ps and 2 workers (it kills
and restarts tasks): ``python pss_fault_tolerance.py [scenario ...]`` (default: all).
Written for this project after what TF's fault_tolerance_test_base covers; none of its code.

Each scenario runs once per path, one after the other: ``grpc`` schedules a plain
tf.function, ``rdmadev`` the same step under rdmadev.optimize (the tasks serve rdmadev and
rewrite only optimized functions). SCENARIOS share one strategy and coordinator; then each
of OWN_COORDINATOR makes its own per path, as it must: a worker is down while they are made,
or the ps is lost (its variables with it: a user makes them again) and is restarted, so the
next path starts on a whole cluster. A step adds exactly 1 to every element of its path's
variable, so the variable counts the steps TF applied, whichever worker ran them:
ClusterCoordinator runs a closure again when its worker fails (at least once), so a step cut
short may count twice, never zero times. Prints ``RESULT <scenario> <path> <json>``, or
``FAILED <scenario> <path> <error>``.
"""
import json
import os
import socket
import sys
import threading
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
import tensorflow as tf  # noqa: E402

import rdmadev  # noqa: E402
from e2e_util import ENV  # noqa: E402
from rdmadev.testing import launch  # noqa: E402

#: Steps per phase: enough for both workers to run several while a fault happens.
STEPS = 30
PATHS = ("grpc", "rdmadev")


class Job:
    """One path's model on the shared strategy: a variable on the ps and a step adding 1."""

    def __init__(self, strategy, path):
        with strategy.scope():
            self.count = tf.Variable(tf.zeros([64, 64]), name=f"count_{path}")

        def step():
            self.count.assign_add(tf.ones([64, 64]) + tf.reduce_sum(self.count) * 0.0)
            return tf.reduce_sum(self.count)

        self.step = tf.function(step)
        if path == "rdmadev":
            self.step = rdmadev.optimize(self.step)

    def applied(self):
        return float(self.count[0, 0].numpy())


def _schedule(coordinator, job, n):
    return [coordinator.schedule(job.step) for _ in range(n)]


def _train_through(coordinator, job, fault, scheduled_by_fault=0):
    """Schedules STEPS steps, calls `fault()` while they run (it may schedule
    `scheduled_by_fault` steps of its own), schedules STEPS more and joins; returns the
    steps scheduled, applied and in flight when the fault hit."""
    _schedule(coordinator, job, STEPS)
    fault()
    _schedule(coordinator, job, STEPS)
    coordinator.join()
    return {"scheduled": 2 * STEPS + scheduled_by_fault, "applied": job.applied(),
            "in_flight": STEPS + scheduled_by_fault}


def _restart_soon(cluster, job, index, delay_s=1.0):
    """Restarts the killed task `delay_s` from now, in a thread (joined by the caller): while
    a worker is gone, ClusterCoordinator's recovery retries the cluster update until it is
    back, and TF's own tests restart it so."""
    def restart():
        time.sleep(delay_s)
        cluster.restart(job, index)

    thread = threading.Thread(target=restart, daemon=True)
    thread.start()
    return thread


def worker_preempted_between_functions(cluster, coordinator, job):
    """A worker killed while idle: the steps go to the other; restarted, it takes steps again.
    No closure was in flight on it, so every step is applied exactly once."""
    _schedule(coordinator, job, STEPS)
    coordinator.join()
    cluster.kill("worker", 1)
    back = _restart_soon(cluster, "worker", 1)  # TF's recovery waits for it: so do TF's tests
    _schedule(coordinator, job, STEPS)
    coordinator.join()
    back.join()
    _schedule(coordinator, job, STEPS)
    coordinator.join()
    return {"scheduled": 3 * STEPS, "applied": job.applied(), "in_flight": 0}


def worker_preempted_midst_functions(cluster, coordinator, job):
    """A worker killed with steps in flight, restarted at once: its closures run again."""
    def fault():
        cluster.kill("worker", 0)
        cluster.restart("worker", 0)

    return _train_through(coordinator, job, fault)


def two_workers_preempted(cluster, coordinator, job):
    """Both workers killed with steps in flight, then both restarted: training resumes."""
    def fault():
        cluster.kill("worker", 0)
        cluster.kill("worker", 1)
        cluster.restart("worker", 0)
        cluster.restart("worker", 1)

    return _train_through(coordinator, job, fault)


def worker_continuous_failure(cluster, coordinator, job):
    """One worker killed and restarted three times over one job."""
    def fault():
        for _ in range(3):
            cluster.kill("worker", 1)
            cluster.restart("worker", 1)
            _schedule(coordinator, job, 4)

    return _train_through(coordinator, job, fault, scheduled_by_fault=12)


def values_fetched_after_a_worker_failure(cluster, coordinator, job):
    """Steps' return values fetched after the worker that ran some of them failed: each
    fetch gives a value (a cut step's from its run again)."""
    remotes = _schedule(coordinator, job, STEPS)
    cluster.kill("worker", 0)
    cluster.restart("worker", 0)  # the coordinator's recovery waits for it
    coordinator.join()
    values = [float(r.fetch()) for r in remotes]
    return {"scheduled": STEPS, "applied": job.applied(), "in_flight": STEPS,
            "fetched": len(values), "positive": all(v > 0 for v in values)}


SCENARIOS = (values_fetched_after_a_worker_failure, worker_preempted_between_functions,
             worker_preempted_midst_functions, two_workers_preempted, worker_continuous_failure)


#: Seconds ClusterCoordinator gets to start recovering from a killed worker (its closure there
#: fails at once: the killed task's port refuses) before the ps is killed too.
RECOVERY_START_S = 20
#: Seconds a lost ps may take to reach the user: on gRPC the other worker's steps fail at
#: once (TF takes a ps's first 3 failures for transient, then raises); rdmadev must not wait
#: for its own deadline (RDMADEV_DEADLINE_S, 60 in these tests) either. Longer is a hang.
PS_FAILURE_BOUND_S = 60
#: Seconds between two steps of the user's loop while the ps fails: steps keep reaching the
#: ps as a user's do (a step takes ~4 ms; the loop must not flood the queue either).
SCHEDULE_INTERVAL_S = 0.02


def _retire(coordinator):
    """Stops a ClusterCoordinator the scenarios are done with: its closure threads and its
    recovery thread, which would otherwise update the process's connection to the cluster
    with its own ServerDef when a task it knows fails later."""
    coordinator._cluster.stop()  # pylint: disable=protected-access  (TF's own tests do)


def _listening(address):
    """Whether a task's port at `address` ("host:port") accepts connections."""
    host, port = address.rsplit(":", 1)
    try:
        with socket.create_connection((host, int(port)), timeout=0.5):
            return True
    except OSError:
        return False


def worker_preempted_during_strategy_init(cluster):
    """Worker 1 killed before ParameterServerStrategy and its ClusterCoordinator are made and
    started again at once: it listens seconds later (a TF server's start), so the strategy
    connects to the cluster while it is down. TF's strategy retries the connection
    (set_server_def_retries) until it is back; then each path's variable is made and its
    steps run, each applied exactly once (no step ran on the killed worker). The one strategy
    serves both paths, their models made at once after it (a worker restart a path would
    cost ~10 s of the tier's budget). (The new process starts before the strategy: TF's
    set_server_def holds Python's GIL while it retries, so a thread of this process could
    not start it meanwhile.)"""
    cluster.kill("worker", 1)
    cluster.restart("worker", 1, wait=False)
    init = {"down_at_init": not _listening(cluster.spec["worker"][1])}
    t0 = time.monotonic()
    strategy, coordinator = launch.pss_coordinator(cluster.spec)
    try:
        init["connected_s"] = round(time.monotonic() - t0, 1)
        jobs = {path: Job(strategy, path) for path in PATHS}

        def train(job):
            _schedule(coordinator, job, STEPS)
            coordinator.join()
            return {"scheduled": STEPS, "applied": job.applied(), "in_flight": 0, **init}, job

        for path in PATHS:
            yield path, lambda job=jobs[path]: train(job)
    finally:
        _retire(coordinator)


class UserLoop:
    """A user's training loop in a thread: schedules a step every SCHEDULE_INTERVAL_S until
    schedule() raises or wait_error() stops it, then joins. `error`: what reached the user."""

    def __init__(self, coordinator, job):
        self.error, self._stop, self._done = None, threading.Event(), threading.Event()

        def train():
            try:
                while not self._stop.wait(SCHEDULE_INTERVAL_S):
                    coordinator.schedule(job.step)
                coordinator.join()
            except Exception as e:  # pylint: disable=broad-except  (what reaches the user)
                self.error = e
            self._done.set()

        threading.Thread(target=train, daemon=True).start()

    def wait_error(self, bound_s):
        """Waits up to `bound_s` for an error to end the loop, then stops it and gives join
        `bound_s` more. Returns whether the loop ended: False is a hang."""
        self._done.wait(bound_s)
        self._stop.set()
        return self._done.wait(bound_s)


def _ps_failure_during_worker_recovery(cluster, path):
    """While the user trains, worker 0 is killed; once ClusterCoordinator recovers from it
    (waits for it to come back), the ps is killed too, and both are started again, as in TF's
    own test (at once here: a TF server listens seconds after its start). The lost ps must
    reach the user (from schedule or join), judged a ps failure by TF's own classifiers (not
    swallowed as a worker failure and retried), within a bound. The ps's variables are gone:
    each path makes its own strategy and coordinator, retired after."""
    strategy, coordinator = launch.pss_coordinator(cluster.spec)
    try:
        return _lose_the_ps_while_recovering(cluster, coordinator, Job(strategy, path))
    finally:
        _retire(coordinator)


def _lose_the_ps_while_recovering(cluster, coordinator, job):
    # TF's own classifiers of a failed closure, as ClusterCoordinator applies them
    from tensorflow.python.distribute.coordinator.cluster_coordinator import (
        _is_ps_failure, _is_worker_failure)
    _schedule(coordinator, job, STEPS)
    coordinator.join()  # both workers instantiated the step (its reports)
    swapped = _swapped(job)
    loop = UserLoop(coordinator, job)  # worker 0 has a step in flight or soon
    cluster.kill("worker", 0)
    handler = coordinator._cluster.failure_handler  # pylint: disable=protected-access
    in_recovery = handler._cluster_due_for_update_or_finish.wait(RECOVERY_START_S)
    t0 = time.monotonic()
    cluster.kill("ps", 0)
    back = [_restart_soon(cluster, job_name, 0, delay_s=0.0) for job_name in ("ps", "worker")]
    ended = loop.wait_error(PS_FAILURE_BOUND_S)
    error_after_s = time.monotonic() - t0
    for thread in back:
        thread.join()
    error = loop.error
    return {"in_recovery": in_recovery, "hung": not ended, "error_after_s": round(error_after_s, 1),
            "error": f"{type(error).__name__}: {error}"[:500] if error else "",
            "error_type": type(error).__name__ if error else "",
            "ps_failure": bool(error) and _is_ps_failure(error),
            "worker_failure": bool(error) and _is_worker_failure(error), "swapped": swapped}, job


def ps_failure_during_worker_recovery(cluster):
    """_ps_failure_during_worker_recovery on each path."""
    for path in PATHS:
        yield path, lambda path=path: _ps_failure_during_worker_recovery(cluster, path)


#: Scenarios that make their own strategy and coordinator, after SCENARIOS: a worker is down
#: while it is made, or the ps (its variables) is lost. Each yields (path, run) for each
#: path, run() -> (result, job); it leaves the cluster whole (what it killed restarted) and
#: stops the coordinators it made (_retire).
OWN_COORDINATOR = (worker_preempted_during_strategy_init, ps_failure_during_worker_recovery)


def _swapped(job):
    """Live workers' instantiations of `job`'s step whose tensors rdmadev swapped (a killed
    worker's reports went with it)."""
    return sum("transfers swapped" in str(r) for r in getattr(job.step, "reports", []))


def _report(scenario, path, run):
    """Runs `run()` -> (result, job) and prints its RESULT line, or its FAILED line after the
    traceback; returns whether it passed."""
    t0 = time.monotonic()
    try:
        result, job = run()
        result["seconds"] = round(time.monotonic() - t0, 1)
        result.setdefault("swapped", _swapped(job))
        print(f"RESULT {scenario.__name__} {path} {json.dumps(result)}", flush=True)
        return True
    except Exception as e:  # pylint: disable=broad-except  (reported per path)
        import traceback
        traceback.print_exc()
        print(f"FAILED {scenario.__name__} {path} {type(e).__name__}: "
              f"{str(e)[:300]!r}", flush=True)
        return False


def _make_whole(cluster):
    """Starts again every task a failed scenario left dead, for the next."""
    for job_name, index, _ in cluster.tasks():
        if not cluster.running(job_name, index):
            cluster.restart(job_name, index)


def main():
    """Runs SCENARIOS, then OWN_COORDINATOR (argv: the names of those to run; default all)."""
    wanted = set(sys.argv[1:])
    shared = [s for s in SCENARIOS if not wanted or s.__name__ in wanted]
    own = [s for s in OWN_COORDINATOR if not wanted or s.__name__ in wanted]
    os.environ.update(ENV)
    cluster = launch.Cluster(num_ps=1, num_workers=2, env=ENV).start()
    ok = True
    try:
        if shared:
            strategy, coordinator = launch.pss_coordinator(cluster.spec)
            for scenario in shared:
                for path in PATHS:
                    def run():
                        job = Job(strategy, path)
                        return scenario(cluster, coordinator, job), job
                    ok &= _report(scenario, path, run)
                    _make_whole(cluster)
            _retire(coordinator)
        for scenario in own:
            reported = []
            try:
                for path, run in scenario(cluster):
                    ok &= _report(scenario, path, run)
                    reported.append(path)
            except Exception as e:  # pylint: disable=broad-except  (making its strategy failed)
                import traceback
                traceback.print_exc()
                for path in PATHS[len(reported):]:
                    print(f"FAILED {scenario.__name__} {path} {type(e).__name__}: "
                          f"{str(e)[:300]!r}", flush=True)
                ok = False
            _make_whole(cluster)
    finally:
        cluster.stop()
    os._exit(0 if ok else 1)  # the coordinator's threads may still retry: do not wait for them


if __name__ == "__main__":
    main()
