"""Embedding workload throughput: examples/sec of a DLRM / Wide&Deep-style ParameterServerStrategy
job, whose step moves tensors of run-time shapes (deduped ids, gathered rows, sparse gradients),
on TF's gRPC path, on rdmadev, and with no network at all.

    python benchmarks/embedding.py                     # the matrix: loopback (shm) and --netns (tcp)
    python benchmarks/embedding.py --modes loopback --windows 3 --steps 5   # a quick look
    python benchmarks/embedding.py --one --netns --json out.json            # one configuration

One configuration (`--one`) starts 2 ps + 2 workers with rdmadev's launcher (`rdmadev serve` on
127.0.0.1, or with `--netns` one network namespace per task and the tcp fabric) and is their
coordinator: `tf.distribute.ParameterServerStrategy` with a `MinSizePartitioner`, so each
embedding table (`--features` of them, `--vocab` x `--dim` floats) is a ShardedVariable split
across both ps while the small dense MLP stays whole. A step (`coordinator.schedule`) takes a
batch of `--batch` examples, each with `--hot` ids per sparse feature (skewed: a few ids are
hot, as in click logs) and `--dense` dense features; per feature it dedupes the ids
(`tf.unique`), looks the unique ids up in the sharded table (`tf.nn.embedding_lookup`: ids to
each ps, rows back), sums the rows per example, runs the MLP, and applies SGD: the tables'
gradients are IndexedSlices, applied with `scatter_sub` on each shard. Every tensor crossing
tasks but the MLP's weights has a shape known only at run time.

Three variants alternate window by window in the same process (as benchmarks/pss.py):
grpc (the step as is), rdmadev (`rdmadev.optimize` of the same Python step) and local (a
private copy of the tables and MLP on each worker: the compute-only ceiling), driven by one
coordinator thread per worker for local. examples/sec is the median over windows; the spread
is (max - min) / median. Before the windows, the rdmadev and grpc steps run `--check_steps`
steps one at a time from the same weights on one fixed batch (whichever worker runs a step)
and must give bitwise the same losses and weights. The report also counts what rdmadev
registered after setup (rings of channels that grew, stages of tensors larger than their
slots) in the warm-up and check and in the windows: none in the windows once sizes are learned
(`--dynamic_capacity 64K` starts the slots small enough to see them learned).
Every process and namespace started here is stopped at the end.
"""
import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.dirname(HERE))
from graph_pass.devices import split_task  # noqa: E402
RESULTS = os.path.join(HERE, "results")
VARIANTS = ("grpc", "rdmadev", "local")
#: Seconds one configuration may take in the matrix (cluster start, tracing, windows).
CONFIG_TIMEOUT_S = 1800
#: A variable is split only into shards of at least this: the tables (12.5 MiB by default) split
#: across both ps, the MLP's weights (~0.3 MiB) stay whole.
MIN_SHARD_BYTES = 1 << 20


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--one", action="store_true", help="run one configuration in this process")
    ap.add_argument("--netns", action="store_true", help="with --one: namespaces and tcp")
    ap.add_argument("--modes", nargs="+", default=["loopback", "netns"],
                    choices=["loopback", "netns"], help="matrix: loopback (shm) and/or netns (tcp)")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--features", type=int, default=8, help="sparse features (one table each)")
    ap.add_argument("--vocab", type=int, default=100_000, help="rows per table")
    ap.add_argument("--dim", type=int, default=32, help="embedding width")
    ap.add_argument("--hot", type=int, default=4, help="ids per example per feature")
    ap.add_argument("--dense", type=int, default=13, help="dense features")
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--batch", type=int, default=512, help="examples per step")
    ap.add_argument("--steps", type=int, default=10, help="steps per window")
    ap.add_argument("--windows", type=int, default=9, help="windows per variant")
    ap.add_argument("--warmup", type=int, default=4, help="untimed steps per variant")
    ap.add_argument("--check_steps", type=int, default=3)
    ap.add_argument("--dynamic_capacity",
                    help="RDMADEV_DYNAMIC_CAPACITY of the tasks (default: theirs, 1M): the slots a "
                         "run-time-shape channel starts with, grown from the sizes seen")
    ap.add_argument("--json", help="--one: write the result here")
    ap.add_argument("--prefix", default=os.path.join(RESULTS, "embedding_"),
                    help="matrix: results go to <prefix>results.{json,md} and <prefix>chart.png")
    ap.add_argument("--no_progress", action="store_true")
    ap.add_argument("--report", action="store_true",
                    help="with --one: print rdmadev's report of every worker's instantiation")
    args = ap.parse_args(argv)
    if min(args.workers, args.features, args.batch, args.steps, args.windows, args.hot) < 1:
        ap.error("workers, features, batch, steps, windows and hot must be >= 1")
    return args


