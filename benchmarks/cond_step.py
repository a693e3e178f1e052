"""A step with a conditional across tasks: gRPC against rdmadev, with the branch's pairs on the
fabric (TF's _Send/_Recv labelled for rdmadev's kernels, which carry the deadness of the branch
not taken) and with them kept on gRPC (what rdmadev did before it carried dead tensors).

    python benchmarks/cond_step.py [--mib 4] [--calls 20] [--rounds 5]

1 ps + 1 worker (`rdmadev serve`) on 127.0.0.1, this process the coordinator. The step, a
tf.function called from the coordinator: the worker takes a branch every other call, which
reads a `--mib` MiB variable of the ps and sums it, else returns -1; the ps doubles the
result. Variants in alternating rounds of `--calls` calls each: median ms per call, and the
range over the rounds. Every process started here is stopped at the end.
"""
import argparse
import os
import statistics
import sys
from unittest import mock

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mib", type=float, default=4.0, help="MiB the branch reads from the ps")
    ap.add_argument("--calls", type=int, default=20, help="calls per variant per round")
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args(argv)
    if min(args.calls, args.rounds) < 1 or not 0 < args.mib <= 1024:
        ap.error("--calls and --rounds must be >= 1, --mib within (0, 1024]")
    import tensorflow as tf

    import rdmadev
    from rdmadev.testing import launch
    from rdmadev.testing.timing import ms_per_call
    from rdmadev.tf import bridge

    ps, worker = "/job:ps/replica:0/task:0", "/job:worker/replica:0/task:0"
    n = max(1, int(args.mib * (1 << 20) / 4))
    with launch.coordinated(num_ps=1, num_workers=1) as cluster:
        with tf.device(ps):
            v = tf.Variable(tf.ones([n]))

        def step(flag):
            with tf.device(worker):
                x = tf.cond(flag, lambda: tf.reduce_sum(v * 2.0), lambda: tf.constant(-1.0))
            with tf.device(ps):
                return x * 2.0

        spec = [tf.TensorSpec([], tf.bool)]
        fns = {"grpc": tf.function(step, input_signature=spec),
               "rdmadev": rdmadev.optimize(tf.function(step, input_signature=spec)),
               "rdmadev, branch on gRPC": rdmadev.optimize(tf.function(step, input_signature=spec))}
        flags = [tf.constant(True), tf.constant(False)]

        def alternating(fn):  # takes the branch every other call
            turn = iter(range(1 << 62))
            return lambda: fn(flags[next(turn) % 2])

        calls = {name: alternating(fn) for name, fn in fns.items()}
        with mock.patch.dict(bridge.OPS_CARRY, dead_tensors=False):  # planned at its first call
            calls["rdmadev, branch on gRPC"]()
        ms = ms_per_call(calls, args.rounds, args.calls)
        reports = {name: fns[name].report for name in ("rdmadev", "rdmadev, branch on gRPC")}
        values = {name: [float(fn(f)) for f in flags] for name, fn in fns.items()}
        calls.clear()
        fns.clear()
    if len({tuple(v) for v in values.values()}) != 1:
        print(f"values differ: {values}")
        return 1
    print(f"a tf.cond on the worker reading {args.mib:g} MiB of the ps every other call, 1 ps + "
          f"1 worker on 127.0.0.1: ms per call, {args.rounds} alternating rounds of {args.calls} calls")
    base = statistics.median(ms["grpc"])
    for name, xs in ms.items():
        print(f"  {name:<24} median {statistics.median(xs):8.3f}  rounds {min(xs):8.3f}-{max(xs):8.3f}"
              f"  ({base / statistics.median(xs):.2f}x grpc)")
    for name, text in reports.items():
        kept = sum(1 for line in text.splitlines() if line.strip().startswith("grpc ") and "in_cond" in line)
        print(f"  {name}: {kept} pairs of the branch stayed on gRPC")
    return 0


if __name__ == "__main__":
    sys.exit(main())
