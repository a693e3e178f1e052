"""Train a small model on a parameter-server cluster with rdmadev, in-graph from the coordinator.

    python examples/train_in_graph.py                 # starts 1 ps + 2 workers on 127.0.0.1 itself
    python examples/train_in_graph.py --steps 100 --cluster '{"ps": [...], "worker": [...]}'

Variables live on the ps; every step both workers compute gradients on their half of the
batch and the ps applies their mean. The step is a plain tf.function wrapped by
rdmadev.optimize: the variables going to the workers and the gradients coming back move
through rdmadev instead of gRPC. The same steps then run on TF's own gRPC path from the same
initial weights, and the final weights are compared bit for bit. Every process started here
is stopped at the end.
"""
import argparse
import os
import secrets
import statistics
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from graph_pass.devices import task_name  # noqa: E402

PS, WORKERS = task_name("ps", 0), [task_name("worker", 0), task_name("worker", 1)]
BATCH, FEATURES, HIDDEN, CLASSES = 256, 784, 512, 10
LEARNING_RATE = 0.1


def build(tf):
    with tf.device(PS):
        params = [tf.Variable(tf.random.stateless_normal([FEATURES, HIDDEN], [1, 1]) * 0.05, name="w1"),
                  tf.Variable(tf.zeros([HIDDEN]), name="b1"),
                  tf.Variable(tf.random.stateless_normal([HIDDEN, CLASSES], [1, 2]) * 0.05, name="w2"),
                  tf.Variable(tf.zeros([CLASSES]), name="b2")]

    def loss_and_grads(x, y):
        with tf.GradientTape() as tape:
            w1, b1, w2, b2 = params
            logits = tf.matmul(tf.nn.relu(tf.matmul(x, w1) + b1), w2) + b2
            loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(y, logits))
        return loss, tape.gradient(loss, params)

    def step(i):
        x = tf.random.stateless_uniform([BATCH, FEATURES], [i, 1])
        y = tf.random.stateless_uniform([BATCH], [i, 2], maxval=CLASSES, dtype=tf.int32)
        half = BATCH // len(WORKERS)
        losses, grads = [], []
        for k, worker in enumerate(WORKERS):
            with tf.device(worker):
                loss, g = loss_and_grads(x[k * half:(k + 1) * half], y[k * half:(k + 1) * half])
            losses.append(loss)
            grads.append(g)
        with tf.device(PS):
            for p, *gs in zip(params, *grads):
                p.assign_sub(LEARNING_RATE * tf.add_n(gs) / len(gs))
        return tf.add_n(losses) / len(losses)

    return params, step


def run(tf, fn, steps, label):
    times, losses = [], []
    for i in range(steps):
        t0 = time.perf_counter()
        losses.append(float(fn(tf.constant(i, tf.int64))))
        times.append(time.perf_counter() - t0)
        if i % 10 == 0 or i == steps - 1:
            print(f"  [{label}] step {i:4d}  loss {losses[-1]:.5f}  {times[-1] * 1e3:7.2f} ms", flush=True)
    return losses, times


def train(tf, rdmadev, spec, steps):
    """Trains `steps` steps with rdmadev, then on gRPC from the same weights; 0 if identical."""
    print(f"cluster: {spec}")
    tf.config.experimental_connect_to_cluster(tf.train.ClusterSpec(spec))
    params, step = build(tf)
    initial = [p.numpy() for p in params]

    print(f"training {steps} steps with rdmadev:")
    optimized = rdmadev.optimize(tf.function(step))
    rd_losses, rd_times = run(tf, optimized, steps, "rdmadev")
    rd_final = [p.numpy() for p in params]
    print(optimized.report)

    print(f"the same {steps} steps on TF's gRPC path, from the same initial weights:")
    for p, v in zip(params, initial):
        p.assign(v)
    grpc_losses, grpc_times = run(tf, tf.function(step), steps, "grpc")
    same = rd_losses == grpc_losses and all(
        (a == b).all() for a, b in zip(rd_final, [p.numpy() for p in params]))
    warm = slice(min(5, steps - 1), None)  # the first steps trace and set up
    print(f"median step: rdmadev {statistics.median(rd_times[warm]) * 1e3:.2f} ms, "
          f"gRPC {statistics.median(grpc_times[warm]) * 1e3:.2f} ms")
    print("losses and final weights identical to TF's gRPC path: " + ("yes" if same else "NO"))
    return 0 if same else 1


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=50)
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
        return train(tf, rdmadev, spec, args.steps)
    finally:
        if cluster is not None:
            launch.release_remote_functions(spec)
            cluster.stop()
            print("cluster stopped")


if __name__ == "__main__":
    sys.exit(main())
