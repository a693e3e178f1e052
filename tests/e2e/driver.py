"""Runs one training scenario as the coordinator of a running cluster and prints JSON.

    python driver.py CLUSTER_JSON MODE SCENARIO      (MODE: grpc | rdmadev)
    python driver.py CLUSTER_JSON runs '[["grpc", "train"], ["rdmadev", "train"]]'

`runs` runs several (mode, scenario) one after the other in one process (one TF import and
one remote context for the runs tests compare) and prints their results as a list; a run
that raised gives {"error": traceback} there, and the others still run.
"""
import hashlib
import json
import os
import sys
import threading
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import rdmadev  # noqa: E402
from graph_pass.devices import task_name  # noqa: E402
from rdmadev.cluster import parse_cluster, runtime  # noqa: E402
from rdmadev.cluster.reports import Report  # noqa: E402

PS, W0, W1 = task_name("ps", 0), task_name("worker", 0), task_name("worker", 1)
# How long a scenario waits for ps to move a channel to larger slots after a step of chunks
# (a control request, an allocation and an attach; minutes under the Soft-RoCE guest's TCG).
GROWTH_WAIT_S = float(os.environ.get("RDMADEV_E2E_GROWTH_WAIT_S", "30"))


def train_until_killed(mode):
    """The train step, printing each step, for as long as the cluster lives (bounded)."""
    return train(mode, steps=2000, progress=True)


def loop_until_killed(mode):
    """Calls of a loop of 50 iterations on worker:0, each reading 1 MiB of a ps variable and
    sending its sum back, printing each call, for as long as the cluster lives (bounded): a
    task killed during a call dies mid-loop."""
    with tf.device(PS):
        v = tf.Variable(tf.ones([1 << 18]))

    def body(i, total):
        with tf.device(W0):
            s = tf.reduce_sum(v * tf.cast(i, tf.float32))
        with tf.device(PS):
            return i + 1, total + s

    def step():
        with tf.device(W0):
            return tf.while_loop(lambda i, t: i < 50, body, [tf.constant(0), tf.constant(0.0)])[1]

    fn = rdmadev.optimize(tf.function(step)) if mode == "rdmadev" else tf.function(step)
    for n in range(2000):
        print(f"STEP {n} {float(fn())}", flush=True)
    return {}


def train(mode, steps=30, progress=False):
    """Variables on ps; each step both workers compute a gradient on their half of a
    deterministic batch; ps applies the mean. Returns losses and final weights."""
    with tf.device(PS):
        w = tf.Variable(tf.random.stateless_normal([64, 32], [1, 2]) * 0.1, name="w")
        b = tf.Variable(tf.zeros([32]), name="b")

    def grads(x, y):
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(tf.square(tf.nn.relu(tf.matmul(x, w) + b) - y))
        return loss, tape.gradient(loss, [w, b])

    def step(i):
        x = tf.random.stateless_uniform([128, 64], [i, 7])
        y = tf.random.stateless_uniform([128, 32], [i, 8])
        with tf.device(W0):
            l0, (gw0, gb0) = grads(x[:64], y[:64])
        with tf.device(W1):
            l1, (gw1, gb1) = grads(x[64:], y[64:])
        with tf.device(PS):
            w.assign_sub(0.1 * (gw0 + gw1) / 2)
            b.assign_sub(0.1 * (gb0 + gb1) / 2)
        return (l0 + l1) / 2

    fn = tf.function(step)
    if mode == "rdmadev":
        fn = rdmadev.optimize(fn)
    losses = []
    for i in range(steps):
        losses.append(float(fn(tf.constant(i, tf.int64))))
        if progress:
            print(f"STEP {i}", flush=True)
    out = {"losses": losses, "w": w.numpy().tolist(), "b": b.numpy().tolist()}
    if mode == "rdmadev":
        out["report"] = fn.report
    return out


def noop(mode):
    """Everything on one worker: no cross-task pair, nothing to rewrite."""
    with tf.device(W0):
        v = tf.Variable(tf.ones([16]))

    def step():
        with tf.device(W0):
            v.assign_add(tf.ones([16]))
            return tf.reduce_sum(v)

    fn = rdmadev.optimize(tf.function(step)) if mode == "rdmadev" else tf.function(step)
    values = [float(fn()) for _ in range(3)]
    return {"values": values, "report": fn.report if mode == "rdmadev" else ""}


def big(mode):
    """A 64 MiB tensor ps -> worker and a 64 MiB result worker -> ps, in both orders."""
    n = 16 << 20  # float32 elements: 64 MiB
    with tf.device(PS):
        a = tf.Variable(tf.range(n, dtype=tf.float32) * 1e-3)
        acc = tf.Variable(tf.zeros([n]))

    def step(scale):
        with tf.device(W0):
            y = a * scale + 1.0
        with tf.device(PS):
            acc.assign_add(y)
            return tf.reduce_sum(acc[:1000]) + acc[n - 1]

    fn = rdmadev.optimize(tf.function(step)) if mode == "rdmadev" else tf.function(step)
    values = [float(fn(tf.constant(s, tf.float32))) for s in (1.0, 2.0, 3.0)]
    import hashlib
    return {"values": values, "digest": hashlib.sha256(acc.numpy().tobytes()).hexdigest(),
            "report": fn.report if mode == "rdmadev" else ""}


