"""The chief of tfjob.yaml: a ParameterServerStrategy training loop in plain TensorFlow.

    python3 /app/train.py --steps 200      # in the chief's pod; TF_CONFIG set by the operator

The ps and workers run `rdmadev serve` with RDMADEV_AUTO=1 (they partition the steps, and
rewrite every function). The only rdmadev here is the protocol name given to the cluster
resolver (the TFJob operator's TF_CONFIG has no "rpc_layer"; with one, the default resolver
reads it) and the report at the end, which says what rdmadev carried on each task.
"""
import argparse
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

FEATURES, CLASSES, BATCH = 32, 4, 64


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--rpc_layer", default="grpc+rdmadev", help="grpc: TF's own path")
    args = ap.parse_args(argv)
    import tensorflow as tf

    resolver = tf.distribute.cluster_resolver.TFConfigClusterResolver(rpc_layer=args.rpc_layer)
    strategy = tf.distribute.ParameterServerStrategy(resolver)
    coordinator = tf.distribute.coordinator.ClusterCoordinator(strategy)
    with strategy.scope():
        model = tf.keras.Sequential([tf.keras.Input((FEATURES,)), tf.keras.layers.Dense(CLASSES)])
        optimizer = tf.keras.optimizers.SGD(0.1)

    def dataset_fn():
        x = tf.random.stateless_uniform([1024, FEATURES], [1, 2])
        y = tf.argmax(tf.matmul(x, tf.random.stateless_normal([FEATURES, CLASSES], [3, 4])), 1)
        return tf.data.Dataset.from_tensor_slices((x, y)).repeat().batch(BATCH)

    @tf.function
    def step(iterator):
        def replica(x, y):
            with tf.GradientTape() as tape:
                loss = tf.reduce_mean(tf.keras.losses.sparse_categorical_crossentropy(
                    y, model(x), from_logits=True))
            grads = tape.gradient(loss, model.trainable_variables)
            optimizer.apply_gradients(zip(grads, model.trainable_variables))
            return loss
        return strategy.run(replica, args=next(iterator))

    iterator = iter(coordinator.create_per_worker_dataset(dataset_fn))
    losses = [coordinator.schedule(step, args=(iterator,)) for _ in range(args.steps)]
    coordinator.join()
    print(f"trained {args.steps} steps on {strategy.extended._num_workers} workers over "
          f"{args.rpc_layer}: last loss {float(losses[-1].fetch()):.4f}", flush=True)
    if args.rpc_layer != "grpc":
        import rdmadev  # only to read what moved where
        for task, c in sorted(rdmadev.counters().items()):
            print(f"rdmadev on {task}: " + (c if isinstance(c, str) else
                  f"{c['transfers']} transfers, {c['registered_bytes']} B registered"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
