"""Train a Keras model with ParameterServerStrategy, its step wrapped by rdmadev.optimize.

    python examples/train_pss.py                # starts 1 ps + 2 workers on 127.0.0.1 itself
    python examples/train_pss.py --steps 400 --cluster '{"ps": [...], "worker": [...]}'

The shape of TF's parameter-server tutorial: a ParameterServerStrategy, a ClusterCoordinator,
a per-worker dataset, Keras layers and optimizer created under the strategy's scope (variables
on the ps), and a training step scheduled on whichever worker is free. The step is a plain
tf.function wrapped by rdmadev.optimize; the worker that runs it moves the variables it reads
and the gradients it applies through rdmadev instead of gRPC. The same training then runs on
TF's gRPC path from the same initial weights, for the speed comparison.

Asynchronous steps on two workers apply their updates in whichever order they finish, so their
results differ from run to run on any transport. The bit-for-bit check therefore runs the same
replica step one step at a time (each step's batch given by the coordinator), once through
rdmadev and once on gRPC, from the same weights.
"""
import argparse
import os
import secrets
import socket
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

FEATURES, HIDDEN, CLASSES = 784, 512, 10
#: Per-worker batch: large enough that ps <-> worker traffic (3.2 MB of weights each way per
#: step) is what the step waits for, small enough for 2 cores.
BATCH = 64
LEARNING_RATE = 0.05
#: Steps of the bit-for-bit check (one at a time, so a few are enough).
CHECK_STEPS = 10


def dataset_fn(tf):
    """Each worker's input: synthetic 'digits' labelled by a fixed random teacher, repeated."""
    def make():
        x = tf.random.stateless_uniform([4096, FEATURES], [7, 7])
        teacher = tf.random.stateless_normal([FEATURES, CLASSES], [7, 8])
        y = tf.argmax(tf.matmul(x, teacher), axis=1, output_type=tf.int32)
        return tf.data.Dataset.from_tensor_slices((x, y)).repeat().batch(BATCH, drop_remainder=True)
    return make


def build(tf, strategy):
    with strategy.scope():
        model = tf.keras.Sequential([tf.keras.Input((FEATURES,)),
                                     tf.keras.layers.Dense(HIDDEN, activation="relu"),
                                     tf.keras.layers.Dense(CLASSES)])
        optimizer = tf.keras.optimizers.SGD(LEARNING_RATE)
        optimizer.build(model.trainable_variables)
    loss_fn = tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True)

    def replica_step(x, y):
        with tf.GradientTape() as tape:
            loss = loss_fn(y, model(x, training=True))
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(grads, model.trainable_variables))
        return loss

    @tf.function
    def train_step(iterator):
        x, y = next(iterator)
        return strategy.run(replica_step, args=(x, y))

    @tf.function
    def check_step(x, y):
        return strategy.run(replica_step, args=(x, y))

    return model, optimizer, train_step, check_step


def weights(model, optimizer):
    return [v.numpy() for v in model.weights] + [optimizer.iterations.numpy()]


def restore(model, optimizer, values):
    for v, value in zip(model.weights + [optimizer.iterations], values):
        v.assign(value)