def retrace(mode):
    """One function traced for two batch sizes, and a second optimized function."""
    with tf.device(PS):
        w = tf.Variable(tf.random.stateless_normal([8, 4], [3, 4]))

    def f(x):
        with tf.device(W1):
            return tf.reduce_sum(tf.matmul(x, w), axis=1)

    def g(x):
        with tf.device(W0):
            return tf.reduce_max(tf.matmul(x, w))

    wrap = (lambda fn: rdmadev.optimize(tf.function(fn))) if mode == "rdmadev" else tf.function
    ff, gg = wrap(f), wrap(g)
    out = []
    for batch in (2, 5, 2, 5):
        x = tf.random.stateless_uniform([batch, 8], [batch, 1])
        out.append(ff(x).numpy().tolist())
        out.append(float(gg(x)))
    return {"values": out, "reports": [ff.report, gg.report] if mode == "rdmadev" else []}


def _task_reports(task):
    """Every report `task` holds, as text."""
    return [str(Report.from_dict(d)) for d in runtime.current().call(task, {"op": "reports"})]


def _set_task_pass_mode(cluster, auto):
    """Turns RDMADEV_AUTO on or off in every task (a control request), so one cluster serves
    both the gRPC baseline and the rdmadev run of a strategy whose workers partition."""
    rt = runtime.start(cluster)
    for job, addrs in cluster.items():
        for i in range(len(addrs)):
            rt.call(task_name(job, i), {"op": "pass_mode", "auto": auto})


_strategies = {}


def _pss_strategy(cluster, workers):
    """A ParameterServerStrategy over `workers` workers and its ClusterCoordinator, made once
    per process (both paths of a scenario use the same one)."""
    if workers not in _strategies:
        _strategies[workers] = _new_pss_strategy(cluster, workers)
    return _strategies[workers]


def _new_pss_strategy(cluster, workers):
    from rdmadev.testing import launch
    return launch.pss_coordinator({"ps": cluster["ps"], "worker": cluster["worker"][:workers]})


def pss(mode, cluster, workers=1, steps=20):
    """ParameterServerStrategy + ClusterCoordinator: each scheduled step is partitioned by the
    worker that runs it; rdmadev: the step is wrapped by rdmadev.optimize (the tasks run with
    RDMADEV_AUTO off), and a second, unwrapped function must be left alone."""
    strategy, coordinator = _pss_strategy(cluster, workers)
    with strategy.scope():
        w = tf.Variable(tf.random.stateless_normal([32, 16], [5, 6]) * 0.1, name="w")
        b = tf.Variable(tf.zeros([16]), name="b")

    @tf.function
    def step(i):
        x = tf.random.stateless_uniform([64, 32], [i, 3])
        y = tf.random.stateless_uniform([64, 16], [i, 4])
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(tf.square(tf.matmul(x, w) + b - y))
        gw, gb = tape.gradient(loss, [w, b])
        w.assign_sub(0.1 * gw)
        b.assign_sub(0.1 * gb)
        return loss

    @tf.function
    def unwrapped():
        return tf.reduce_sum(w) + tf.reduce_sum(b)

    if mode == "rdmadev":
        step = rdmadev.optimize(step)
    losses = []
    for i in range(steps):
        losses.append(coordinator.schedule(step, args=(tf.constant(i, tf.int64),)))
        coordinator.join()  # one step at a time: the same order in both modes
    total = coordinator.schedule(unwrapped)
    coordinator.join()
    out = {"losses": [float(l.fetch()) for l in losses], "w": w.numpy().tolist(),
           "b": b.numpy().tolist(), "total": float(total.fetch())}
    if mode == "rdmadev":
        out["reports"] = [str(r) for r in step.reports]
        out["all_reports"] = [r for t in (task_name("worker", k) for k in range(workers))
                              for r in _task_reports(t)]
    return out


def as_tf_function(mode, cluster):
    """rdmadev.optimize returns a genuine tf.function: TF's class, signature, tracing count,
    concrete functions, a call inside strategy.run under ParameterServerStrategy, export."""
    import tempfile
    strategy, coordinator = _pss_strategy(cluster, 1)
    with strategy.scope():
        w = tf.Variable(tf.random.stateless_normal([16, 8], [1, 1]), name="w")

    def replica_step(x):
        w.assign_add(tf.matmul(x, w) * 1e-3)
        return tf.reduce_sum(w)

    replica = tf.function(replica_step)
    if mode == "rdmadev":
        replica = rdmadev.optimize(replica)

    @tf.function
    def step(x):  # the optimized function called inside strategy.run in a plain tf.function
        return strategy.run(replica, args=(x,))

    values = []
    for _ in range(3):
        values.append(coordinator.schedule(step, args=(tf.ones([16, 16]),)))
        coordinator.join()
    out = {"values": [float(v.fetch()) for v in values]}
    if mode == "rdmadev":
        out["reports"] = [str(r) for r in replica.reports]
        out["is_tf_function"] = isinstance(replica, tf.types.experimental.PolymorphicFunction)
        out["name"] = replica.__name__
        sig = replica.get_concrete_function(tf.TensorSpec([None, 16], tf.float32))
        out["concrete_inputs"] = [str(t.shape) for t in sig.inputs]
    local = rdmadev.optimize(lambda x: x * 2.0)
    traced = [local.experimental_get_tracing_count()]
    for shape in ([2], [3], [2]):
        local(tf.ones(shape))
        traced.append(local.experimental_get_tracing_count())
    out["tracing_counts"] = traced
    module = tf.Module()
    module.double = rdmadev.optimize(tf.function(lambda x: x * 2.0,
                                                 input_signature=[tf.TensorSpec([None], tf.float32)]))
    with tempfile.TemporaryDirectory() as d:
        tf.saved_model.save(module, d)
        out["exported"] = [float(v) for v in tf.saved_model.load(d).double(tf.ones([2]))]
    return out


