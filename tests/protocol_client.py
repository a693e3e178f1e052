"""A coordinator as a user writes it, run unchanged over any protocol:
``python protocol_client.py CLUSTER_JSON PROTOCOL in_graph|pss``.

The steps never import rdmadev. Afterwards (outside what is measured) it asks every task for
rdmadev's counters, and prints one line ``RESULT {json}``: the step results as hex bytes, and
per task the transfers rdmadev carried and the bytes it received.
"""
import json
import socket
import sys

import numpy as np
import tensorflow as tf

STEPS = 3


def in_graph(cluster, protocol):
    """experimental_connect_to_cluster: the coordinator partitions the function itself."""
    tf.config.experimental_connect_to_cluster(tf.train.ClusterSpec(cluster), protocol=protocol)
    with tf.device("/job:ps/task:0"):
        table = tf.Variable(tf.reshape(tf.range(64 * 1024, dtype=tf.float32), [256, 256]) / 7.0)

    @tf.function
    def step(x):
        with tf.device("/job:worker/task:0"):
            h = tf.nn.relu(tf.matmul(x, table))  # the table crosses ps -> worker
        with tf.device("/job:ps/task:0"):
            table.assign_sub(1e-3 * h)  # h crosses worker -> ps
            return tf.reduce_sum(table)

    x = tf.constant(np.random.RandomState(0).rand(256, 256).astype(np.float32))
    return [step(x).numpy() for _ in range(STEPS)]


def pss(cluster, protocol):
    """ParameterServerStrategy from a cluster resolver: the worker partitions each step."""
    with socket.socket() as s:  # the chief's own address: only the coordinator needs it
        s.bind(("127.0.0.1", 0))
        spec = dict(cluster, chief=[f"127.0.0.1:{s.getsockname()[1]}"])
    resolver = tf.distribute.cluster_resolver.SimpleClusterResolver(
        tf.train.ClusterSpec(spec), task_type="chief", task_id=0, rpc_layer=protocol)
    strategy = tf.distribute.ParameterServerStrategy(resolver)
    coordinator = tf.distribute.coordinator.ClusterCoordinator(strategy)
    with strategy.scope():
        w = tf.Variable(tf.reshape(tf.range(128 * 128, dtype=tf.float32), [128, 128]) / 1e4)

    @tf.function
    def step():
        def replica():
            x = tf.random.stateless_uniform([64, 128], seed=[1, 2])
            with tf.GradientTape() as tape:
                loss = tf.reduce_sum(tf.matmul(x, w) ** 2)
            w.assign_sub(1e-5 * tape.gradient(loss, w))
            return loss
        return strategy.run(replica)

    out = []
    for _ in range(STEPS):
        out.append(coordinator.schedule(step))
        coordinator.join()  # one step at a time: the same order on every protocol
    return [r.fetch() for r in out] + [w.read_value().numpy()]


def main(cluster_json, protocol, mode):
    cluster = json.loads(cluster_json)
    results = {"in_graph": in_graph, "pss": pss}[mode](cluster, protocol)
    import rdmadev  # only to read what moved where

    counters = rdmadev.counters(cluster)
    print("RESULT " + json.dumps({
        "results": [np.asarray(r).tobytes().hex() for r in results],
        "transfers": {t: c["transfers"] for t, c in counters.items()},
    }), flush=True)


if __name__ == "__main__":
    main(*sys.argv[1:])
