"""Where the time of one small cross-task pair goes: a 4-byte variable read by another task,
as a tf.function called from the coordinator, gRPC against rdmadev, with rdmadev's side split by
the ops' profiler events.

    python benchmarks/pair_latency.py [--calls 200] [--rounds 5] [--trace_s 3]

1 ps + 1 worker (`rdmadev serve`) on 127.0.0.1, this process the coordinator. Variants, in
alternating rounds of `--calls` calls each (median ms per call, and the spread of the rounds):
`floor`, the same call on the worker alone (no second task, no pair); `grpc` and `rdmadev`, the
worker computing `v * 2` of a 4-byte variable on the ps. Then rdmadev calls run while TF's
profiler traces both tasks, and each receive is matched with its send on the one clock
(rdmadev/tf/profile.py): how long the kernels took, how far apart the two tasks started their
halves, and `delivery`, from the end of the send to the end of the receive (the receiver noticing
the write and handing the tensor to TF). Every process started here is stopped at the end.
"""
import argparse
import os
import statistics
import sys
import tempfile

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


def spread(xs):
    xs = sorted(xs)
    return f"median {statistics.median(xs):8.1f}  p10 {xs[len(xs) // 10]:8.1f}  p90 {xs[len(xs) * 9 // 10]:8.1f}"


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--calls", type=int, default=200, help="calls per variant per round")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--trace_s", type=float, default=3.0, help="seconds of traced rdmadev calls")
    args = ap.parse_args(argv)
    if min(args.calls, args.rounds) < 1 or not 0.5 <= args.trace_s <= 60:
        ap.error("--calls and --rounds must be >= 1, --trace_s within 0.5-60")
    from rdmadev.tf.startup import import_tensorflow
    tf = import_tensorflow()  # without TF's start-up lines

    import rdmadev
    from rdmadev.testing import launch
    from rdmadev.testing.timing import ms_per_call
    from rdmadev.tf import profile

    ps, worker = "/job:ps/replica:0/task:0", "/job:worker/replica:0/task:0"
    with launch.coordinated(num_ps=1, num_workers=1) as cluster:
        with tf.device(ps):
            remote = tf.Variable(tf.ones([1]))
        with tf.device(worker):
            local = tf.Variable(tf.ones([1]))

        def pair():
            with tf.device(worker):
                return remote * 2.0

        def floor():
            with tf.device(worker):
                return local * 2.0

        variants = {"floor": tf.function(floor), "grpc": tf.function(pair),
                    "rdmadev": rdmadev.optimize(tf.function(pair))}
        ms = ms_per_call(variants, args.rounds, args.calls)
        names = {addr: f"{job}:{i}" for job, i, addr in cluster.tasks()}
        with tempfile.TemporaryDirectory() as logdir:
            run = profile.capture(list(names), logdir, args.trace_s, variants["rdmadev"])
            transfers = profile.read(run.run_dir)
        variants.clear()

    print(f"one 4-byte pair ps -> worker, 1 ps + 1 worker on 127.0.0.1: ms per call, "
          f"{args.rounds} alternating rounds of {args.calls} calls")
    for name, xs in ms.items():
        extra = f"  ({statistics.median(ms['grpc']) / statistics.median(xs):.2f}x grpc)" if name == "rdmadev" else ""
        print(f"  {name:<8} median {statistics.median(xs):6.3f}  rounds {min(xs):6.3f}-{max(xs):6.3f}{extra}")
    notice = profile.notice_ns(transfers)
    rows = {"send kernel": [], "recv kernel": [], "send start - recv start": [], "delivery": []}
    for i, j in profile.matched(transfers).items():
        r, snd = transfers[i], transfers[j]
        rows["send kernel"].append(snd.dur_ns / 1e3)
        rows["recv kernel"].append(r.dur_ns / 1e3)
        rows["send start - recv start"].append((snd.start_ns - r.start_ns) / 1e3)
        rows["delivery"].append(notice[i] / 1e3)
    print(f"rdmadev under TF's profiler, {len(rows['delivery'])} matched pairs, us:")
    for name, xs in rows.items():
        if xs:
            print(f"  {name:<24} {spread(xs)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
