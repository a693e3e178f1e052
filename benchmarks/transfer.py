"""TF-level transfer benchmark: one tensor worker -> ps and ps -> worker through a
multi-task tf.function, TF's gRPC path against rdmadev, measured alternately in one run.

    python benchmarks/transfer.py                  # 4 B .. 256 MiB
    python benchmarks/transfer.py --max-mib 16     # quicker

It starts 1 ps + 1 worker (`rdmadev serve`) on 127.0.0.1. For each size it times, per call
(median over --trials rounds; each round alternates the variants): `floor`, the same
function with no cross-task pair (the per-call dispatch every variant pays); grpc and
rdmadev for w->ps (the worker's variable read on the worker, consumed on the ps) and ps->w;
and memcpy of the same size as the physical reference. "net GB/s" divides the size by the
time above the floor. The title line names the TF_ENABLE_ONEDNN_OPTS the tasks ran with:
it picks TF's CPU allocator, which large copied receives depend on.
"""
import argparse
import json
import os
import statistics
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
from graph_pass.devices import task_name  # noqa: E402

PS, W0 = task_name("ps", 0), task_name("worker", 0)
SIZES = [4, 4 << 10, 64 << 10, 1 << 20, 16 << 20, 64 << 20, 256 << 20]


def allocator_setting():
    """What selects TF's CPU allocator in the tasks (they inherit this environment): on x86
    oneDNN's pool unless TF_ENABLE_ONEDNN_OPTS=0, then glibc's malloc. Large copied receives
    differ by up to 2x between the two (docs/history/transfer.md, "Large copied receives")."""
    value = os.environ.get("TF_ENABLE_ONEDNN_OPTS")
    return f"TF_ENABLE_ONEDNN_OPTS={value}" if value is not None else "TF_ENABLE_ONEDNN_OPTS unset"


def calls_for(size):
    """Calls per timing round: ~0.5 s of work for small sizes, at least 3."""
    return max(3, min(50, (64 << 20) // max(size, 1)))


def time_calls(fn, n):
    fn()  # warm: the first call after a variant switch can pay scheduling noise
    t0 = time.perf_counter()
    for _ in range(n):
        fn()
    return (time.perf_counter() - t0) / n


def measure(tf, rdmadev, size, trials):
    n = max(1, size // 4)
    with tf.device(W0):
        vw = tf.Variable(tf.ones([n]))
    with tf.device(PS):
        vp = tf.Variable(tf.ones([n]))

    def floor():
        with tf.device(W0):
            return vw.read_value()[:1]

    def w2ps():
        with tf.device(W0):
            x = vw.read_value()
        with tf.device(PS):
            return x[:1] + 1.0

    def ps2w():
        with tf.device(PS):
            x = vp.read_value()
        with tf.device(W0):
            return x[:1] + 1.0

    variants = {"floor": tf.function(floor)}
    for name, f in (("w2ps", w2ps), ("ps2w", ps2w)):
        variants[f"grpc_{name}"] = tf.function(f)
        variants[f"rdmadev_{name}"] = rdmadev.optimize(tf.function(f))
    for name, fn in variants.items():  # trace, instantiate, check the value (ones, plus one)
        got = float(tf.reshape(fn(), [-1])[0])
        if got not in (1.0, 2.0):
            raise RuntimeError(f"{name} of {size} B returned {got}, not 1 or 2: not timed")
    calls = calls_for(size)
    samples = {k: [] for k in variants}
    for _ in range(trials):
        for name, fn in variants.items():
            samples[name].append(time_calls(lambda: fn().numpy(), calls))
    out = {k: statistics.median(v) * 1e3 for k, v in samples.items()}
    reports = {k: fn.report for k, fn in variants.items() if k.startswith("rdmadev")}
    del vw, vp
    return out, reports


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trials", type=int, default=5)
    ap.add_argument("--max-mib", type=int, default=256)
    ap.add_argument("--json", default=os.path.join(HERE, "results", "transfer.json"))
    args = ap.parse_args(argv)
    from rdmadev.tf.startup import import_tensorflow
    tf = import_tensorflow()  # without TF's start-up lines
    import rdmadev
    from rdmadev import _core
    from rdmadev.testing import launch

    sizes = [s for s in SIZES if s <= args.max_mib << 20]
    rows = []
    with launch.coordinated(num_ps=1, num_workers=1):
        for size in sizes:
            ms, reports = measure(tf, rdmadev, size, args.trials)
            memcpy_gbs = statistics.median(
                size * 10 / _core.bench_memcpy(size, 10) / 1e9 for _ in range(args.trials))
            fabric = "shm" if all("shm" in r for r in reports.values()) else "?"
            rows.append({"bytes": size, "memcpy_GBps": memcpy_gbs, "fabric": fabric, **ms})
            print(f"  measured {size} B", file=sys.stderr, flush=True)

    head = (f"{'size':>9} {'floor':>7} | {'w->ps grpc':>10} {'rdmadev':>8} {'x':>5} | "
            f"{'ps->w grpc':>10} {'rdmadev':>8} {'x':>5} | {'net GB/s':>8} {'memcpy':>7} {'net/mc':>6}")
    print(f"rdmadev transfer benchmark: median ms per call over {args.trials} alternating rounds; "
          f"1 ps + 1 worker on 127.0.0.1 (fabric {rows[0]['fabric'] if rows else '?'}; "
          f"{allocator_setting()})")
    print(head)
    print("-" * len(head))
    for r in rows:
        size = r["bytes"]
        label = f"{size >> 20} MiB" if size >= 1 << 20 else f"{size >> 10} KiB" if size >= 1024 else f"{size} B"
        net = min(r["rdmadev_w2ps"], r["rdmadev_ps2w"]) - r["floor"]
        net_gbs = size / (net / 1e3) / 1e9 if net > 0 else float("inf")
        r["net_GBps"] = net_gbs
        print(f"{label:>9} {r['floor']:>7.2f} | {r['grpc_w2ps']:>10.2f} {r['rdmadev_w2ps']:>8.2f} "
              f"{r['grpc_w2ps'] / r['rdmadev_w2ps']:>5.2f} | {r['grpc_ps2w']:>10.2f} "
              f"{r['rdmadev_ps2w']:>8.2f} {r['grpc_ps2w'] / r['rdmadev_ps2w']:>5.2f} | "
              f"{net_gbs:>8.2f} {r['memcpy_GBps']:>7.2f} {net_gbs / r['memcpy_GBps']:>6.2f}")
    os.makedirs(os.path.dirname(args.json), exist_ok=True)
    with open(args.json, "w") as f:
        json.dump({"rows": rows, "trials": args.trials, "allocator": allocator_setting()}, f,
                  indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
