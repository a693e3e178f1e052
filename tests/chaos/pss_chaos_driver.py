"""The chaos tier's ParameterServerStrategy job: a ClusterCoordinator scheduling steps on 2
workers, with the variables on the ps, in rounds until it fails or is interrupted (SIGINT:
the round under way ends first; see chaos_driver.py, whose line protocol this speaks).

    python pss_chaos_driver.py CLUSTER_JSON grpc|rdmadev [ROUNDS]

A step reads `w` (WEIGHTS_BYTES, ps -> worker), adds 1 to it on the worker and applies that
(worker -> ps), and counts itself in ``done[step]``. ClusterCoordinator runs a closure
again when its worker fails (at least once), so a step cut short may be applied twice,
never zero times. After each round (ROUND steps scheduled, then joined) the driver checks:
every step scheduled so far was applied (``done >= 1``), every element of `w` is the same
(each 1 MiB tensor arrived whole), and `w` counts the applications ``done`` counts, give or
take the steps that were in flight on a worker when it failed (at most one per worker).
One line per round: ``STEP <round> <time.monotonic()> <ok>``; at the end ``EXTRA <steps
applied twice>``, then ``DONE`` after ROUNDS rounds, ``INTERRUPTED <round>``, or ``ERROR
<time.monotonic()> <json: type, message, ps_failure, worker_failure>`` (exit 3): the error
the user got, and how TF's own classifiers (cluster_coordinator.py) take it.
"""
import json
import os
import signal
import sys
import threading
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
import tensorflow as tf  # noqa: E402
from tensorflow.python.distribute.coordinator import cluster_coordinator as tf_cc  # noqa: E402

import rdmadev  # noqa: E402
from rdmadev.testing import launch  # noqa: E402

INTERRUPTED = threading.Event()
WEIGHTS_BYTES = 1 << 20
SHAPE = [256, WEIGHTS_BYTES // 4 // 256]
#: Steps scheduled per round (two per worker).
ROUND = 4
#: Steps a run can count (done's size): 5,000 rounds, more than a chaos case runs (~40 a second).
MAX_STEPS = 20000
#: Steps a failed worker may have had in flight, each run again: one per worker.
IN_FLIGHT = 2


def main():
    spec, mode = json.loads(sys.argv[1]), sys.argv[2]
    rounds = int(sys.argv[3]) if len(sys.argv) > 3 else 0  # 0: until failure or SIGINT
    strategy, coordinator = launch.pss_coordinator(spec, "grpc")
    with strategy.scope():
        w = tf.Variable(tf.zeros(SHAPE), name="w")
        done = tf.Variable(tf.zeros([MAX_STEPS]), name="done")

    def step(i):
        w.assign_add(w * 0.0 + 1.0)
        done.scatter_nd_add([[i]], [1.0])
        return i

    fn = tf.function(step, input_signature=[tf.TensorSpec([], tf.int32)])
    if mode == "rdmadev":
        fn = rdmadev.optimize(fn)
    n = scheduled = extra = 0
    try:
        while not rounds or n < rounds:
            if INTERRUPTED.is_set() or scheduled + ROUND > MAX_STEPS:
                print(f"EXTRA {extra}", flush=True)
                print(f"INTERRUPTED {n}", flush=True)
                return 0
            for i in range(scheduled, scheduled + ROUND):
                coordinator.schedule(fn, args=(tf.constant(i),))
            coordinator.join()
            scheduled += ROUND
            n += 1
            counts, weights = done.numpy()[:scheduled], w.numpy()
            extra = int(counts.sum()) - scheduled
            ok = bool((counts >= 1).all() and (weights == weights[0, 0]).all()
                      and abs(float(weights[0, 0]) - counts.sum()) <= IN_FLIGHT
                      and extra <= IN_FLIGHT * n)
            print(f"STEP {n} {time.monotonic():.6f} {ok}", flush=True)
    except Exception as e:  # the error the chaos test measures
        at = time.monotonic()
        print(f"ERROR {at:.6f} " + json.dumps({
            "type": type(e).__name__, "message": str(e)[:4000],
            "ps_failure": tf_cc._is_ps_failure(e), "worker_failure": tf_cc._is_worker_failure(e)}),
            flush=True)
        return 3
    print(f"EXTRA {extra}", flush=True)
    print("DONE", flush=True)
    return 0


if __name__ == "__main__":
    signal.signal(signal.SIGINT, lambda *_: INTERRUPTED.set())
    code = main()
    sys.stdout.flush()
    # Not sys.exit: after a worker restart, TF's ClusterCoordinator.__del__ can wait for ever
    # on its preemption handler (seen: WorkerPreemptionHandler.stop). The tasks release what
    # this process planned when its control connections close (control.py Session).
    os._exit(code)
