"""A coordinator whose workers compute on a device other than the CPU, run unchanged over any
protocol: ``python device_client.py CLUSTER_JSON PROTOCOL MODE DEVICE_TYPE``.

MODE is ``in_graph`` (the coordinator partitions: a static tensor each way, one of run-time
shape, bundles of small ones, a conditional's branch, and in a second function a while loop,
the worker's side on the device), ``pss`` (ParameterServerStrategy through ClusterCoordinator:
the worker partitions), ``keras`` (tf_keras ``fit`` under ParameterServerStrategy) or ``tf1`` (a
TF1 between-graph worker, tests/between_graph_client.py). Variables live on ps:0's CPU; the
worker's ops run on ``/device:DEVICE_TYPE:0``. The steps never import rdmadev.
Afterwards it prints ``RESULT {json}``: the step results as hex bytes, the transfers rdmadev
carried per task, and from the reports of the instantiations planned meanwhile (this
process's and the tasks') what stayed on gRPC and why, and which swapped tensors crossed
via host.
"""
import json
import os
import socket
import sys

import numpy as np

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")  # PSS's fit is tf_keras's (Keras 3 has none)
import tensorflow as tf  # noqa: E402

STEPS = 3
PS = "/job:ps/replica:0/task:0/device:CPU:0"


def in_graph(cluster, protocol, device):
    tf.config.experimental_connect_to_cluster(tf.train.ClusterSpec(cluster), protocol=protocol)
    worker = f"/job:worker/replica:0/task:0/device:{device}:0"
    with tf.device(PS):
        table = tf.Variable(tf.reshape(tf.range(128 * 64, dtype=tf.float32), [128, 64]) / 7.0)
        small = [tf.Variable(tf.fill([4], float(i))) for i in range(4)]

    @tf.function
    def step(x, ids):
        with tf.device(PS):
            rows = tf.gather(table, tf.unique(ids)[0])  # run-time shape, ps -> worker
        with tf.device(worker):
            h = tf.nn.relu(tf.matmul(x, table))          # the table crosses ps -> worker
            r = tf.reduce_sum(rows * 2.0, axis=0)
            bits = [s * 3.0 for s in small]               # small tensors: a bundle each way
            taken = tf.equal(tf.size(ids) % 16, 0)  # steps 0 and 2 take the first branches

            def sent():  # crosses worker -> ps inside a branch: dead on the branch not taken
                y = h * 0.5
                with tf.device(PS):
                    return tf.reduce_sum(y)

            c = tf.cond(taken, lambda: tf.matmul(x, table) * 0.5, lambda: h * 2.0)  # ps -> worker inside
            d = tf.cond(taken, sent, lambda: tf.constant(0.0))
        with tf.device(PS):
            table.assign_sub(1e-4 * tf.matmul(x, c, transpose_a=True))  # c crosses worker -> ps
            for s, b in zip(small, bits):
                s.assign_add(b)
            return tf.reduce_sum(table), r, d

    @tf.function
    def loop(x):  # a function of its own: a graph with a loop bundles nothing (graph_pass.bundles)
        with tf.device(worker):
            return tf.while_loop(lambda i, a: i < 3,  # stays on gRPC: a loop on a device
                                 lambda i, a: (i + 1, a + tf.reduce_sum(table.read_value() * x[0, i])),
                                 (0, 0.0))

    rng = np.random.RandomState(0)
    x = tf.constant(rng.rand(128, 128).astype(np.float32))
    out = []
    for i in range(STEPS):
        ids = tf.constant(rng.randint(0, 128, size=32 + 8 * i).astype(np.int32))
        out += [v.numpy() for v in step(x, ids)] + [v.numpy() for v in loop(x)]
    return out + [table.numpy()] + [s.numpy() for s in small]


def _pss_strategy(cluster, protocol):
    with socket.socket() as s:  # the chief's own address: only the coordinator needs it
        s.bind(("127.0.0.1", 0))
        spec = dict(cluster, chief=[f"127.0.0.1:{s.getsockname()[1]}"])
    resolver = tf.distribute.cluster_resolver.SimpleClusterResolver(
        tf.train.ClusterSpec(spec), task_type="chief", task_id=0, rpc_layer=protocol)
    return tf.distribute.ParameterServerStrategy(resolver)