def keras_fit(mode, cluster, optimize=False, steps_per_execution=1):
    """Keras 3 `fit` with its variables on ps, run under a worker device scope: the worker
    partitions the train function. rdmadev: RDMADEV_AUTO in the tasks (`fit` unchanged), or with
    `optimize` the model's train_step wrapped by rdmadev.optimize (tasks not in AUTO). With
    `steps_per_execution` > 1 the train function runs that many steps in a while loop."""
    _set_task_pass_mode(cluster, mode == "rdmadev" and not optimize)
    _connect(cluster)
    tf.keras.backend.clear_session()  # names as in a fresh process (sgd, not sgd_1)
    tf.keras.utils.set_random_seed(7)
    x = np.random.default_rng(0).standard_normal((256, 20)).astype("float32")
    y = (x @ np.random.default_rng(1).standard_normal((20, 1))).astype("float32")
    with tf.device(PS):
        model = tf.keras.Sequential([tf.keras.Input((20,)), tf.keras.layers.Dense(32, activation="relu"),
                                     tf.keras.layers.Dense(1)])
        model.compile(optimizer=tf.keras.optimizers.SGD(0.01), loss="mse",
                      steps_per_execution=steps_per_execution)
        model.optimizer.build(model.trainable_variables)
    if mode == "rdmadev" and optimize:
        # Keras 3's train function is Python around tf.functions that call train_step through
        # strategy.run: an optimized train_step opts their instantiation in.
        model.train_step = rdmadev.optimize(model.train_step)
    class MetricsResetFirst(tf.keras.callbacks.Callback):
        """Waits, at each epoch's start, until the coordinator's reset of the metric variables
        (eager assigns sent to the ps) has run: TF orders remote eager ops per task only, so the
        worker's next train step could read a metric before its reset, on any transport."""

        def on_epoch_begin(self, epoch, logs=None):
            for v in model.metrics_variables:
                v.numpy()

    with tf.device(W0):
        history = model.fit(x, y, epochs=3, batch_size=32, shuffle=False, verbose=0,
                            callbacks=[MetricsResetFirst()])
    out = {"loss": history.history["loss"],
           "weights": [w.tolist() for w in model.get_weights()]}
    if mode == "rdmadev":
        out["reports"] = ([str(r) for r in model.train_step.reports] if optimize
                          else _task_reports(task_name("worker", 0)))
    _set_task_pass_mode(cluster, False)
    return out


def keras2_fit(mode, cluster):
    """tf_keras (Keras 2) `model.fit` under ParameterServerStrategy, 1 ps + 1 worker (one
    worker runs the scheduled steps in order: the same order in both modes): fit makes the
    ClusterCoordinator and schedules its train function on the worker. rdmadev: the model's
    train_step wrapped by rdmadev.optimize (tasks not in AUTO), fit itself unchanged.
    Counters of every task are read before fit, after it, and after the model is dropped."""
    import gc

    import tf_keras as keras
    strategy, _ = _pss_strategy(cluster, 1)
    keras.backend.clear_session()  # names as in a fresh process
    keras.utils.set_random_seed(7)
    x = np.random.default_rng(0).standard_normal((256, 20)).astype("float32")
    y = (x @ np.random.default_rng(1).standard_normal((20, 1))).astype("float32")
    with strategy.scope():
        model = keras.Sequential([keras.Input((20,)), keras.layers.Dense(32, activation="relu"),
                                  keras.layers.Dense(1)])
        model.compile(optimizer=keras.optimizers.SGD(0.01), loss="mse")
    if mode == "rdmadev":
        model.train_step = rdmadev.optimize(model.train_step)

    def dataset_fn(context):  # the same batches in the same order every epoch
        return tf.data.Dataset.from_tensor_slices((x, y)).batch(32).repeat()

    counters = [rdmadev.counters(cluster)] if mode == "rdmadev" else []
    history = model.fit(keras.utils.experimental.DatasetCreator(dataset_fn), epochs=3,
                        steps_per_epoch=8, verbose=0)
    out = {"loss": history.history["loss"],
           "weights": [w.tolist() for w in model.get_weights()]}
    if mode == "rdmadev":
        counters.append(rdmadev.counters(cluster))
        out["reports"] = [str(r) for r in model.train_step.reports]
        del model, history
        gc.collect()
        time.sleep(1.5)  # the release runs on the tracker's thread (instances.py)
        counters.append(rdmadev.counters(cluster))
        out["counters"] = counters
    return out


def conv(mode):
    """Conv + bias_add: oneDNN fuses the filter and bias gradients into one op whose shape
    function is wrong for the bias (regression: the pass must not trust it). A second conv on
    top makes the worker read its filter twice: forward, and for the input gradient."""
    with tf.device(PS):
        f = tf.Variable(tf.random.stateless_normal([3, 3, 3, 8], [1, 9]) * 0.1)
        bias = tf.Variable(tf.zeros([8]))
        f2 = tf.Variable(tf.random.stateless_normal([3, 3, 8, 4], [2, 9]) * 0.1)

    def step(i):
        with tf.device(W0):
            x = tf.random.stateless_uniform([4, 16, 16, 3], [i, 5])
            with tf.GradientTape() as tape:
                y = tf.nn.relu(tf.nn.bias_add(tf.nn.conv2d(x, f, 1, "SAME"), bias))
                loss = tf.reduce_mean(tf.square(tf.nn.conv2d(y, f2, 1, "SAME") - 0.5))
            gf, gb, gf2 = tape.gradient(loss, [f, bias, f2])
        with tf.device(PS):
            f.assign_sub(0.1 * gf)
            bias.assign_sub(0.1 * gb)
            f2.assign_sub(0.1 * gf2)
        return loss

    fn = rdmadev.optimize(tf.function(step)) if mode == "rdmadev" else tf.function(step)
    losses = [float(fn(tf.constant(i, tf.int64))) for i in range(5)]
    return {"losses": losses, "bias": bias.numpy().tolist(),
            "report": fn.report if mode == "rdmadev" else ""}


