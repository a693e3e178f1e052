"""A step with control flow across tasks: gRPC against rdmadev, with the pairs inside the
conditional or loop on the fabric (TF's _Send/_Recv labelled for rdmadev's kernels, which
carry the deadness of a branch not taken and of a loop's exit iteration; a loop runs one
iteration at a time) and with them kept on gRPC (what rdmadev did before it carried them).

    python benchmarks/control_flow.py --flow cond [--mib 4] [--calls 20] [--rounds 5]
    python benchmarks/control_flow.py --flow loop [--mib 4] [--iterations 8] ...

1 ps + 1 worker (`rdmadev serve`) on 127.0.0.1, this process the coordinator, which calls a
tf.function:
  cond: the worker takes a branch every other call, which reads a `--mib` MiB variable of the
        ps and sums it, else returns -1; the ps doubles the result.
  loop: the worker runs a tf.while_loop of `--iterations` iterations (parallel_iterations 10,
        tf.while_loop's default); each reads the `--mib` MiB variable, scales it by the
        iteration number and sends the product to the ps, which adds up its sum (the shape of
        Keras's steps_per_execution loop: variables read and gradients sent every iteration).
Variants in alternating rounds of `--calls` calls each: median ms per call, and the range over
the rounds. Every process started here is stopped at the end.
"""
import argparse
import os
import statistics
import sys
from unittest import mock

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

#: flow -> (what OPS_CARRY lacked before rdmadev carried it, the report's reason for such pairs)
BEFORE = {"cond": ("dead_tensors", "in_cond"), "loop": ("loops", "in_loop")}


def steps(tf, flow, v, iterations, ps, worker):
    """The step function of `flow` and its argument for each call, in turn."""
    if flow == "cond":
        def step(flag):
            with tf.device(worker):
                x = tf.cond(flag, lambda: tf.reduce_sum(v * 2.0), lambda: tf.constant(-1.0))
            with tf.device(ps):
                return x * 2.0
        return step, [tf.TensorSpec([], tf.bool)], [tf.constant(True), tf.constant(False)]

    def body(i, acc):
        with tf.device(worker):
            g = v * tf.cast(i + 1, tf.float32)
        with tf.device(ps):
            return i + 1, acc + tf.reduce_sum(g)

    def step(n):
        with tf.device(worker):
            return tf.while_loop(lambda i, a: i < n, body, [tf.constant(0), tf.constant(0.0)])[1]
    return step, [tf.TensorSpec([], tf.int32)], [tf.constant(iterations)]


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--flow", choices=sorted(BEFORE), required=True)
    ap.add_argument("--mib", type=float, default=4.0, help="MiB read from the ps (a branch, an iteration)")
    ap.add_argument("--iterations", type=int, default=8, help="loop iterations per call (--flow loop)")
    ap.add_argument("--calls", type=int, default=20, help="calls per variant per round")
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args(argv)
    if min(args.calls, args.rounds, args.iterations) < 1 or not 0 < args.mib <= 1024:
        ap.error("--calls, --rounds and --iterations must be >= 1, --mib within (0, 1024]")
    from rdmadev.tf.startup import import_tensorflow
    tf = import_tensorflow()  # without TF's start-up lines

    import rdmadev
    from rdmadev.testing import launch
    from rdmadev.testing.timing import ms_per_call
    from rdmadev.tf import bridge

    ps, worker = "/job:ps/replica:0/task:0", "/job:worker/replica:0/task:0"
    lacked, reason = BEFORE[args.flow]
    before = f"rdmadev, {args.flow} on gRPC"
    n = max(1, int(args.mib * (1 << 20) / 4))
    with launch.coordinated(num_ps=1, num_workers=1) as cluster:
        with tf.device(ps):
            v = tf.Variable(tf.ones([n]))
        step, spec, inputs = steps(tf, args.flow, v, args.iterations, ps, worker)
        fns = {"grpc": tf.function(step, input_signature=spec),
               "rdmadev": rdmadev.optimize(tf.function(step, input_signature=spec)),
               before: rdmadev.optimize(tf.function(step, input_signature=spec))}

        def in_turn(fn):  # the inputs in turn (cond: takes the branch every other call)
            turn = iter(range(1 << 62))
            return lambda: fn(inputs[next(turn) % len(inputs)])

        calls = {name: in_turn(fn) for name, fn in fns.items()}
        with mock.patch.dict(bridge.OPS_CARRY, {lacked: False}):  # planned at its first call
            calls[before]()
        ms = ms_per_call(calls, args.rounds, args.calls)
        kept = {name: sum(why == reason for r in fns[name].reports for _, _, why in r.kept)
                for name in ("rdmadev", before)}
        values = {name: [float(fn(x)) for x in inputs] for name, fn in fns.items()}
        calls.clear()
        fns.clear()
    if len({tuple(v) for v in values.values()}) != 1:
        print(f"values differ: {values}")
        return 1
    what = (f"a tf.cond on the worker reading {args.mib:g} MiB of the ps every other call"
            if args.flow == "cond" else
            f"a tf.while_loop on the worker of {args.iterations} iterations, each reading {args.mib:g} "
            f"MiB of the ps and sending as much back")
    print(f"{what}, 1 ps + 1 worker on 127.0.0.1: ms per call, {args.rounds} alternating rounds of "
          f"{args.calls} calls")
    base = statistics.median(ms["grpc"])
    for name, xs in ms.items():
        print(f"  {name:<24} median {statistics.median(xs):8.3f}  rounds {min(xs):8.3f}-{max(xs):8.3f}"
              f"  ({base / statistics.median(xs):.2f}x grpc)")
    for name, count in kept.items():
        print(f"  {name}: {count} pairs of the {args.flow} stayed on gRPC")
    return 0


if __name__ == "__main__":
    sys.exit(main())
