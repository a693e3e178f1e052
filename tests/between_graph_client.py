"""A between-graph TF1 training client as replica_device_setter users write it, run unchanged
over any protocol: ``python between_graph_client.py CLUSTER_JSON WORKER_INDEX``.

Each worker runs its own client against its own task's master, as tf_cnn_benchmarks'
parameter_server mode and MonitoredTrainingSession jobs do, so each task plans only its own
partition of every pair. The model is an embedding lookup (ids deduplicated with tf.unique,
rows gathered on the ps, IndexedSlices gradients back: shapes known only at run time) and a
dense layer whose weights cross ps -> worker and whose gradient crosses back. Each worker
trains its own variables so that two workers running at once stay deterministic.

The steps never import rdmadev. Afterwards it reads rdmadev's counters and reports from the
tasks (empty on a plain gRPC cluster) and prints ``RESULT {json}``.
"""
import json
import sys

import numpy as np
import tensorflow as tf

STEPS = 4
ROWS, DIM, IDS = 1000, 32, 256


def train(cluster, index, device=None):
    """STEPS steps of worker `index` (its ops on its `device`, a device type, if given; TF's
    soft placement puts those without a kernel there on the worker's CPU)."""
    tf.compat.v1.disable_eager_execution()
    spec = tf.train.ClusterSpec(cluster)
    with tf.Graph().as_default():
        tf.compat.v1.set_random_seed(7)
        setter = tf.compat.v1.train.replica_device_setter(
            worker_device=f"/job:worker/task:{index}" + (f"/device:{device}:0" if device else ""),
            cluster=spec)
        with tf.compat.v1.device(setter), tf.compat.v1.variable_scope(f"worker{index}"):
            table = tf.compat.v1.get_variable(
                "table", [ROWS, DIM], initializer=tf.compat.v1.random_uniform_initializer(seed=1))
            w = tf.compat.v1.get_variable(
                "w", [DIM, 8], initializer=tf.compat.v1.glorot_uniform_initializer(seed=2))
            ids = tf.random.stateless_uniform([IDS], seed=[index, 3], maxval=ROWS, dtype=tf.int64)
            unique, where = tf.unique(ids)
            rows = tf.compat.v1.nn.embedding_lookup(table, unique)  # on the ps, with the table
            x = tf.gather(rows, where)
            labels = tf.random.stateless_normal([IDS, 8], seed=[index, 4])
            loss = tf.reduce_mean(tf.square(tf.matmul(x, w) - labels))
            train_op = tf.compat.v1.train.GradientDescentOptimizer(0.5).minimize(loss)
        config = tf.compat.v1.ConfigProto(device_filters=["/job:ps", f"/job:worker/task:{index}"],
                                          allow_soft_placement=bool(device))
        master = f"grpc://{cluster['worker'][index]}"
        with tf.compat.v1.train.MonitoredTrainingSession(master=master, is_chief=True,
                                                         config=config) as sess:
            losses = [sess.run([train_op, loss])[1] for _ in range(STEPS)]
            return losses + sess.run([table, w])


def main(cluster_json, index):
    cluster = json.loads(cluster_json)
    results = train(cluster, int(index))
    import rdmadev  # only to read what moved where

    counters = rdmadev.counters(cluster)
    reports = rdmadev.task_reports(cluster)
    print("RESULT " + json.dumps({
        "results": [np.asarray(r).tobytes().hex() for r in results],
        "transfers": {t: c["transfers"] if isinstance(c, dict) else None
                      for t, c in counters.items()},
        "reports": {t: [str(r) for r in rs] for t, rs in reports.items()},
    }), flush=True)


if __name__ == "__main__":
    main(*sys.argv[1:])