# ----------------------------------------------------------------------------- one configuration

class Model:
    """The tables (ShardedVariables under a partitioning strategy, plain variables for the local
    copies) and the MLP, seeded so that every copy starts from the same weights."""

    def __init__(self, tf, args):
        rng = tf.random.Generator.from_seed(1)
        self.tables = [tf.Variable(rng.normal([args.vocab, args.dim]) * 0.05, name=f"table{f}")
                       for f in range(args.features)]
        width = args.features * args.dim + args.dense
        self.w1 = tf.Variable(rng.normal([width, args.hidden]) * (2.0 / width) ** 0.5, name="w1")
        self.w2 = tf.Variable(rng.normal([args.hidden, 1]) * (1.0 / args.hidden) ** 0.5, name="w2")

    def shards(self, table):
        return list(getattr(table, "variables", [table]))

    def state(self):
        return [s for t in self.tables for s in self.shards(t)] + [self.w1, self.w2]


def make_dataset_fn(tf, args, fixed=False):
    """Synthetic examples made on the worker, batch i a function of i only: per feature `hot`
    skewed ids (u^4 * vocab: a few rows are hot), dense features and a 0/1 label. `fixed`:
    every element is batch 0 (the bitwise check: ParameterServerStrategy picks the worker of a
    step and each worker has its own iterator, so only a batch that is the same on every
    worker at every position makes the check's steps compute the same thing on both paths)."""
    def dataset_fn(_context=None):
        def batch(i):
            u = tf.random.stateless_uniform([args.batch, args.features, args.hot], tf.stack([i, 1]))
            ids = tf.cast(tf.pow(u, 4.0) * args.vocab, tf.int64)
            x = tf.random.stateless_normal([args.batch, args.dense], tf.stack([i, 2]))
            y = tf.cast(tf.random.stateless_uniform([args.batch], tf.stack([i, 3])) < 0.3, tf.float32)
            return ids, x, y
        steps = tf.data.Dataset.range(1 << 40)
        return (steps.map(lambda i: batch(i * 0)) if fixed else steps.map(batch)).prefetch(2)
    return dataset_fn


def make_step(tf, strategy, model, lr=0.05):
    """The step: dedupe, sharded lookup, MLP, SGD with sparse updates of the table shards."""
    def replica_fn(ids, x, y):
        shards = [model.shards(t) for t in model.tables]
        with tf.GradientTape() as tape:
            pooled = []
            for f, parts in enumerate(shards):
                uniq, idx = tf.unique(tf.reshape(ids[:, f, :], [-1]))
                rows = tf.nn.embedding_lookup(parts, uniq)  # "div" sharding across the ps
                per_id = tf.gather(rows, idx)
                pooled.append(tf.reduce_sum(tf.reshape(per_id, [tf.shape(ids)[0], -1, rows.shape[-1]]), 1))
            h = tf.nn.relu(tf.matmul(tf.concat(pooled + [x], 1), model.w1))
            logits = tf.matmul(h, model.w2)[:, 0]
            loss = tf.reduce_mean(tf.nn.sigmoid_cross_entropy_with_logits(labels=y, logits=logits))
        flat = [s for parts in shards for s in parts]
        grads = tape.gradient(loss, flat + [model.w1, model.w2])
        for shard, g in zip(flat, grads):
            shard.scatter_sub(tf.IndexedSlices(lr * g.values, g.indices, g.dense_shape))
        model.w1.assign_sub(lr * grads[-2])
        model.w2.assign_sub(lr * grads[-1])
        return loss

    def step(iterator):
        ids, x, y = next(iterator)
        if strategy is None:
            return replica_fn(ids, x, y)
        return strategy.run(replica_fn, args=(ids, x, y))

    return step