def train(tf, coordinator, step, iterator, steps, label):
    """Schedules `steps` steps, joining every quarter; returns the steps/s after the first
    quarter (which traces the step and, with rdmadev, sets up its channels) and the last loss."""
    quarter = max(1, steps // 4)
    losses, start = [], None
    for i in range(steps):
        losses.append(coordinator.schedule(step, args=(iterator,)))
        if (i + 1) % quarter == 0 or i + 1 == steps:
            coordinator.join()
            print(f"  [{label}] {i + 1:4d} steps  loss {float(losses[-1].fetch()):.4f}", flush=True)
            if start is None:
                start, first = time.perf_counter(), i + 1
    rate = (steps - first) / (time.perf_counter() - start) if steps > first else float("nan")
    return rate, float(losses[-1].fetch())


def check(tf, coordinator, step):
    """CHECK_STEPS steps one at a time on coordinator-given batches; their losses."""
    losses = []
    for i in range(CHECK_STEPS):
        x = tf.random.stateless_uniform([BATCH, FEATURES], [i, 1])
        y = tf.random.stateless_uniform([BATCH], [i, 2], maxval=CLASSES, dtype=tf.int32)
        losses.append(float(coordinator.schedule(step, args=(x, y)).fetch()))
    return losses


def run(tf, rdmadev, spec, steps):
    """The job; 0 if the rdmadev check steps are bit-identical to gRPC's."""
    with socket.socket() as s:  # the coordinator's own address: a chief entry in the spec
        s.bind(("127.0.0.1", 0))
        full = {**spec, "chief": [f"127.0.0.1:{s.getsockname()[1]}"]}
    resolver = tf.distribute.cluster_resolver.SimpleClusterResolver(
        tf.train.ClusterSpec(full), task_type="chief", task_id=0, rpc_layer="grpc")
    strategy = tf.distribute.ParameterServerStrategy(resolver)
    coordinator = tf.distribute.coordinator.ClusterCoordinator(strategy)
    model, optimizer, train_step, check_step = build(tf, strategy)
    iterator = iter(coordinator.create_per_worker_dataset(dataset_fn(tf)))
    initial = weights(model, optimizer)
    fast_train, fast_check = rdmadev.optimize(train_step), rdmadev.optimize(check_step)

    print(f"training {steps} steps on {len(spec['worker'])} workers, step wrapped by rdmadev.optimize:")
    rd_rate, rd_loss = train(tf, coordinator, fast_train, iterator, steps, "rdmadev")
    print(fast_train.report)
    restore(model, optimizer, initial)
    print(f"the same {steps} steps on TF's gRPC path, from the same initial weights:")
    grpc_rate, grpc_loss = train(tf, coordinator, train_step, iterator, steps, "grpc")
    print(f"steps/s: rdmadev {rd_rate:.1f}, gRPC {grpc_rate:.1f} ({rd_rate / grpc_rate:.2f}x); "
          f"last loss: rdmadev {rd_loss:.4f}, gRPC {grpc_loss:.4f}")

    results = {}
    for label, step in (("rdmadev", fast_check), ("grpc", check_step)):
        restore(model, optimizer, initial)
        losses = check(tf, coordinator, step)
        results[label] = (losses, weights(model, optimizer))
    (rl, rw), (gl, gw) = results["rdmadev"], results["grpc"]
    same = rl == gl and all((a == b).all() for a, b in zip(rw, gw))
    print(f"{CHECK_STEPS} check steps, one at a time: losses and weights identical to TF's "
          f"gRPC path: " + ("yes" if same else "NO"))
    return 0 if same else 1


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--cluster", help="cluster spec JSON of running `rdmadev serve` tasks")
    args = ap.parse_args(argv)
    os.environ.setdefault("RDMADEV_SECRET", secrets.token_hex(16))

    from rdmadev.tf.startup import import_tensorflow
    tf = import_tensorflow()  # `import tensorflow as tf`, without TF's start-up log lines
    import rdmadev
    from rdmadev.cluster.spec import parse_cluster
    from rdmadev.testing import launch

    cluster = None
    if args.cluster is None:
        print("starting 1 ps + 2 workers on 127.0.0.1 (rdmadev serve) ...", flush=True)
        cluster = launch.Cluster(num_ps=1, num_workers=2,
                                 env={"RDMADEV_SECRET": os.environ["RDMADEV_SECRET"]}).start()
        spec = cluster.spec
    else:
        spec = parse_cluster(args.cluster)
    try:
        return run(tf, rdmadev, spec, args.steps)
    finally:
        if cluster is not None:
            launch.release_remote_functions(spec)
            cluster.stop()
            print("cluster stopped")


if __name__ == "__main__":
    sys.exit(main())
