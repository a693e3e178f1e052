"""Retraces: one training step called with 60 batch sizes on 1 ps and 2 workers (60 traces and
instantiations, every one kept alive by TF), on plain gRPC and through rdmadev under the
default RDMADEV_MAX_REGISTERED_BYTES and under a budget of about eleven instantiations.

    python benchmarks/retrace.py                   # 60 traces per configuration: a table
    python benchmarks/retrace.py --traces 20 --json out.json
    python benchmarks/retrace.py --one SPEC MODE TRACES AGAIN   # one coordinator (the tests')

The step: the ps holds a 128x128 and a 128x1 layer; worker:0 computes the first layer and the
gradients, worker:1 the second layer and the loss; the ps applies the update. Batch sizes 1,
2, ... TRACES each trace anew. Then the first AGAIN sizes run again (under the small budget
they were evicted long before: their channels are set up again before they run) and the last
size AGAIN times (live, warm). Each configuration reports, per task, the registered bytes,
descriptors (besides control connections), memfd mappings and chunks (what a task maps and
registers its regions in: _native/core/arena.h) after 10 traces and at the end,
the pairs evicted and set up again, and the seconds of the calls run again and of the warm
ones (median, spread = (max - min) / median), against gRPC in the same run; losses and final
weights must be bit for bit gRPC's.

Each configuration runs its coordinator in a process of its own (TF keeps one cluster per
process); the two budgets need clusters of their own (a task reads it when it starts).
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

#: Features per example: the ps sends worker:0 a 128x128 float layer (64 KiB) per step.
WIDTH = 128
#: The small budget: ~70 KiB per instantiation on the ps and ~74 KiB on worker:0, so it binds
#: from the eleventh trace on.
SMALL_BUDGET = 768 << 10
#: Counters reported per task.
HELD = ("registered_bytes", "planned_bytes", "fds", "memfd_maps", "channels")
#: A coordinator tracing and instantiating 60 functions on a loaded 2-core box.
ONE_TIMEOUT_S = 900


def one(spec, mode, traces, again):
    """One coordinator's run (the module docstring); returns its result."""
    import tensorflow as tf

    import rdmadev
    from graph_pass.devices import task_name
    from rdmadev.cluster import evictions, runtime

    ps, w0_task, w1_task = task_name("ps", 0), task_name("worker", 0), task_name("worker", 1)
    tf.config.experimental_connect_to_cluster(tf.train.ClusterSpec(spec))
    runtime.start(spec)
    rt = runtime.current()

    def counters():
        return {t: rt.call(t, {"op": "counters"}) for t in (ps, w0_task, w1_task)}

    with tf.device(ps):
        w0 = tf.Variable(tf.random.stateless_normal([WIDTH, WIDTH], [1, 2]) * 0.1)
        w1 = tf.Variable(tf.random.stateless_normal([WIDTH, 1], [3, 4]) * 0.1)

    def step(x, y):
        with tf.device(w0_task):
            with tf.GradientTape() as tape:
                h = tf.nn.relu(tf.matmul(x, w0))
                with tf.device(w1_task):
                    loss = tf.reduce_mean(tf.square(tf.matmul(h, w1) - y))
            g0, g1 = tape.gradient(loss, [w0, w1])
        with tf.device(ps):
            w0.assign_sub(0.05 * g0)
            w1.assign_sub(0.05 * g1)
        return loss

    fn = tf.function(step)
    if mode == "rdmadev":
        fn = rdmadev.optimize(fn)
    losses, out = [], {}

    def call(batch):
        x = tf.random.stateless_uniform([batch, WIDTH], [batch, 7])
        y = tf.random.stateless_uniform([batch, 1], [batch, 8])
        start = time.perf_counter()
        losses.append(float(fn(x, y)))
        return time.perf_counter() - start

    for batch in range(1, traces + 1):
        call(batch)
        if batch == 10:
            out["after_10"] = counters()
    out["again_s"] = [call(batch) for batch in range(1, again + 1)]
    out["warm_s"] = [call(traces) for _ in range(again)]
    out.update(losses=losses, w0=w0.numpy().tolist(), w1=w1.numpy().tolist(),
               traces=fn.experimental_get_tracing_count(), end=counters(),
               evictions=evictions.counters())
    if mode == "rdmadev":
        out["swapped"] = [len(r.swapped) for r in fn.reports]
    return out


