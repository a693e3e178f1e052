"""ParameterServerStrategy's worker fault tolerance, as TF's own fault-tolerance tests check it,
on TF's gRPC path and through rdmadev, on one loopback cluster of 1 ps and 2 workers (it kills
and restarts workers): ``python pss_fault_tolerance.py``. Written for this project after what
TF's fault_tolerance_test_base covers; none of its code.

Each scenario runs once per path, one after the other on the same cluster and coordinator:
``grpc`` schedules a plain tf.function, ``rdmadev`` the same step under rdmadev.optimize (the
tasks serve rdmadev and rewrite only optimized functions). A step adds exactly 1 to every
element of its path's variable, so the variable counts the steps TF applied, whichever worker
ran them: ClusterCoordinator runs a closure again when its worker fails (at least once), so a
step cut short may count twice, never zero times. Prints ``RESULT <scenario> <path> <json>``,
or ``FAILED <scenario> <path> <error>``.
"""
import json
import os
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


def main():
    os.environ.update(ENV)
    cluster = launch.Cluster(num_ps=1, num_workers=2, env=ENV).start()
    code = 0
    try:
        strategy, coordinator = launch.pss_coordinator(cluster.spec)
        for scenario in SCENARIOS:
            for path in PATHS:
                t0 = time.monotonic()
                try:
                    job = Job(strategy, path)
                    result = scenario(cluster, coordinator, job)
                    result["seconds"] = round(time.monotonic() - t0, 1)
                    # live workers' instantiations whose tensors rdmadev swapped (a killed
                    # worker's reports went with it)
                    result["swapped"] = sum("transfers swapped" in str(r)
                                            for r in getattr(job.step, "reports", []))
                    print(f"RESULT {scenario.__name__} {path} {json.dumps(result)}", flush=True)
                except Exception as e:  # pylint: disable=broad-except  (reported per path)
                    import traceback
                    traceback.print_exc()
                    print(f"FAILED {scenario.__name__} {path} {type(e).__name__}: "
                          f"{str(e)[:300]!r}", flush=True)
                    code = 1
                    for i in (0, 1):  # whole again for the next
                        if not cluster.running("worker", i):
                            cluster.restart("worker", i)
    finally:
        cluster.stop()
    os._exit(code)  # the coordinator's threads may still retry: do not wait for them


if __name__ == "__main__":
    main()
