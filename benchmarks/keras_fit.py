"""Keras 3 `fit` with and without `steps_per_execution`, its variables on a ps: gRPC against
rdmadev (the model's train_step wrapped by rdmadev.optimize).

    python benchmarks/keras_fit.py [--steps_per_execution 1,8] [--steps 32] [--rounds 5]

1 ps + 1 worker (`rdmadev serve`) on 127.0.0.1, this process the coordinator. The model, an
MLP of 256 -> 1024 -> 1024 -> 10 (5.1 MiB of float32 variables, on the ps), is fit under the
worker's device scope, so the worker runs Keras's train function; with steps_per_execution
S > 1 that is a tf.while_loop of S train steps (whose pairs rdmadev moves each iteration), each
reading every variable from the ps and sending every gradient back. Each variant (gRPC or
rdmadev, for each S) has its own model from the same seed and the same data. Variants in
alternating rounds, each one `fit` of `--steps` batches of 64 per variant: median steps per
second, and the range over the rounds. The worker plans the train function, so rdmadev's
variant cannot be told here to keep the loop on gRPC (benchmarks/control_flow.py --flow loop
compares that). Every process started here is stopped at the end.
"""
import argparse
import os
import statistics
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

BATCH = 64
WIDTHS = (256, 1024, 1024, 10)


def build(tf, ps, steps_per_execution):
    """A compiled model whose variables are on `ps`, the same for every call."""
    tf.keras.utils.set_random_seed(7)
    with tf.device(ps):
        model = tf.keras.Sequential([tf.keras.Input((WIDTHS[0],))] +
                                    [tf.keras.layers.Dense(w, activation="relu") for w in WIDTHS[1:-1]] +
                                    [tf.keras.layers.Dense(WIDTHS[-1])])
        model.compile(optimizer=tf.keras.optimizers.SGD(0.01), loss="mse",
                      steps_per_execution=steps_per_execution)
        model.optimizer.build(model.trainable_variables)
    return model


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps_per_execution", default="1,8", help="comma-separated values to compare")
    ap.add_argument("--steps", type=int, default=32, help="batches per fit (a multiple of each steps_per_execution)")
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args(argv)
    try:
        executions = [int(n) for n in args.steps_per_execution.split(",")]
    except ValueError:
        ap.error(f"--steps_per_execution: comma-separated integers, not {args.steps_per_execution!r}")
    if min(executions + [args.steps, args.rounds]) < 1 or any(args.steps % n for n in executions):
        ap.error("every count must be >= 1, and --steps a multiple of each --steps_per_execution")
    import numpy as np
    from rdmadev.tf.startup import import_tensorflow
    tf = import_tensorflow()  # without TF's start-up lines

    import rdmadev
    from rdmadev.testing import launch
    from rdmadev.testing.timing import ms_per_call

    ps, worker = "/job:ps/replica:0/task:0", "/job:worker/replica:0/task:0"
    rng = np.random.default_rng(0)
    x = rng.standard_normal((args.steps * BATCH, WIDTHS[0])).astype("float32")
    y = rng.standard_normal((args.steps * BATCH, WIDTHS[-1])).astype("float32")
    with launch.coordinated(num_ps=1, num_workers=1):
        models = {(mode, n): build(tf, ps, n) for n in executions for mode in ("grpc", "rdmadev")}
        for n in executions:
            models["rdmadev", n].train_step = rdmadev.optimize(models["rdmadev", n].train_step)

        def fitting(model):
            def fit():
                with tf.device(worker):
                    model.fit(x, y, epochs=1, batch_size=BATCH, shuffle=False, verbose=0)
            return fit

        ms = ms_per_call({key: fitting(model) for key, model in models.items()}, args.rounds, 1)
        weights = {key: [w.tobytes() for w in model.get_weights()] for key, model in models.items()}
        reports = {n: models["rdmadev", n].train_step.reports for n in executions}
        models.clear()
    if len({tuple(w) for w in weights.values()}) != 1:
        print("weights differ between the variants after the same fits")
        return 1
    print(f"Keras 3 fit, an MLP {' -> '.join(map(str, WIDTHS))} (variables on the ps), batches of "
          f"{BATCH}, 1 ps + 1 worker on 127.0.0.1: steps per second, {args.rounds} alternating rounds "
          f"of one fit of {args.steps} steps per variant")
    for n in executions:
        rate = {mode: [args.steps / (m / 1e3) for m in ms[mode, n]] for mode in ("grpc", "rdmadev")}
        base = statistics.median(rate["grpc"])
        for mode, xs in rate.items():
            print(f"  steps_per_execution={n:<3} {mode:<8} median {statistics.median(xs):8.1f}  rounds "
                  f"{min(xs):8.1f}-{max(xs):8.1f}  ({statistics.median(xs) / base:.2f}x grpc)")
        kept = [why for r in reports[n] for _, _, why in r.kept]
        looped = sum(len(r.looped) for r in reports[n])
        print(f"  steps_per_execution={n:<3} rdmadev: {looped} pairs moved each loop iteration, "
              f"{len(kept)} on gRPC {sorted(set(kept))}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