def run_one(args):
    """One configuration: its own cluster; returns the result dict."""
    import pss
    pss.coordinator_env(args.netns)
    if args.dynamic_capacity:  # the tasks inherit the environment
        os.environ["RDMADEV_DYNAMIC_CAPACITY"] = args.dynamic_capacity
    from rdmadev.tf.startup import import_tensorflow
    tf = import_tensorflow()  # without TF's start-up lines
    import rdmadev
    from rdmadev.testing import launch

    cluster_cm, host = pss.start_cluster(args.netns, 2, args.workers)
    t_start = time.perf_counter()
    with cluster_cm as cluster:
        result = measure(args, tf, rdmadev, launch, cluster, host)
        # Every function, dataset and variable of the run died with measure()'s frame:
        # TF unregisters them on the tasks while they still run (no stray lines at exit).
        import gc
        gc.collect()
    result["wall_s"] = time.perf_counter() - t_start
    return result


def measure(args, tf, rdmadev, launch, cluster, host):
    """The variants on a running cluster: warm-up, the bitwise check, the windows."""
    import pss
    tasks = pss.Tasks(cluster.spec)
    tasks.pass_mode(False)
    spec = {**cluster.spec, "chief": [f"{host}:{launch.free_ports(1)[0]}"]}
    resolver = tf.distribute.cluster_resolver.SimpleClusterResolver(
        tf.train.ClusterSpec(spec), task_type="chief", task_id=0, rpc_layer="grpc")
    partitioner = tf.distribute.experimental.partitioners.MinSizePartitioner(
        min_shard_bytes=MIN_SHARD_BYTES, max_shards=2)
    strategy = tf.distribute.ParameterServerStrategy(resolver, variable_partitioner=partitioner)
    coordinator = tf.distribute.coordinator.ClusterCoordinator(strategy)
    with strategy.scope():
        model = Model(tf, args)
    where = sorted({s.device for s in model.state()})
    print(f"model: {len(model.state())} variables ({args.features} tables of {args.vocab} x "
          f"{args.dim} in {len(model.shards(model.tables[0]))} shards) on {where}",
          file=sys.stderr, flush=True)
    py_step = make_step(tf, strategy, model)
    fns = {"grpc": tf.function(py_step), "rdmadev": rdmadev.optimize(tf.function(py_step))}
    local = []
    for k in range(args.workers):
        device = f"/job:worker/replica:0/task:{k}"
        with tf.device(device):
            copy = Model(tf, args)
            it = iter(make_dataset_fn(tf, args)())
        local.append((device, tf.function(make_step(tf, None, copy)), it))
    fns["local"] = local
    dataset = coordinator.create_per_worker_dataset(make_dataset_fn(tf, args))
    job = pss.Job(argparse.Namespace(route="optimize", warmup=args.warmup,
                                     num_workers=args.workers, windows=args.windows,
                                     steps=args.steps, no_progress=args.no_progress),
                  tasks, coordinator, fns, iter(dataset))
    first, planned = job.warm_up()
    flat = {name: sum(p.values(), []) for name, p in planned.items()}
    report = pss.parse_reports(flat["rdmadev"])
    if args.report:
        print("\n".join(map(str, flat["rdmadev"])), file=sys.stderr, flush=True)
    dynamic = sum(1 for r in flat["rdmadev"] for s in r.swapped if s[3] is None)
    kept = [k for r in flat["rdmadev"] for k in r.kept]
    print(f"rdmadev planned {report['swapped']} transfers ({dynamic} of run-time shape), "
          f"{len(kept)} stayed on gRPC: {sorted({k[2] for k in kept}) or 'none'}",
          file=sys.stderr, flush=True)
    check_data = coordinator.create_per_worker_dataset(make_dataset_fn(tf, args, fixed=True))
    check = pss.bitwise_check(job, check_data, _StateView(model), _NoOptimizer(),
                              args.check_steps) if args.check_steps else None
    warmed = registrations(tasks)
    windows, _cpu = job.measure(pss.CpuClock(cluster))
    during = registrations(tasks)
    held = {t: c["registered_bytes"] for t, c in counters(tasks).items()}
    result = {
        "netns": args.netns, "fabric": "tcp" if args.netns else "shm",
        "workers": args.workers,
        "config": {k: getattr(args, k) for k in ("features", "vocab", "dim", "hot", "dense",
                                                 "hidden", "batch", "steps", "windows")},
        "examples_per_sec": {k: args.batch * statistics.median(v) for k, v in windows.items()},
        "spread_pct": {k: pss.spread(v) for k, v in windows.items()},
        "windows_steps_per_sec": windows, "first_steps_s": first,
        "swapped": report["swapped"], "dynamic_swapped": dynamic,
        "kept": [f"{k[1]} {k[0]} ({k[2]})" for k in kept],
        "kept_dynamic": sum(1 for k in kept if k[2] in ("dynamic_unbounded", "not_carried_dynamic")),
        "check": check,
        "registrations": {"warm_up": warmed,
                          "windows": {k: during[k] - warmed[k] for k in during}},
        "registered_bytes": held,
    }
    return result


