"""The coordinator of a ParameterServerStrategy job launched by Slurm (train.sbatch beside it).

    srun --ntasks=4 --multi-prog tasks.conf   # rank 0: this script; ranks 1-3: rdmadev serve --slurm

Slurm task 0 of the step runs this script as the chief; tasks 1-3 run `rdmadev serve --slurm
chief=1,ps=1,worker=2` (the ps and two workers). TF's SlurmClusterResolver builds the same
cluster in every task from the step's environment, with the arguments
rdmadev.cluster.slurm.resolver_args gives them all. The training is TF's own: the resolver's
rpc_layer "grpc+rdmadev" is the only change from a gRPC job (the tasks run with
RDMADEV_AUTO=1, so each step a worker partitions is rewritten); rdmadev is imported only at
the end, to say what moved where.

Two workers running steps at once apply their updates in whichever order they finish, so the
steps here run one at a time, each on a batch the coordinator gives: the same job on any
transport computes the same bytes (--save writes the losses and final weights to compare).
"""
import argparse
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

FEATURES, HIDDEN, CLASSES = 784, 256, 10
BATCH = 64
LEARNING_RATE = 0.05


def build(tf, strategy):
    """A Keras model and SGD under the strategy (variables on the ps), and its training step."""
    tf.keras.utils.set_random_seed(7)  # the same initial weights in every run
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
    def step(x, y):
        return strategy.run(replica_step, args=(x, y))

    return model, step


def rdmadev_summary(spec):
    """One line per task: transfers rdmadev carried, the pairs it swapped and over which fabric."""
    import rdmadev
    counters = rdmadev.counters(spec)
    lines = []
    for task, reports in sorted(rdmadev.task_reports(spec).items()):
        swapped = [s for r in reports for s in r.swapped]
        kept = sum(len(r.kept) for r in reports)
        fabrics = ",".join(sorted({s[4].split("+")[0] for s in swapped})) or "-"
        done = counters[task]["transfers"] if isinstance(counters.get(task), dict) else "?"
        lines.append(f"rdmadev on {task}: {done} transfers, {len(swapped)} pairs swapped "
                     f"over {fabrics}, {kept} stayed on gRPC")
    return "\n".join(lines)


def main(argv=None):
    from rdmadev.cluster import slurm  # no TensorFlow
    from rdmadev.tf.startup import import_tensorflow

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--jobs", default="chief=1,ps=1,worker=2", help="as rdmadev serve --slurm's")
    ap.add_argument("--port-base", type=int, default=slurm.PORT_BASE, help="as rdmadev serve's")
    ap.add_argument("--rpc-layer", default="grpc+rdmadev", help="grpc: TF's own path, to compare")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--save", help="write the losses and final weights here (.npz)")
    args = ap.parse_args(argv)

    try:
        jobs = slurm.parse_jobs(args.jobs)
        slurm.check_step(jobs)
    except ValueError as e:  # rdmadev's ConfigError: what is wrong and the fix
        sys.exit(f"train_pss.py: {e}")
    tf = import_tensorflow()  # `import tensorflow as tf`, without TF's start-up log lines
    import numpy as np

    resolver = tf.distribute.cluster_resolver.SlurmClusterResolver(
        **slurm.resolver_args(jobs, args.port_base, args.rpc_layer))
    spec = resolver.cluster_spec().as_dict()
    if resolver.get_task_info() != ("chief", 0):
        sys.exit(f"this is Slurm task {os.environ['SLURM_PROCID']}, {resolver.get_task_info()} "
                 f"of {spec}: run this script in the chief's task only (srun --multi-prog)")
    strategy = tf.distribute.ParameterServerStrategy(resolver)
    coordinator = tf.distribute.coordinator.ClusterCoordinator(strategy)
    model, step = build(tf, strategy)

    losses = []
    for i in range(args.steps):
        x = tf.random.stateless_uniform([BATCH, FEATURES], [i, 1])
        y = tf.random.stateless_uniform([BATCH], [i, 2], maxval=CLASSES, dtype=tf.int32)
        losses.append(coordinator.schedule(step, args=(x, y)).fetch())
    print(f"{args.steps} steps on {len(spec['worker'])} workers over {args.rpc_layer}: "
          f"loss {losses[0]:.4f} -> {losses[-1]:.4f}", flush=True)
    if args.rpc_layer == "grpc+rdmadev":
        print(rdmadev_summary(spec), flush=True)
    if args.save:
        np.savez(args.save, losses=np.array(losses),
                 **{f"w{i}": v.numpy() for i, v in enumerate(model.weights)})
    return 0


if __name__ == "__main__":
    sys.exit(main())