def mixed(mode):
    """A string and a dynamic-shape tensor cross tasks next to a static one: the first two
    stay on gRPC (and are reported), the static one moves through rdmadev."""
    with tf.device(PS):
        v = tf.Variable(tf.range(100, dtype=tf.float32))

    def step(i):
        with tf.device(PS):
            text = tf.strings.as_string(v[:3])
            picked = tf.boolean_mask(v, v > tf.cast(i, tf.float32) * 10.0)
            doubled = v * 2.0
        with tf.device(W0):
            length = tf.strings.length(tf.strings.reduce_join(text, separator=","))
            total = tf.reduce_sum(picked) + tf.reduce_sum(doubled)
        return length, total

    fn = rdmadev.optimize(tf.function(step)) if mode == "rdmadev" else tf.function(step)
    values = [[float(t) for t in fn(tf.constant(i, tf.int64))] for i in range(4)]
    return {"values": values, "report": fn.report if mode == "rdmadev" else ""}


def bundles(mode):
    """Small tensors of five dtypes ps -> worker in one step, a 16 KiB one next to them, and a
    round trip that depends on them: the worker sends back what it computed from the first
    reads, ps sends back what it computed from that. The first reads share one bundle; the
    tensors each round trip waits for cannot join it (graph_pass.bundles)."""
    with tf.device(PS):
        f = tf.Variable(tf.random.stateless_normal([4, 8], [1, 2]))
        h = tf.Variable(tf.cast(tf.range(6), tf.float16))
        n = tf.Variable(tf.range(8, dtype=tf.int32))
        k = tf.Variable(tf.constant([3, -4], tf.int64))
        flags = tf.Variable(tf.constant([True, False, True]))
        big = tf.Variable(tf.random.stateless_normal([64, 64], [3, 4]))  # 16 KiB: a channel of its own

    def step(i):
        with tf.device(W0):
            x = tf.cast(i, tf.float32)
            first = (tf.reduce_sum(f * x) + tf.reduce_sum(tf.cast(h, tf.float32)) +
                     tf.cast(tf.reduce_sum(n) + tf.cast(tf.reduce_sum(k), tf.int32), tf.float32) +
                     tf.reduce_sum(tf.cast(flags, tf.float32)) + tf.reduce_mean(big))
        with tf.device(PS):
            f.assign_add(tf.fill([4, 8], first * 1e-3))  # worker -> ps
            n.assign_add(tf.ones([8], tf.int32))
            flags.assign(tf.logical_not(flags))
            answer = tf.stack([first, first * 2.0])  # depends on the first reads' arrival
        with tf.device(W0):
            return answer * 3.0 + tf.reduce_sum(f)  # ps -> worker again, after the updates

    fn = rdmadev.optimize(tf.function(step)) if mode == "rdmadev" else tf.function(step)
    values = [fn(tf.constant(i, tf.int64)).numpy().tolist() for i in range(5)]
    return {"values": values, "f": f.numpy().tolist(), "n": n.numpy().tolist(),
            "flags": flags.numpy().tolist(), "report": fn.report if mode == "rdmadev" else ""}


def batch_norm(mode):
    """Conv + fused batch norm in training, as resnet50 has 53 of: the worker sends the batch
    statistics (oneDNN's batch norm, outputs 1 and 2) and the scale and offset gradients
    (its gradient op, outputs 1 and 2) to ps, where the moving averages and the parameters
    are updated. Those four are [8] floats, which the planner knows (static, 32 B)."""
    with tf.device(PS):
        f = tf.Variable(tf.random.stateless_normal([3, 3, 3, 8], [1, 9]) * 0.1)
        gamma, beta = tf.Variable(tf.ones([8])), tf.Variable(tf.zeros([8]))
        mean, var = tf.Variable(tf.zeros([8])), tf.Variable(tf.ones([8]))

    def step(i):
        with tf.device(W0):
            x = tf.random.stateless_uniform([4, 16, 16, 3], [i, 5])
            with tf.GradientTape() as tape:
                y, m, v = tf.compat.v1.nn.fused_batch_norm(tf.nn.conv2d(x, f, 1, "SAME"), gamma, beta,
                                                           is_training=True)[:3]
                loss = tf.reduce_mean(tf.square(tf.nn.relu(y) - 0.5))
            gf, gg, gb = tape.gradient(loss, [f, gamma, beta])
        with tf.device(PS):
            for p, g in ((f, gf), (gamma, gg), (beta, gb)):
                p.assign_sub(0.1 * g)
            mean.assign(0.9 * mean + 0.1 * m)
            var.assign(0.9 * var + 0.1 * v)
        return loss

    fn = rdmadev.optimize(tf.function(step)) if mode == "rdmadev" else tf.function(step)
    losses = [float(fn(tf.constant(i, tf.int64))) for i in range(5)]
    return {"losses": losses, "state": [t.numpy().tolist() for t in (gamma, beta, mean, var)],
            "report": fn.report if mode == "rdmadev" else ""}