def run_one(spec, mode, traces, again, env):
    """`one` in a coordinator process of its own."""
    proc = subprocess.run([sys.executable, os.path.abspath(__file__), "--one", json.dumps(spec),
                           mode, str(traces), str(again)], capture_output=True, text=True,
                          timeout=ONE_TIMEOUT_S, env={**os.environ, **env})
    lines = [l for l in proc.stdout.splitlines() if l.startswith("RESULT ")]
    if proc.returncode != 0 or not lines:
        raise RuntimeError(f"{mode} coordinator failed ({proc.returncode}):\n"
                           f"{(proc.stdout + proc.stderr)[-4000:]}")
    return json.loads(lines[-1][len("RESULT "):])


def spread(xs):
    m = statistics.median(xs)
    return m, (max(xs) - min(xs)) / m if m else 0.0


def table(results):
    """A markdown table of `results` ({configuration: one()'s result})."""
    rows = ["| configuration | task | registered after 10 / end | fds after 10 / end | memfd maps "
            "after 10 / end | chunks after 10 / end | pairs evicted / set up again | call run "
            "again ms (spread) | warm call ms (spread) |", "|---|---|---|---|---|---|---|---|---|"]
    for name, r in results.items():
        again, warm = spread(r["again_s"]), spread(r["warm_s"])
        for i, (task, end) in enumerate(r["end"].items()):
            ten = r["after_10"][task]
            fds = [c["fds"] - sum(c["control_connections"].values()) for c in (ten, end)]
            times = (f"{again[0] * 1e3:.1f} ({again[1]:.0%}) | {warm[0] * 1e3:.1f} "
                     f"({warm[1]:.0%})") if i == 0 else "| "
            rows.append(f"| {name if i == 0 else ''} | {task.split('/')[1][4:]}:"
                        f"{task.rsplit(':', 1)[1]} | {ten['registered_bytes'] / 1024:.0f} / "
                        f"{end['registered_bytes'] / 1024:.0f} KiB | {fds[0]} / {fds[1]} | "
                        f"{ten['memfd_maps']} / {end['memfd_maps']} | {ten['chunks']} / "
                        f"{end['chunks']} | {end['evicted']} / "
                        f"{end['set_up_again']} | {times} |")
    return "\n".join(rows)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--traces", type=int, default=60)
    ap.add_argument("--again", type=int, default=5)
    ap.add_argument("--json", help="write every configuration's result here")
    ap.add_argument("--one", nargs=4, metavar=("SPEC", "MODE", "TRACES", "AGAIN"),
                    help="one coordinator: print its result")
    args = ap.parse_args()
    if args.one:
        spec, mode, traces, again = args.one
        print("RESULT " + json.dumps(one(json.loads(spec), mode, int(traces), int(again))),
              flush=True)
        return 0
    import secrets

    from rdmadev.testing import launch
    results = {}
    budgets = {"default budget": {}, f"budget {SMALL_BUDGET >> 10} KiB": {
        "RDMADEV_MAX_REGISTERED_BYTES": str(SMALL_BUDGET)}}
    for label, budget in budgets.items():
        env = {"RDMADEV_SECRET": secrets.token_hex(16), "RDMADEV_DEADLINE_S": "60", **budget}
        with launch.Cluster(num_ps=1, num_workers=2, env=env) as cluster:
            modes = ("grpc", "rdmadev") if not results else ("rdmadev",)
            for mode in modes:
                name = "gRPC" if mode == "grpc" else f"rdmadev, {label}"
                print(f"retrace: {name}: {args.traces} traces ...", file=sys.stderr, flush=True)
                results[name] = run_one(cluster.spec, mode, args.traces, args.again, env)
    grpc = results["gRPC"]
    wrong = [name for name, r in results.items()
             if (r["losses"], r["w0"], r["w1"]) != (grpc["losses"], grpc["w0"], grpc["w1"])]
    print(table(results))
    print(f"\nbit for bit gRPC's: {'yes' if not wrong else 'NO: ' + ', '.join(wrong)}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f)
    return 1 if wrong else 0


if __name__ == "__main__":
    sys.exit(main())
