"""The chaos tier's job: a coordinator running an in-graph step in a loop until it fails or
is interrupted (SIGINT: a clean exit, which releases what it planned).

    python chaos_driver.py CLUSTER_JSON grpc|rdmadev [STEPS [CLIENT_ADDRESS]]

CLIENT_ADDRESS (host:port): where the tasks reach this process (as job `chief`), when
127.0.0.1 is not theirs (tasks in network namespaces).

Each step moves WEIGHTS_BYTES both ways between the ps and each worker: both workers read
`w` (ps -> worker) and compute w + 1, and the ps stores the mean of what they send back
(worker -> ps), so after n steps every element of w is exactly n. One line per step:
``STEP <n> <time.monotonic()> <ok>`` (ok: w == n everywhere); then ``DONE`` after STEPS
steps, ``INTERRUPTED <n>`` after SIGINT, or ``ERROR <time.monotonic()> <json: type,
message>`` (exit 3). CLOCK_MONOTONIC is system-wide, so the chaos tests compare these times
with their own.

SIGINT only asks the loop to stop after the step under way. As a KeyboardInterrupt it could
land inside print(), between a STEP line's text and its newline (print writes them apart):
one CI run read ``STEP 67 ... TrueINTERRUPTED 67`` and took that step for a wrong one.
"""
import json
import os
import signal
import sys
import threading
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
import tensorflow as tf  # noqa: E402

import rdmadev  # noqa: E402
from graph_pass.devices import task_name  # noqa: E402

PS, WORKERS = task_name("ps", 0), (task_name("worker", 0), task_name("worker", 1))
#: Set by SIGINT: the loop stops before its next step (see the docstring).
INTERRUPTED = threading.Event()
#: Bytes of `w` (float32): what each direction of each ps-worker pair carries per step.
WEIGHTS_BYTES = 1 << 20
SHAPE = [256, WEIGHTS_BYTES // 4 // 256]


def main():
    spec, mode = json.loads(sys.argv[1]), sys.argv[2]
    steps = int(sys.argv[3]) if len(sys.argv) > 3 else 0  # 0: until failure or SIGINT
    # This process's own device: the step returns its results here (see step()).
    coordinator = task_name("chief" if len(sys.argv) > 4 else "localhost", 0)
    if len(sys.argv) > 4:
        tf.config.experimental_connect_to_cluster(
            tf.train.ClusterSpec({**spec, "chief": [sys.argv[4]]}), job_name="chief")
    else:
        tf.config.experimental_connect_to_cluster(tf.train.ClusterSpec(spec))
    with tf.device(PS):
        w = tf.Variable(tf.zeros(SHAPE), name="w")

    def step():
        sent = []
        for worker in WORKERS:
            with tf.device(worker):
                sent.append(w + 1.0)
        with tf.device(PS):
            w.assign((sent[0] + sent[1]) * 0.5)
            same, value = tf.reduce_max(tf.abs(w - w[0, 0])) == 0.0, w[0, 0]
        # Moved to this process inside the call: a task killed once the step has run fails the
        # call (whose error rdmadev names), not a later read of results left on the ps, which
        # TF reports as a bare "Connection reset by peer".
        with tf.device(coordinator):
            return tf.identity(same), tf.identity(value)

    fn = rdmadev.optimize(tf.function(step)) if mode == "rdmadev" else tf.function(step)
    n = 0
    try:
        while not steps or n < steps:
            if INTERRUPTED.is_set():
                print(f"INTERRUPTED {n}", flush=True)
                return 0
            same, value = fn()
            n += 1
            ok = bool(same) and float(value) == n
            print(f"STEP {n} {time.monotonic():.6f} {ok}", flush=True)
    except Exception as e:  # the error the chaos test measures
        at = time.monotonic()
        print(f"ERROR {at:.6f} " + json.dumps({"type": type(e).__name__, "message": str(e)[:4000]}),
              flush=True)
        return 3
    print("DONE", flush=True)
    return 0


if __name__ == "__main__":
    signal.signal(signal.SIGINT, lambda *_: INTERRUPTED.set())
    sys.exit(main())