def loop(mode):
    """Cross-task pairs inside while loops (Keras's steps_per_execution builds one): a loop
    the coordinator runs, whose body reads a ps variable on worker:0 and sends the product
    back, with iterations allowed to run ahead (10) and not (1); the same loop run on
    worker:0; on worker:0, a loop nested in a loop whose iterations read the variable and add
    to a ps accumulator (3 inner iterations per outer one); and a loop whose tensors have
    run-time shapes, growing by 1 MiB an iteration from the ps (past the channel's first
    capacity, RDMADEV_DYNAMIC_CAPACITY's 1 MiB) and shrinking back. Returns each call's values
    for 3, 5 and 0 iterations."""
    with tf.device(PS):
        v = tf.Variable(tf.reshape(tf.range(64 * 64, dtype=tf.float32), [64, 64]) * 1e-3)
        long = tf.Variable(tf.range(5 << 18, dtype=tf.float32) * 1e-6)

    def step(n):
        with tf.device(W0):
            before = tf.reduce_sum(v * 2.0)  # outside any loop: swapped

        def body(i, acc):
            with tf.device(W0):
                y = tf.matmul(v, v) * tf.cast(i + 1, tf.float32)
            with tf.device(PS):
                acc = acc + tf.reduce_sum(y)
            return i + 1, acc

        out = [before]
        for parallel in (1, 10):
            out.append(tf.while_loop(lambda i, a: i < n, body, [tf.constant(0), tf.constant(0.0)],
                                     parallel_iterations=parallel)[1])
        with tf.device(W0):
            out.append(tf.while_loop(lambda i, a: i < n, body, [tf.constant(0), tf.constant(0.0)])[1])

        def outer(i, acc):
            with tf.device(W0):
                inner = tf.while_loop(lambda j, a: j < 3, lambda j, a: (j + 1, a + body(i * 3 + j, 0.0)[1]),
                                      [tf.constant(0), tf.constant(0.0)])[1]
            with tf.device(PS):
                return i + 1, acc + inner

        with tf.device(W0):
            out.append(tf.while_loop(lambda i, a: i < n, outer, [tf.constant(0), tf.constant(0.0)])[1])

        def growing(i, acc):
            with tf.device(PS):
                rows = long[: (i + 1) * (1 << 18)] * 2.0
            with tf.device(W0):
                back = rows[: (n - i) * 1000] * tf.cast(i + 1, tf.float32)
            with tf.device(PS):
                return i + 1, acc + tf.reduce_sum(back)

        with tf.device(W0):
            out.append(tf.while_loop(lambda i, a: i < n, growing, [tf.constant(0), tf.constant(0.0)])[1])
        return out

    fn = rdmadev.optimize(tf.function(step)) if mode == "rdmadev" else tf.function(step)
    values = [[float(t) for t in fn(tf.constant(n))] for n in (3, 5, 0)]
    return {"values": values, "report": fn.report if mode == "rdmadev" else ""}


def cond(mode):
    """A tf.cond on worker:0 whose true branch reads a ps variable (TF lowers it to Switch and
    Merge; the read's pairs are dead when the branch is not taken), then the result goes to ps
    after the conditional; and a second tf.cond whose true branch runs a while loop on worker:0
    that reads the variable, then sends the loop's result to ps and back (values after the
    loop's Exit but still in the branch). Returns each call's values: taken, not taken twice,
    taken."""
    with tf.device(PS):
        v = tf.Variable(tf.reshape(tf.range(64 * 64, dtype=tf.float32), [64, 64]) * 1e-3)

    def looping():
        with tf.device(W0):
            total = tf.while_loop(lambda i, a: i < 3, lambda i, a: (i + 1, a + tf.reduce_sum(v)),
                                  [tf.constant(0), tf.constant(0.0)])[1]
        with tf.device(PS):
            tripled = total * 3.0
        with tf.device(W0):
            return tripled + 1.0

    def step(flag):
        with tf.device(W0):
            x = tf.cond(flag, lambda: tf.reduce_sum(tf.matmul(v, v)), lambda: tf.constant(-1.0))
            y = tf.cond(flag, looping, lambda: tf.constant(-1.0))
        with tf.device(PS):
            return x * 2.0, y * 2.0

    fn = tf.function(step, input_signature=[tf.TensorSpec([], tf.bool)])
    fn = rdmadev.optimize(fn) if mode == "rdmadev" else fn
    values = [[float(t) for t in fn(tf.constant(flag))] for flag in (True, False, False, True)]
    return {"values": values, "report": fn.report if mode == "rdmadev" else ""}