#: What rdmadev registers after a channel's setup, counted on every task: rings of channels
#: whose tensors outgrew their slots (growth) and stages of tensors larger than them.
REGISTRATIONS = ("grown", "stages")


def counters(tasks):
    """{task: its rdmadev counters}."""
    return {t: tasks.rt.call(t, {"op": "counters"}) for t in tasks.all}


def registrations(tasks):
    """{REGISTRATIONS key: total over every task so far}."""
    now = counters(tasks).values()
    return {k: sum(c[k] for c in now) for k in REGISTRATIONS}


class _StateView:
    """What pss.bitwise_check reads of a Keras model: its variables."""

    def __init__(self, model):
        self.variables = model.state()


class _NoOptimizer:
    """SGD without slots: no optimizer state to reset between the checked runs."""
    variables = []


def print_one(r):
    eps = r["examples_per_sec"]
    print(f"{r['workers']} workers, 2 ps, fabric {r['fabric']}{' (netns)' if r['netns'] else ''}, "
          f"median of {len(r['windows_steps_per_sec']['grpc'])} windows of {r['config']['steps']} steps")
    for name in eps:
        print(f"  {name:<8} {eps[name]:9.0f} examples/s  spread {r['spread_pct'][name]:5.1f}%  "
              f"{eps[name] / eps['grpc']:.2f}x grpc")
    print(f"  rdmadev: {r['swapped']} transfers swapped ({r['dynamic_swapped']} of run-time shape), "
          f"{len(r['kept'])} stayed on gRPC ({r['kept_dynamic']} of them dynamic)")
    reg = r["registrations"]
    print(f"  registered after setup: warm-up and check {reg['warm_up']['grown']} grown rings, "
          f"{reg['warm_up']['stages']} stages; the windows {reg['windows']['grown']} grown rings, "
          f"{reg['windows']['stages']} stages (target 0)")
    print("  registered after the windows: " + ", ".join(
        "{}:{} {:.1f} MiB".format(*split_task(t), b / 2**20) for t, b in sorted(r["registered_bytes"].items())))
    if r["check"]:
        print(f"  check: bitwise identical to grpc over {r['check']['steps']} steps: "
              f"{r['check']['identical']}")


