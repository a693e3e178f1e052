"""What each extra cross-task pair of a step costs: a call that reads N small variables of the
ps on the worker, against the same call on variables of the worker (no pair) and against one
variable holding all N (one pair, the same bytes), gRPC and rdmadev alike.

    python benchmarks/pair_count.py [--counts 1 16 64] [--floats 256] [--calls 100] [--rounds 5]

1 ps + 1 worker (`rdmadev serve`) on 127.0.0.1, this process the coordinator. For each N:
`local` (N variables on the worker: the ops without any pair), `grpc` and `rdmadev` (N
variables on the ps, each read by the worker: N pairs; rdmadev moves them in one bundle,
`rdmadev 1ch` in N channels of their own, RDMADEV_BUNDLE_BELOW_BYTES=0), and `grpc 1x` /
`rdmadev 1x` (one variable of N x --floats on the ps: one pair of the same bytes, the floor
that bundling the N pairs into one approaches). Variants alternate round by round; each figure is the median ms per
call over the rounds, with the rounds' range. The per-pair cost is the slope over N of
(variant - local). Every process started here is stopped at the end.
"""
import argparse
import os
import statistics
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--counts", type=int, nargs="+", default=[1, 16, 64], help="pairs per call")
    ap.add_argument("--floats", type=int, default=256, help="float32 elements per variable")
    ap.add_argument("--calls", type=int, default=100, help="calls per variant per round")
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args(argv)
    if min(args.counts + [args.floats, args.calls, args.rounds]) < 1 or max(args.counts) > 1024:
        ap.error("--counts within 1-1024; --floats, --calls and --rounds >= 1")
    from rdmadev.tf.startup import import_tensorflow
    tf = import_tensorflow()  # without TF's start-up lines

    import rdmadev
    from rdmadev.testing import launch
    from rdmadev.testing.timing import ms_per_call, planned_with

    ps, worker = "/job:ps/replica:0/task:0", "/job:worker/replica:0/task:0"
    with launch.coordinated(num_ps=1, num_workers=1):
        variants = {}
        for n in args.counts:
            with tf.device(ps):
                remote = [tf.Variable(tf.ones([args.floats])) for _ in range(n)]
                whole = [tf.Variable(tf.ones([args.floats * n]))]
            with tf.device(worker):
                local = [tf.Variable(tf.ones([args.floats])) for _ in range(n)]

            def read(vs):
                with tf.device(worker):
                    return tf.add_n([v * 2.0 for v in vs])

            variants[(n, "local")] = tf.function(lambda vs=local: read(vs))
            variants[(n, "grpc")] = tf.function(lambda vs=remote: read(vs))
            variants[(n, "rdmadev")] = rdmadev.optimize(tf.function(lambda vs=remote: read(vs)))
            variants[(n, "rdmadev")]()  # starts this process's rdmadev runtime, for planned_with
            variants[(n, "rdmadev 1ch")] = planned_with(
                rdmadev.optimize(tf.function(lambda vs=remote: read(vs))), bundle_below_bytes=0)
            variants[(n, "grpc 1x")] = tf.function(lambda vs=whole: read(vs))
            variants[(n, "rdmadev 1x")] = rdmadev.optimize(tf.function(lambda vs=whole: read(vs)))
        # The functions hold the variables from here on: all of them die with `variants`, which
        # is dropped before the block ends (launch.coordinated releases them on the tasks).
        del remote, whole, local
        ms = ms_per_call(variants, args.rounds, args.calls, on_round=lambda r: print(
            f"round {r}/{args.rounds} done", file=sys.stderr, flush=True))
        variants.clear()

    med = {key: statistics.median(xs) for key, xs in ms.items()}
    print(f"N reads of a {args.floats * 4}-byte ps variable by the worker, 1 ps + 1 worker on "
          f"127.0.0.1: ms per call, median of {args.rounds} alternating rounds of {args.calls} calls")
    print(f"  {'N':>5} {'variant':<11} {'median':>8} {'rounds':>15} {'- local':>8}")
    for (n, name), xs in ms.items():
        print(f"  {n:>5} {name:<11} {med[(n, name)]:8.3f} {min(xs):7.3f}-{max(xs):<7.3f} "
              f"{med[(n, name)] - med[(n, 'local')]:8.3f}")
    lo, hi = min(args.counts), max(args.counts)
    if hi > lo:
        for name in ("grpc", "rdmadev", "rdmadev 1ch"):
            slope = ((med[(hi, name)] - med[(hi, "local")]) - (med[(lo, name)] - med[(lo, "local")])) / (hi - lo)
            print(f"  per extra pair above local, {name}: {slope * 1e3:.1f} us")
    return 0


if __name__ == "__main__":
    sys.exit(main())