def pss(cluster, protocol, device):
    strategy = _pss_strategy(cluster, protocol)
    coordinator = tf.distribute.coordinator.ClusterCoordinator(strategy)
    with strategy.scope():
        w = tf.Variable(tf.reshape(tf.range(128 * 128, dtype=tf.float32), [128, 128]) / 1e4)

    @tf.function
    def step():
        def replica():
            with tf.device(f"/device:{device}:0"):
                x = tf.random.stateless_uniform([64, 128], seed=[1, 2])
                with tf.GradientTape() as tape:
                    loss = tf.reduce_sum(tf.square(tf.matmul(x, w)))
                grad = tape.gradient(loss, w)
            w.assign_sub(1e-5 * grad)
            return loss
        return strategy.run(replica)

    out = []
    for _ in range(STEPS):
        out.append(coordinator.schedule(step))
        coordinator.join()  # one step at a time: the same order on every protocol
    return [r.fetch() for r in out] + [w.read_value().numpy()]


def keras(cluster, protocol, device):
    import tf_keras

    class OnDevice(tf_keras.layers.Layer):
        """`inner` computing on `device` (PSS puts a replica on a worker's GPU by itself; a
        PluggableDevice or an XLA device is named)."""

        def __init__(self, inner, device):
            super().__init__()
            self.inner, self.device = inner, device

        def call(self, x):
            with tf.device(self.device):
                return self.inner(x)

    strategy = _pss_strategy(cluster, protocol)
    rng = np.random.RandomState(1)
    x, y = rng.rand(256, 32).astype(np.float32), rng.rand(256, 1).astype(np.float32)
    on = f"/device:{device}:0"
    with strategy.scope():
        tf_keras.utils.set_random_seed(3)
        model = tf_keras.Sequential([OnDevice(tf_keras.layers.Dense(64, activation="relu"), on),
                                     OnDevice(tf_keras.layers.Dense(1), on)])
        model.compile(tf_keras.optimizers.legacy.SGD(0.01), "mse", steps_per_execution=1)

    def data(_):
        return tf.data.Dataset.from_tensor_slices((x, y)).batch(32).repeat()

    history = model.fit(tf_keras.utils.experimental.DatasetCreator(data), epochs=2, steps_per_epoch=4,
                        verbose=0)
    return [np.asarray(history.history["loss"], np.float32)] + [v.numpy() for v in model.weights]


def tf1(cluster, protocol, device):
    """A TF1 between-graph worker (tests/between_graph_client.py) whose ops run on `device`."""
    import between_graph_client

    return between_graph_client.train(cluster, 0, device)


def _reports(cluster):
    import rdmadev
    from rdmadev.cluster import reports

    out = list(reports.reports())
    for rs in rdmadev.task_reports(cluster).values():
        out += rs
    return out


def main(cluster_json, protocol, mode, device):
    cluster = json.loads(cluster_json)
    ours = protocol != "grpc"
    before = {r.instance for r in _reports(cluster)} if ours else set()
    results = {"in_graph": in_graph, "pss": pss, "keras": keras, "tf1": tf1}[mode](cluster, protocol, device)
    import rdmadev  # only to read what moved where

    new = [r for r in _reports(cluster) if r.instance not in before] if ours else []
    print("RESULT " + json.dumps({
        "results": [np.asarray(r).tobytes().hex() for r in results],
        "transfers": {t: c["transfers"] for t, c in rdmadev.counters(cluster).items()},
        "kept": sorted({(name, reason) for r in new for name, _, reason in r.kept}),
        "via_host": {n: d for r in new for n, d in r.via_host.items()},
        "swapped": sorted({name for r in new for name, *_ in r.swapped}),
        "reports": [str(r) for r in new],
    }), flush=True)


if __name__ == "__main__":
    main(*sys.argv[1:])
