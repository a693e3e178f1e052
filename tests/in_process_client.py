"""TF's in-process cluster, built as TF's own tests and its parameter-server tutorial build it
(multi_worker_test_base: every ps and worker server in this process, and the coordinator
too), trained unchanged over any protocol: ``python in_process_client.py PROTOCOL pss|tf1``.
The script never imports rdmadev: the protocol is the opt-in.

``pss``: a ParameterServerStrategy over 2 workers and 2 ps trains a linear model through
ClusterCoordinator: gradient steps one at a time (their order fixes the result), then steps
scheduled all at once whose updates commute (each adds exactly 1). ``tf1``: a TF1
between-graph job, 1 ps and 2 workers, each worker's graph and session of its own, one worker
after the other (each task partitions its own graph: TF1's GraphMgr). Afterwards it prints
``RESULT {json}``: the variables and losses as hex bytes, from the reports of the
instantiations this process planned (every task's: they all run here) the runtime that
planned each, the tensors swapped (and over which fabric) and kept, and each task's channel
halves and the process's transfers (the counters; the tasks share the process's).
"""
import json
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
import tensorflow as tf  # noqa: E402
from tensorflow.python.distribute import multi_worker_test_base  # noqa: E402

SERIAL_STEPS = 6
CONCURRENT_STEPS = 20


def tf1(protocol):
    """The TF1 job (the module docstring); returns what each run of its update gave."""
    tf.compat.v1.disable_eager_execution()
    ports = [multi_worker_test_base.pick_unused_port() for _ in range(3)]
    spec = {"ps": [f"localhost:{ports[0]}"],
            "worker": [f"localhost:{ports[1]}", f"localhost:{ports[2]}"]}
    servers = {w: tf.distribute.Server(spec, job, i, protocol=protocol)
               for w, (job, i) in enumerate((("ps", 0), ("worker", 0), ("worker", 1)))}
    out = []
    for w in (0, 1):
        with tf.Graph().as_default():
            with tf.device("/job:ps/task:0"):
                v = tf.compat.v1.get_variable("v", initializer=tf.reshape(tf.range(64.0), [8, 8]))
            with tf.device(f"/job:worker/task:{w}"):
                update = v.assign_add((tf.matmul(v, v) + 1.0) / 100.0)
            with tf.compat.v1.Session(servers[1 + w].target) as session:
                if w == 0:
                    session.run(tf.compat.v1.global_variables_initializer())
                out += [session.run(update).tobytes().hex() for _ in range(3)]
    return {"updates": out}


def in_process_pss(protocol, **strategy_kwargs):
    """TF's in-process cluster of 2 workers and 2 ps serving `protocol`, built by TF's
    multi_worker_test_base, with this process as its chief: (ParameterServerStrategy over it,
    its ClusterCoordinator). Imports nothing of rdmadev (tests/pss_behaviours.py uses it too)."""
    cluster = multi_worker_test_base.create_in_process_cluster(num_workers=2, num_ps=2,
                                                               rpc_layer=protocol)
    cluster["chief"] = [f"localhost:{multi_worker_test_base.pick_unused_port()}"]
    resolver = tf.distribute.cluster_resolver.SimpleClusterResolver(
        tf.train.ClusterSpec(cluster), task_type="chief", task_id=0, rpc_layer=protocol)
    strategy = tf.distribute.ParameterServerStrategy(resolver, **strategy_kwargs)
    return strategy, tf.distribute.coordinator.ClusterCoordinator(strategy)


def pss(protocol):
    """The ParameterServerStrategy job (the module docstring); returns its variables and
    losses."""
    strategy, coordinator = in_process_pss(protocol)
    with strategy.scope():  # round-robin over the ps: w on ps:0, b on ps:1, count on ps:0
        w = tf.Variable(tf.reshape(tf.range(64 * 8, dtype=tf.float32), [64, 8]) / 100.0, name="w")
        b = tf.Variable(tf.zeros([8]), name="b")
        count = tf.Variable(tf.zeros([32, 32]), name="count")

    @tf.function
    def train(i):
        x = tf.sin(tf.reshape(tf.range(16 * 64, dtype=tf.float32), [16, 64]) + tf.cast(i, tf.float32))
        y = tf.cos(tf.reshape(tf.range(16 * 8, dtype=tf.float32), [16, 8]))
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(tf.square(tf.matmul(x, w) + b - y))
        gw, gb = tape.gradient(loss, [w, b])
        w.assign_sub(0.05 * gw)
        b.assign_sub(0.05 * gb)
        return loss

    @tf.function
    def add_one():  # commutes: the order the workers run it in changes nothing
        count.assign_add(tf.ones([32, 32]) + tf.reduce_sum(count) * 0.0)
        return tf.reduce_sum(count)

    losses = []
    for i in range(SERIAL_STEPS):
        losses.append(coordinator.schedule(train, args=(tf.constant(i),)))
        coordinator.join()
    for _ in range(CONCURRENT_STEPS):
        coordinator.schedule(add_one)
    coordinator.join()
    return {"w": w.numpy().tobytes().hex(), "b": b.numpy().tobytes().hex(),
            "count": count.numpy().tobytes().hex(),
            "losses": [l.fetch().tobytes().hex() for l in losses]}


def main(protocol, mode):
    results = {"pss": pss, "tf1": tf1}[mode](protocol)
    planned, carried = [], {}
    if "rdmadev" in sys.modules:  # the protocol loaded it; TF's own gRPC never does
        import rdmadev
        from rdmadev.cluster import reports
        planned = [{"task": r.task, "function": r.function, "swapped": len(r.swapped),
                    "fabrics": sorted({s[4] for s in r.swapped}), "kept": [list(k) for k in r.kept]}
                   for r in reports.reports()]
        if mode == "pss":  # the coordinator's runtime asks every task (TF1's has none)
            carried = {task: {k: c[k] for k in ("channels", "transfers")}
                       for task, c in rdmadev.counters().items()}
    print("RESULT " + json.dumps({"results": results, "planned": planned, "carried": carried}),
          flush=True)
    os._exit(0)  # in-process servers cannot be stopped; their threads would hold the exit


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