def overlapping(mode):
    """Two Python threads call one function at once, 12 calls each with inputs of their own.
    Its 256 KiB variable read ps -> worker:0 is received zero-copy into a one-slot channel,
    so overlapping steps would find the slot held; rdmadev.optimize runs the calls one at a
    time. Returns each thread's values in call order."""
    with tf.device(PS):
        v = tf.Variable(tf.reshape(tf.range(256 * 256, dtype=tf.float32), [256, 256]) * 1e-4)

    def step(x):
        with tf.device(W0):
            y = tf.matmul(v, x)
        with tf.device(PS):
            return tf.reduce_sum(y * y)

    fn = tf.function(step, input_signature=[tf.TensorSpec([256, 4], tf.float32)])
    fn = rdmadev.optimize(fn) if mode == "rdmadev" else fn
    fn(tf.zeros([256, 4]))  # traced and set up before the threads start
    values, errors = [[], []], []

    def calls(t):
        try:
            for i in range(12):
                values[t].append(float(fn(tf.fill([256, 4], float(t * 100 + i)))))
        except Exception as e:  # reported, the other thread goes on
            errors.append(str(e)[:2000])

    threads = [threading.Thread(target=calls, args=(t,)) for t in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return {"values": values, "errors": errors, "report": fn.report if mode == "rdmadev" else ""}


def sparse(mode):
    """An embedding step, every cross-task tensor of a run-time shape: the worker dedupes its
    ids (tf.unique) and sends them to ps, ps gathers the rows and sends them back, the
    worker's IndexedSlices gradient goes to ps. Batches and sequence lengths change from step
    to step (a ragged last batch, one step with no ids at all, one with the most)."""
    rng = np.random.default_rng(7)
    with tf.device(PS):
        table = tf.Variable(rng.standard_normal((5000, 16)).astype(np.float32))
        dense = tf.Variable(rng.standard_normal((16, 1)).astype(np.float32))

    def step(ids, labels):
        with tf.GradientTape() as tape:
            with tf.device(W0):
                uniq, idx = tf.unique(tf.reshape(ids, [-1]))
            with tf.device(PS):
                rows = tf.gather(table, uniq)
            with tf.device(W0):
                emb = tf.reshape(tf.gather(rows, idx), tf.concat([tf.shape(ids), [16]], 0))
                logits = tf.matmul(tf.reduce_mean(emb, axis=1), dense)[:, 0]
                n = tf.cast(tf.size(labels), tf.float32)
                loss = tf.reduce_sum(tf.square(logits - labels)) / (n + 1.0)
        with tf.device(W0):
            g_table, g_dense = tape.gradient(loss, [table, dense])
        with tf.device(PS):
            table.scatter_sub(tf.IndexedSlices(0.5 * g_table.values, g_table.indices))
            dense.assign_sub(0.1 * g_dense)
        return loss, tf.size(uniq)

    spec = [tf.TensorSpec([None, None], tf.int64), tf.TensorSpec([None], tf.float32)]
    fn = tf.function(step, input_signature=spec)
    fn = rdmadev.optimize(fn) if mode == "rdmadev" else fn
    losses, unique = [], []
    for batch, length in [(32, 4), (32, 7), (64, 16), (0, 5), (17, 3), (32, 1)]:
        ids = rng.integers(0, 5000, (batch, length))
        loss, n = fn(tf.constant(ids), tf.constant(rng.standard_normal(batch), tf.float32))
        losses.append(float(loss))
        unique.append(int(n))
    return {"losses": losses, "unique": unique,
            "table": hashlib.sha256(table.numpy().tobytes()).hexdigest(),
            "dense": dense.numpy().ravel().tolist(),
            "report": fn.report if mode == "rdmadev" else ""}


#: Ops whose output may be a view of their input's buffer, as the views scenario uses them.
VIEWS = ("Reshape", "ExpandDims", "Squeeze", "Slice", "StridedSlice", "Cast", "Transpose")
#: Ops that read received rows into a fresh tensor, as the views scenario uses them: segment
#: reductions (an embedding bag's combiner), a stack and a concatenation with other rows.
FRESH = ("UnsortedSegmentSum", "SparseSegmentSum", "Pack", "ConcatV2")


def views(mode):
    """Tensors computed on ps each step (every step's bytes differ), each read on the worker
    through one op that may return a view of its input's buffer into an op that keeps
    nothing, or summed by a segment reduction, or stacked or concatenated with other rows;
    one through a view that is the function's result (it outlives the step), one through a
    slice plus one assigned to a variable (AddV2 may compute into the slice and the variable
    keep that buffer); and the rows of a lookup sharded over two tables, stitched on the
    worker (ParallelDynamicStitch). Returns each step's sums, the result's digest and the
    variable. Grappler's arithmetic optimizer is off here, as it would drop the same-type Cast."""
    tf.config.optimizer.set_experimental_options({"arithmetic_optimization": False})
    with tf.device(PS):
        v = tf.Variable(tf.random.stateless_normal([64, 64], [3, 1]))
        shards = [tf.Variable(tf.random.stateless_normal([50, 16], [4, k])) for k in range(2)]
    with tf.device(W0):
        held = tf.Variable(tf.zeros([16, 64]))

    def step(i, ids):
        with tf.device(PS):
            base = v + tf.cast(i, tf.float32)
            sent = {op: tf.multiply(tf.expand_dims(base, 0) if op == "Squeeze" else base, float(k + 2),
                                    name=f"for_{op}") for k, op in enumerate(VIEWS + FRESH)}
            result = tf.multiply(base, 9.0, name="for_result")
            for_held = tf.multiply(base, 10.0, name="for_held")
        with tf.device(W0):
            m = tf.ones([64, 8])
            read = [tf.reshape(sent["Reshape"], [4096]) * 2.0,
                    tf.expand_dims(sent["ExpandDims"], 0) * 2.0,
                    tf.matmul(tf.squeeze(sent["Squeeze"], 0), m),
                    tf.matmul(tf.slice(sent["Slice"], [8, 0], [32, 64]), m),
                    tf.matmul(sent["StridedSlice"][:16], m),
                    tf.matmul(tf.raw_ops.Cast(x=sent["Cast"], DstT=tf.float32), m),
                    tf.transpose(sent["Transpose"]) * 2.0,
                    # A Pack of one would reach the pass as an ExpandDims (grappler's
                    # constant folding rewrites it).
                    tf.stack([tf.ones([64, 64]), sent["Pack"]]) * 2.0,
                    tf.math.unsorted_segment_sum(sent["UnsortedSegmentSum"], tf.range(64) % 8, 8),
                    tf.sparse.segment_sum(sent["SparseSegmentSum"], tf.range(64), tf.range(64) // 8),
                    tf.concat([sent["ConcatV2"], tf.ones([8, 64])], 0),
                    tf.nn.embedding_lookup(shards, ids) * 2.0]
            sums = tf.stack([tf.reduce_sum(r) for r in read])
            kept = tf.reshape(result, [-1])
            # A slice is a sub-buffer, which TF counts as owned memory: AddV2 may write its sum
            # into it and the variable then takes that buffer over.
            held.assign(for_held[:16] + 1.0)
        return sums, kept

    spec = [tf.TensorSpec([], tf.int64), tf.TensorSpec([None], tf.int64)]
    fn = tf.function(step, input_signature=spec)
    fn = rdmadev.optimize(fn) if mode == "rdmadev" else fn
    rng = np.random.default_rng(11)
    sums, kept = [], []
    for i, n in enumerate([40, 7, 100, 0, 63]):
        s, k = fn(tf.constant(i, tf.int64), tf.constant(rng.integers(0, 100, n)))
        sums.append(s.numpy().tolist())
        kept.append(hashlib.sha256(k.numpy().tobytes()).hexdigest())
    return {"sums": sums, "kept": kept, "held": held.numpy().ravel().tolist(),
            "report": fn.report if mode == "rdmadev" else ""}


def growing(mode):
    """One dynamic tensor worker -> ps whose size grows past its slots twice (the driver runs
    with RDMADEV_DYNAMIC_CAPACITY=4K): after each step the worker staged a tensor for, the
    driver waits for ps to move the channel to larger slots. Returns each step's sum, and
    with rdmadev the transfers ps took for each step (chunks), the channels ps grew after it
    and the tensors worker:0 staged. The step is named RDMADEV_E2E_STEP_NAME, else after this
    process: ps keeps what a channel learned for later runs of a step of that name on the
    cluster (growth.py)."""
    def step(n, scale):
        with tf.device(W0):
            x = tf.range(n, dtype=tf.float32) * scale
        with tf.device(PS):
            return tf.reduce_sum(x * x)

    step.__name__ = os.environ.get("RDMADEV_E2E_STEP_NAME", f"growing_{os.getpid()}")
    spec = [tf.TensorSpec([], tf.int32), tf.TensorSpec([], tf.float32)]
    fn = tf.function(step, input_signature=spec)
    fn = rdmadev.optimize(fn) if mode == "rdmadev" else fn
    values, chunks, grown, staged = [], [], [], []
    ps = lambda: rdmadev.counters()[PS]  # noqa: E731
    worker = lambda: rdmadev.counters()[W0]  # noqa: E731
    for i, n in enumerate([3000, 3000, 2000, 100000, 100000, 0, 90000]):
        if mode == "rdmadev":
            before, before_worker = ps(), worker()
        values.append(float(fn(tf.constant(n), tf.constant(1.0 + i / 8))))
        if mode != "rdmadev":
            continue
        staged.append(worker()["staged"] - before_worker["staged"])
        after = ps()
        deadline = time.monotonic() + GROWTH_WAIT_S
        while staged[-1] and after["grown"] == before["grown"] and time.monotonic() < deadline:
            time.sleep(0.1)
            after = ps()
        chunks.append(after["received"] - before["received"])
        grown.append(after["grown"] - before["grown"])
    return {"values": values, "chunks": chunks, "grown": grown, "staged": staged,
            "report": fn.report if mode == "rdmadev" else ""}


def underbound(mode):
    """A tensor larger than the bound TF's shapes give it: 4096 - len(tf.unique(ids)) floats,
    from 2048 ids. The bound of the unique ids is 2048, so the pass bounds the tensor by
    4096 - 2048 = 2048 floats (8 KiB), but shape arithmetic that subtracts a bounded size is
    not monotone: with 10 distinct ids the tensor has 4086. Returns each step's sum, and with
    rdmadev the tensors worker:0 staged, the channels ps grew (waiting for the growth after a
    staged step, as `growing`) and the report."""
    def step(ids):
        with tf.device(W0):
            uniq, _ = tf.unique(ids)
            x = tf.ones([4096 - tf.size(uniq)]) * tf.cast(tf.reduce_sum(uniq), tf.float32)
        with tf.device(PS):
            return tf.reduce_sum(x)

    fn = tf.function(step, input_signature=[tf.TensorSpec([2048], tf.int64)])
    fn = rdmadev.optimize(fn) if mode == "rdmadev" else fn
    rng = np.random.default_rng(3)
    values, grown, staged = [], [], []
    for distinct in (10, 10, 2048, 10):
        ids = rng.permutation(2048) if distinct == 2048 else rng.integers(0, distinct, 2048)
        if mode == "rdmadev":
            before, before_worker = rdmadev.counters()[PS], rdmadev.counters()[W0]
        values.append(float(fn(tf.constant(ids, tf.int64))))
        if mode != "rdmadev":
            continue
        staged.append(rdmadev.counters()[W0]["staged"] - before_worker["staged"])
        after, deadline = rdmadev.counters()[PS], time.monotonic() + GROWTH_WAIT_S
        while staged[-1] and after["grown"] == before["grown"] and time.monotonic() < deadline:
            time.sleep(0.1)
            after = rdmadev.counters()[PS]
        grown.append(after["grown"] - before["grown"])
    return {"values": values, "grown": grown, "staged": staged,
            "report": fn.report if mode == "rdmadev" else ""}


def profile(mode, cluster):
    """A step whose transfers are known (a 1 MiB variable read ps -> worker, copied out as its
    consumer, ReverseV2, is not one that keeps nothing; 3.2 MB of tf.unique'd ids worker -> ps
    on a dynamic channel of 1 MiB slots: in 1 MiB chunks the first time, then in one slot
    once ps grew the channel, aliased by its consumer Mul), run while TF's profiler traces
    every task; returns what the trace says each channel moved."""
    from rdmadev.tf import profile as prof
    import tempfile

    with tf.device(PS):
        v = tf.Variable(tf.ones([256, 1024]))

    def step(x):
        with tf.device(W0):
            uniq = tf.unique(x)[0]
            read = tf.reduce_sum(tf.reverse(v, [0]) * 2.0)
        with tf.device(PS):
            total = tf.reduce_sum(uniq * 2)  # not Sum alone: it may return its input
        return read, total

    fn = tf.function(step, input_signature=[tf.TensorSpec([None], tf.int64)])
    fn = rdmadev.optimize(fn) if mode == "rdmadev" else fn
    ids = tf.range(400000, dtype=tf.int64)
    before = rdmadev.counters()[PS] if mode == "rdmadev" else None
    first = [float(t) for t in fn(ids)]
    first_chunks = grown = 0
    if mode == "rdmadev":  # the ids came in 4 chunks: ps moves their channel to larger slots
        after = rdmadev.counters()[PS]
        first_chunks = after["received"] - before["received"]
        deadline = time.monotonic() + GROWTH_WAIT_S
        while after["grown"] == before["grown"] and time.monotonic() < deadline:
            time.sleep(0.1)
            after = rdmadev.counters()[PS]
        grown = after["grown"] - before["grown"]
    names = {addr: f"{job}:{i}" for job, addrs in cluster.items() for i, addr in enumerate(addrs)}
    with tempfile.TemporaryDirectory() as logdir:
        run = prof.capture(list(names), logdir, seconds=3, work=lambda: fn(ids))
        transfers = prof.read(run.run_dir)
    channels = {}
    for t in transfers:
        c = channels.setdefault(f"{names.get(t.task, t.task)} {t.kind} {t.channel}", {
            "peer": t.peer, "bytes": [], "chunks": [], "n": 0, "phases": {}})
        c["n"] += 1
        c["bytes"] = sorted(set(c["bytes"]) | {t.bytes})
        c["chunks"] = sorted(set(c["chunks"]) | {t.chunks})
        for p, ns in t.phases.items():
            c["phases"][p] = c["phases"].get(p, 0) + (ns > 0)
    rows = prof.summarize(transfers, names)
    return {"first": first, "channels": channels, "rows": rows, "table": prof.table(rows),
            "first_chunks": first_chunks, "grown": grown,
            "report": fn.report if mode == "rdmadev" else ""}


def tf1_session(mode, cluster):
    """A TF1 between-graph session: each task partitions (and plans) only its own half."""
    _set_task_pass_mode(cluster, mode == "rdmadev")
    tasks = [task_name("ps", 0), task_name("worker", 0)]
    earlier = {t: len(_task_reports(t)) for t in tasks}
    graph = tf.Graph()
    with graph.as_default():
        with tf.device(PS):
            w = tf.compat.v1.get_variable("w", initializer=tf.ones([4, 4]) * 0.5)
            inc = w.assign_add(tf.ones([4, 4]))
        with tf.device(W0):
            y = tf.reduce_sum(tf.matmul(tf.ones([2, 4]), w))
        init = tf.compat.v1.global_variables_initializer()
    values = []
    with tf.compat.v1.Session("grpc://" + cluster["worker"][0], graph=graph) as sess:
        sess.run(init)
        for _ in range(3):
            values.append(float(sess.run(y)))
            sess.run(inc)
    reports = []
    for t in tasks:  # only this scenario's reports (the tasks keep every report)
        reports += _task_reports(t)[earlier[t]:]
    _set_task_pass_mode(cluster, False)
    return {"values": values, "reports": reports}


def run(scenario, mode, cluster):
    """Runs `scenario` on `mode`'s path; returns its result."""
    if scenario.startswith("pss"):
        return pss(mode, cluster, workers=int(scenario[3:] or 1))
    if scenario == "tf_function":
        return as_tf_function(mode, cluster)
    if scenario == "keras2":
        return keras2_fit(mode, cluster)
    if scenario.startswith("keras"):
        return keras_fit(mode, cluster, optimize=scenario == "keras_optimize",
                         steps_per_execution=4 if scenario == "keras_loop" else 1)
    if scenario == "tf1":
        return tf1_session(mode, cluster)
    _connect(cluster)
    if scenario == "profile":
        return profile(mode, cluster)
    return {"train": train, "noop": noop, "big": big, "retrace": retrace,
            "train_until_killed": train_until_killed, "mixed": mixed,
            "conv": conv, "sparse": sparse, "overlapping": overlapping, "cond": cond,
            "growing": growing, "underbound": underbound, "loop": loop,
            "loop_until_killed": loop_until_killed,
            "batch_norm": batch_norm, "views": views, "bundles": bundles}[scenario](mode)


_connected = []


def _connect(cluster):
    """This process becomes the cluster's coordinator, once: connecting again would replace
    the remote context (and invalidate what a scenario run before created)."""
    if not _connected:
        tf.config.experimental_connect_to_cluster(tf.train.ClusterSpec(cluster))
        _connected.append(cluster)


def run_each(cluster, runs):
    """Results of [[mode, scenario], ...] run one after the other; a run that raised gives
    {"error": its traceback} and the others run on (the tasks' pass mode switched off again,
    as a scenario that switched it on would have)."""
    import traceback
    results = []
    for mode, scenario in runs:
        try:
            results.append(run(scenario, mode, cluster))
        except Exception:
            results.append({"error": traceback.format_exc()})
            _set_task_pass_mode(cluster, False)
    return results


def main():
    cluster, mode = parse_cluster(sys.argv[1]), sys.argv[2]
    if mode == "runs":  # [[mode, scenario], ...] one after the other in this one process
        result = run_each(cluster, json.loads(sys.argv[3]))
    else:
        result = run(sys.argv[3], mode, cluster)
    print("RESULT " + json.dumps(result))


if __name__ == "__main__":
    main()