# ----------------------------------------------------------------------------- the matrix

def run_matrix(args):
    """Each mode in its own process (TF keeps one cluster per process); a table and a chart."""
    rows = []
    for mode in args.modes:
        cmd = [sys.executable, os.path.abspath(__file__), "--one", "--json", "/dev/stdout"]
        cmd += ["--netns"] if mode == "netns" else []
        for k in ("workers", "features", "vocab", "dim", "hot", "dense", "hidden", "batch",
                  "steps", "windows", "warmup", "check_steps", "dynamic_capacity"):
            if getattr(args, k) is not None:
                cmd += [f"--{k}", str(getattr(args, k))]
        if args.no_progress:
            cmd.append("--no_progress")
        print(f"== {mode}: {' '.join(cmd[1:])}", file=sys.stderr, flush=True)
        p = subprocess.run(cmd, stdout=subprocess.PIPE, text=True, timeout=CONFIG_TIMEOUT_S)
        if p.returncode != 0:
            raise SystemExit(f"{mode} failed (exit {p.returncode})")
        r = json.loads(p.stdout[p.stdout.index("{"):p.stdout.rindex("}") + 1])
        print_one(r)
        rows.append(r)
    os.makedirs(os.path.dirname(args.prefix) or ".", exist_ok=True)
    with open(args.prefix + "results.json", "w") as f:
        json.dump(rows, f, indent=1)
    md = table(rows)
    with open(args.prefix + "results.md", "w") as f:
        f.write(md + "\n")
    print(md)
    chart(rows, args.prefix + "chart.png")
    return 0


def table(rows):
    out = ["| configuration | grpc ex/s | rdmadev ex/s | no-network ex/s | rdmadev / grpc | "
           "rdmadev / no-network | spread grpc / rdmadev | dynamic pairs swapped / on gRPC | "
           "registered in the windows (grown rings, stages) | bitwise |",
           "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        e, s = r["examples_per_sec"], r["spread_pct"]
        where = "netns, tcp" if r["netns"] else "loopback, shm"
        out.append(f"| 2 ps + {r['workers']} workers, {where} | {e['grpc']:.0f} | {e['rdmadev']:.0f} | "
                   f"{e['local']:.0f} | {e['rdmadev'] / e['grpc']:.2f}x | {e['rdmadev'] / e['local']:.2f} | "
                   f"{s['grpc']:.0f}% / {s['rdmadev']:.0f}% | {r['dynamic_swapped']} / {r['kept_dynamic']} | "
                   f"{r['registrations']['windows']['grown']}, {r['registrations']['windows']['stages']} | "
                   f"{r['check']['identical'] if r['check'] else '-'} |")
    return "\n".join(out)


def chart(rows, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(6, 3.2))
    labels = ["netns, tcp" if r["netns"] else "loopback, shm" for r in rows]
    width = 0.27
    for i, name in enumerate(VARIANTS):
        ax.bar([j + (i - 1) * width for j in range(len(rows))],
               [r["examples_per_sec"][name] for r in rows], width, label=name)
    ax.set_xticks(range(len(rows)), labels)
    ax.set_ylabel("examples / s (median)")
    ax.set_title("Embedding job, 2 ps + 2 workers (benchmarks/embedding.py)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main(argv=None):
    args = parse_args(argv)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    if args.one:
        r = run_one(args)
        if args.json:
            with open(args.json, "w") as f:
                json.dump(r, f, indent=1)
        if args.json != "/dev/stdout":
            print_one(r)
        return 0
    return run_matrix(args)


if __name__ == "__main__":
    sys.exit(main())
