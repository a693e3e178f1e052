"""tf_cnn_benchmarks-style training throughput of a parameter-server job: images/sec, TF's
gRPC path against rdmadev, measured in one run against the same cluster.

    python benchmarks/cnn.py --model alexnet --batch_size 8 --num_workers 2 --server_protocol both
    python benchmarks/cnn.py --model resnet50 --image_size 32 --server_protocol rdmadev --json out.json

It starts num_ps + num_workers `rdmadev serve` tasks on 127.0.0.1 and is itself the
coordinator. The model's variables live on the ps tasks (spread greedily by size); every step
each worker generates its own synthetic ImageNet-like batch (random images of image_size^2 x 3,
1000 classes, seeded by a step counter on the worker: nothing comes from the coordinator),
reads every variable from its ps, runs forward and backward, and sends its gradients back; each
ps applies the mean (plain SGD, synchronous, like tf_cnn_benchmarks' `parameter_server` update).
The step is one multi-task tf.function called from the coordinator; `rdmadev` is the same
function wrapped by `rdmadev.optimize`.

`--server_protocol both` builds both functions over the same variables and alternates
measurement windows (grpc, rdmadev, grpc, ...); `--reference` adds the "no network" limit:
the same model with a private copy of its variables on each worker, updated there (no
cross-task tensor at all). Images/sec is the median over windows of
batch_size * num_workers * batches / seconds. `--profile` adds the dispatch floor and the
step's traffic without its compute (grpc_comm, rdmadev_comm) to the alternation, then traces
rdmadev steps with TF's profiler and tabulates its transfer events per task; `--netns`
puts every task in its own network namespace behind veth links (tcp fabric,
benchmarks/cnn_netns.py). `--between_graph` runs the job as tf_cnn_benchmarks'
parameter_server mode does instead: a TF1 client per worker, each applying its own gradients,
so each task swaps only its own half of every pair (benchmarks/cnn_between_graph.py).

Small image sizes make a CPU-only run communication-bound (the weights and gradients are
the same size at any image size; the compute shrinks with the pixels), as the GPU workers
of the tf_cnn_benchmarks papers were. Every process started here is stopped at the end.
"""
import argparse
import json
import os
import secrets
import signal
import statistics
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
HERE = os.path.dirname(os.path.abspath(__file__))
CLASSES = 1000
#: Upper bound on the whole measurement (windows of every variant), so a pathological
#: configuration cannot run for hours: the run stops early and says so.
MAX_MEASURE_S = 900.0


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="alexnet",
                    choices=["alexnet", "vgg16", "googlenet", "inception3", "resnet50", "resnet152"])
    ap.add_argument("--batch_size", type=int, default=8, help="images per worker per step")
    ap.add_argument("--num_workers", type=int, default=2)
    ap.add_argument("--num_ps", type=int, default=1)
    ap.add_argument("--num_batches", type=int, default=20,
                    help="measured steps per variant, split into --num_windows windows")
    ap.add_argument("--num_warmup_batches", type=int, default=3, help="untimed steps per variant")
    ap.add_argument("--num_windows", type=int, default=5)
    ap.add_argument("--server_protocol", default="both", choices=["grpc", "rdmadev", "both"])
    ap.add_argument("--reference", action="store_true",
                    help="also measure the no-network limit (variables on each worker itself)")
    ap.add_argument("--profile", action="store_true",
                    help="also time the traffic alone (grpc_comm, rdmadev_comm: reads and "
                         "gradient-sized writes, no compute) and the dispatch floor, and trace "
                         "rdmadev steps with TF's profiler: per task, where its transfers' time "
                         "goes (waiting for data or credits, writing, copying)")
    ap.add_argument("--image_size", type=int, default=32)
    ap.add_argument("--fabric", default="auto", choices=["auto", "shm", "tcp"],
                    help="RDMADEV_FABRIC for every task (auto = shm on one host)")
    ap.add_argument("--netns", action="store_true",
                    help="one network namespace per task, joined by veth links to a bridge; "
                         "forces the tcp fabric (root only; benchmarks/cnn_netns.py)")
    ap.add_argument("--bias_op", default="add", choices=["add", "bias_add"],
                    help="conv bias as x + b (default, as in BENCHMARKS.md's runs) or "
                         "tf.nn.bias_add (oneDNN fuses its gradient; see models/layers.py)")
    ap.add_argument("--learning_rate", type=float, default=0.001)
    ap.add_argument("--between_graph", action="store_true",
                    help="every worker runs its own TF1 client and applies its own gradients, as "
                         "tf_cnn_benchmarks' parameter_server mode (benchmarks/cnn_between_graph.py)")
    ap.add_argument("--window_s", type=float, default=10.0,
                    help="--between_graph: seconds of each measurement window")
    ap.add_argument("--compare_bundles", action="store_true",
                    help="add rdmadev_1ch: rdmadev with every pair on a channel of its own "
                         "(RDMADEV_BUNDLE_BELOW_BYTES=0), alternated with the rest")
    ap.add_argument("--device", metavar="TYPE",
                    help="each worker computes on its /device:TYPE:0 (XLA_CPU, GPU, a PluggableDevice's "
                         "type): its tensors cross via host; XLA_* devices are enabled here, a "
                         "PluggableDevice must be installed where the tasks load it")
    ap.add_argument("--json", help="write the result as JSON here")
    ap.add_argument("--no_progress", action="store_true")
    args = ap.parse_args(argv)
    if min(args.batch_size, args.num_workers, args.num_ps, args.num_batches, args.num_windows) < 1:
        ap.error("batch_size, num_workers, num_ps, num_batches and num_windows must be >= 1")
    if args.image_size < 32:
        ap.error("--image_size must be >= 32")
    args.num_windows = min(args.num_windows, args.num_batches)
    if args.between_graph and (args.netns or args.reference or args.profile
                               or args.server_protocol != "both"):
        ap.error("--between_graph measures grpc against rdmadev on 127.0.0.1 only")
    if args.between_graph and args.num_warmup_batches < 1:
        ap.error("--between_graph needs a warm-up step: it registers each session's graph")
    if args.netns:
        if args.fabric not in ("auto", "tcp"):
            ap.error("--netns uses the tcp fabric")
        args.fabric = "tcp"
    if args.device and args.between_graph:
        ap.error("--device is for the in-graph job; --between_graph places its workers' ops itself")
    return args


def build_step(tf, forward, params_for, workers, counters, batch, size, lr, device=None):
    """The training step over ``params_for[k]`` (worker k's variable set; the same set for
    every worker on ps), computed on each worker's `device` (a type) if given. Gradients of a
    shared set are averaged on each variable's device."""

    def step():
        losses, grads = [], []
        for k, worker in enumerate(workers):
            p = params_for[k]
            with tf.device(worker + (f"/device:{device}:0" if device else "")):
                c = counters[k].assign_add(1)
                images = tf.random.stateless_uniform([batch, size, size, 3], tf.stack([c, 2 * k]))
                labels = tf.random.stateless_uniform([batch], tf.stack([c, 2 * k + 1]),
                                                     maxval=CLASSES, dtype=tf.int32)
                with tf.GradientTape() as tape:
                    p.begin()
                    logits = forward(p, images)
                    loss = tf.reduce_mean(
                        tf.nn.sparse_softmax_cross_entropy_with_logits(labels, logits))
                grads.append(tape.gradient(loss, p.order))
            losses.append(loss)
        sets = {}
        for k in range(len(workers)):
            sets.setdefault(id(params_for[k]), (params_for[k], []))[1].append(grads[k])
        for p, gsets in sets.values():
            for v, *gs in zip(p.order, *gsets):
                with tf.device(v.device):
                    g = gs[0] if len(gs) == 1 else tf.add_n(gs) / len(gs)
                    v.assign_sub(lr * g)
        return tf.add_n(losses) / len(losses)

    return step


def build_comm_step(tf, params, workers, counters, lr):
    """The step's traffic without its compute: each worker reads every variable and sends back
    a same-sized "gradient" (the read times a tiny worker-side factor), ps applies the mean."""

    def step():
        grads, outs = [], []
        for k, worker in enumerate(workers):
            with tf.device(worker):
                c = counters[k].assign_add(1)
                s = tf.cast(c % 2, tf.float32) * 1e-6  # not constant-foldable: the reads must arrive
                grads.append([v * s for v in params.order])
                outs.append(s)
        for v, *gs in zip(params.order, *grads):
            with tf.device(v.device):
                v.assign_sub(lr * tf.add_n(gs) / len(gs))
        return tf.add_n(outs)

    return step


def build_floor_step(tf, workers, counters):
    """Dispatch only: one tiny op on every worker, no cross-task tensor."""

    def step():
        outs = []
        for k, worker in enumerate(workers):
            with tf.device(worker):
                outs.append(tf.cast(counters[k].assign_add(1), tf.float32))
        return tf.add_n(outs)

    return step


class Progress:
    """One status line on stderr, rewritten in place."""

    def __init__(self, enabled, total):
        self.enabled, self.total, self.done, self.t0 = enabled, total, 0, time.perf_counter()

    def tick(self, label):
        self.done += 1
        if self.enabled:
            n = 30 * self.done // max(self.total, 1)
            el = time.perf_counter() - self.t0
            print(f"\r[{'#' * n}{'.' * (30 - n)}] {self.done}/{self.total} {label:<24} {el:6.1f} s",
                  end="", file=sys.stderr, flush=True)

    def close(self):
        if self.enabled:
            print(file=sys.stderr, flush=True)


def measure(variants, args, images_per_step):
    """Warm-up, then alternating windows. Returns {name: [images/sec per window]}."""
    windows = [args.num_batches // args.num_windows + (1 if w < args.num_batches % args.num_windows
                                                       else 0) for w in range(args.num_windows)]
    total = len(variants) * (args.num_warmup_batches + args.num_batches)
    bar = Progress(not args.no_progress, total)
    rates = {name: [] for name in variants}
    losses = {}
    t_start = time.perf_counter()
    try:
        for name, fn in variants.items():
            for _ in range(args.num_warmup_batches):
                losses[name] = float(fn())
                bar.tick(f"{name} warm-up")
        for w, n in enumerate(windows):
            for name, fn in variants.items():
                t0 = time.perf_counter()
                for _ in range(n):
                    losses[name] = float(fn())
                    bar.tick(f"{name} window {w + 1}/{len(windows)}")
                rates[name].append(images_per_step * n / (time.perf_counter() - t0))
            if time.perf_counter() - t_start > MAX_MEASURE_S:
                print(f"\nstopping after window {w + 1}: over {MAX_MEASURE_S:.0f} s", file=sys.stderr)
                break
    finally:
        bar.close()
    return rates, losses


def trace_transfers(fn, cluster, result, images_per_step):
    """Runs rdmadev steps while TF's profiler traces every task; returns the per-task summary of
    the transfer events (rdmadev/tf/profile.py) and the speed while traced."""
    import tempfile

    from rdmadev.tf import profile

    names = {addr: f"{job}:{i}" for job, i, addr in cluster.tasks()}
    step_s = images_per_step / result["images_per_sec"]["rdmadev"]
    seconds = min(max(2.0, 8 * step_s), 30.0)  # several steps, bounded
    calls = []

    def work():
        t0 = time.perf_counter()
        float(fn())
        calls.append((t0, time.perf_counter()))

    print(f"tracing rdmadev steps for {seconds:.0f} s (TF profiler)", file=sys.stderr, flush=True)
    with tempfile.TemporaryDirectory() as logdir:
        run = profile.capture(list(names), logdir, seconds, work)
        rows = profile.summarize(profile.read(run.run_dir), names)
    inside = [b - a for a, b in calls if a >= run.traced_from and b <= run.traced_until]
    traced = images_per_step / statistics.median(inside) if inside else 0.0
    return {"rows": rows, "images_per_sec_traced": traced, "steps_traced": len(inside)}


def summarize_reports(reports):
    swapped = [s for r in reports for s in r.swapped]
    kept = [k for r in reports for k in r.kept]
    moved = {t: b for r in reports for t, b in r.bytes_per_step()[0].items()}  # as registered: per task
    return {"swapped": len(swapped), "kept": len(kept),
            "swapped_bytes_per_step": sum(s[3] or 0 for s in swapped),  # static sizes
            "fabrics": sorted({s[4] for s in swapped}),
            "kept_reasons": sorted({k[2] for k in kept}),
            "registered_bytes": {t: b for r in reports for t, b in r.registered.items()},
            "moved_bytes_per_step": moved,
            "bundled": sum(len(r.bundled) for r in reports),
            "bundles": len({(r.instance, b) for r in reports for b in r.bundled.values()}),
            "via_host": sum(len(r.via_host) for r in reports),
            "device_copies": sum(len(d) for r in reports for d in r.via_host.values())}


def run(args):
    os.environ.setdefault("RDMADEV_SECRET", secrets.token_hex(16))
    if args.fabric != "auto":
        os.environ["RDMADEV_FABRIC"] = args.fabric
    sys.path.insert(0, HERE)
    if args.netns:
        import cnn_netns
        why = cnn_netns.unavailable_reason()
        if why:
            raise SystemExit(why)
        os.environ["RDMADEV_TCP_ADDR"] = f"{cnn_netns.SUBNET}.1:0"  # the coordinator's bridge address
    if args.between_graph:
        import cnn_between_graph
        return cnn_between_graph.run(args)
    sys.path.insert(0, os.path.dirname(HERE))
    if args.device and args.device.startswith("XLA_"):  # before TF starts: TF's own switch
        os.environ["TF_XLA_FLAGS"] = "--tf_xla_enable_xla_devices"
    from rdmadev.tf.startup import import_tensorflow
    tf = import_tensorflow()  # without TF's start-up lines
    import rdmadev
    from graph_pass.devices import task_name
    from rdmadev.testing import launch
    from rdmadev.testing.timing import planned_with
    from models import MODELS, Params

    env = {"RDMADEV_SECRET": os.environ["RDMADEV_SECRET"]}
    if args.device and args.device.startswith("XLA_"):
        env["TF_XLA_FLAGS"] = "--tf_xla_enable_xla_devices"
    if args.fabric != "auto":
        env["RDMADEV_FABRIC"] = args.fabric
    forward = MODELS[args.model]
    t_start = time.perf_counter()
    where = "one network namespace each (veth + bridge, tcp fabric)" if args.netns else "127.0.0.1"
    print(f"starting {args.num_ps} ps + {args.num_workers} workers on {where} (rdmadev serve) ...",
          file=sys.stderr, flush=True)
    if args.netns:
        cluster_cm = cnn_netns.NetnsCluster(args.num_ps, args.num_workers, env=env)
    else:
        cluster_cm = launch.Cluster(num_ps=args.num_ps, num_workers=args.num_workers, env=env)
    with cluster_cm as cluster:
        tf.config.experimental_connect_to_cluster(tf.train.ClusterSpec(cluster.spec))
        ps = [task_name("ps", i) for i in range(args.num_ps)]
        workers = [task_name("worker", i) for i in range(args.num_workers)]
        counters = []
        for w in workers:
            with tf.device(w):
                counters.append(tf.Variable(tf.constant(0, tf.int64), name="step"))

        def params_on(devices):
            p = Params(tf, devices, args.bias_op)
            p.begin()
            forward(p, tf.zeros([1, args.image_size, args.image_size, 3]))  # creates the variables
            return p

        shared = params_on(ps)
        print(f"{args.model}: {len(shared.order)} variables, {shared.nbytes / 2**20:.1f} MiB on "
              f"{args.num_ps} ps", file=sys.stderr, flush=True)
        step = build_step(tf, forward, [shared] * len(workers), workers, counters,
                          args.batch_size, args.image_size, args.learning_rate, args.device)
        variants = {}
        if args.server_protocol in ("grpc", "both"):
            variants["grpc"] = tf.function(step)
        if args.server_protocol in ("rdmadev", "both"):
            variants["rdmadev"] = rdmadev.optimize(tf.function(step))
        if args.compare_bundles:
            variants["rdmadev_1ch"] = rdmadev.optimize(tf.function(step))
        if args.reference:
            local = [params_on([w]) for w in workers]
            variants["local"] = tf.function(build_step(
                tf, forward, local, workers, counters, args.batch_size, args.image_size,
                args.learning_rate, args.device))
        if args.profile:
            variants["floor"] = tf.function(build_floor_step(tf, workers, counters))
            comm = build_comm_step(tf, shared, workers, counters, args.learning_rate)
            variants["grpc_comm"] = tf.function(comm)
            variants["rdmadev_comm"] = rdmadev.optimize(tf.function(comm))
        t_setup = time.perf_counter()
        for name, fn in variants.items():  # trace, partition, plan, instantiate
            t0 = time.perf_counter()
            if name == "rdmadev_1ch":
                planned_with(fn, bundle_below_bytes=0)
            else:
                float(fn())
            if name == "rdmadev":  # before other functions plan: reports are per process
                report = summarize_reports(fn.reports)
            print(f"{name}: first step (trace + instantiate) {time.perf_counter() - t0:.1f} s",
                  file=sys.stderr, flush=True)
        t_first = time.perf_counter() - t_setup
        images_per_step = args.batch_size * args.num_workers
        rates, losses = measure(variants, args, images_per_step)
        result = {
            "model": args.model, "batch_size": args.batch_size, "num_workers": args.num_workers,
            "num_ps": args.num_ps, "image_size": args.image_size, "fabric": args.fabric,
            "netns": args.netns, "device": args.device,
            "variables": len(shared.order), "model_bytes": shared.nbytes,
            "num_batches": args.num_batches, "num_windows": len(next(iter(rates.values()))),
            "images_per_sec": {k: statistics.median(v) for k, v in rates.items() if v},
            "step_ms": {k: 1e3 * images_per_step / statistics.median(v) for k, v in rates.items() if v},
            "windows": rates, "final_loss": losses, "first_steps_s": t_first,
        }
        if "rdmadev" in variants:
            result["report"] = report
        if args.profile and "rdmadev" in variants:  # where the time goes, from TF's profiler
            result["trace"] = trace_transfers(variants["rdmadev"], cluster, result, images_per_step)
        if args.profile:  # one copy of the step's swapped bytes at this host's memcpy speed
            from rdmadev import _core
            size = 64 << 20
            gbs = statistics.median(size * 5 / _core.bench_memcpy(size, 5) / 1e9 for _ in range(5))
            result["memcpy_GBps"] = gbs
            if "rdmadev" in variants:
                result["one_copy_ms"] = report["swapped_bytes_per_step"] / gbs / 1e6
        # Free the functions while the tasks still run, so TF's cleanup does not log errors
        # about unreachable tasks at exit.
        variants.clear()
        del step, fn
        import gc
        gc.collect()
    result["wall_s"] = time.perf_counter() - t_start
    return result


def print_result(r):
    ips = r["images_per_sec"]
    how = (f"between-graph (a client per worker), windows of {r['window_s']:g} s"
           if r.get("between_graph") else "small images: communication-bound CPU run")
    print(f"{r['model']} batch {r['batch_size']} x {r['num_workers']} workers, {r['num_ps']} ps, "
          f"{r['image_size']}px, {r['model_bytes'] / 2**20:.1f} MiB of variables"
          f"{', workers on ' + r['device'] if r.get('device') else ''}; median of "
          f"{r['num_windows']} windows ({how})")
    for name, v in ips.items():
        if name in ("floor", "grpc_comm", "rdmadev_comm"):
            print(f"  {name:<12} {r['step_ms'][name]:9.1f} ms per step (profile)")
            continue
        extra = ""
        if name != "grpc" and "grpc" in ips:
            extra = f"  ({v / ips['grpc']:.2f}x grpc)"
        if "spread" in r:
            extra += f"  [{r['spread'][name][0]:.1f}-{r['spread'][name][1]:.1f}]"
        print(f"  {name:<12} {v:9.1f} images/sec  {r['step_ms'][name]:7.1f} ms/step{extra}")
    if "one_copy_ms" in r:
        print(f"  memcpy {r['memcpy_GBps']:.1f} GB/s (64 MiB): one copy of the swapped bytes = "
              f"{r['one_copy_ms']:.1f} ms per step")
    if "trace" in r:
        t = r["trace"]
        print(f"  where the time goes (TF profiler, {t['steps_traced']} rdmadev steps; traced "
              f"{t['images_per_sec_traced']:.1f} images/sec, "
              f"{t['images_per_sec_traced'] / ips['rdmadev']:.2f}x of untraced):")
        from rdmadev.tf import profile
        print("    " + profile.table(t["rows"]).replace("\n", "\n    "))
    if r.get("between_graph"):
        print(f"  rdmadev report: {r['halves_swapped']} half pairs swapped on the tasks, "
              f"{r['kept_on_grpc']} stayed on gRPC; {r['grown']} channels grew their slots "
              "(tensors larger than their first slots)")
    rep = r.get("report")
    if rep:
        print(f"  rdmadev report: {rep['swapped']} transfers swapped "
              f"({rep['swapped_bytes_per_step'] / 2**20:.1f} MiB per step, fabric "
              f"{','.join(rep['fabrics']) or '-'}), {rep['kept']} stayed on gRPC "
              f"({'; '.join(rep['kept_reasons']) or '-'}); {rep.get('bundled', 0)} of the swapped "
              f"in {rep.get('bundles', 0)} bundles")
        if rep.get("via_host"):
            print(f"  {rep['via_host']} of the swapped cross via host (an end on {r['device']}): "
                  f"{rep['device_copies']} device copies a step")
        from graph_pass.explain import short_task
        moved = rep.get("moved_bytes_per_step", {})
        print("  registered: " + ", ".join(
            f"{short_task(t)} {b / 2**20:.1f} MiB" + (f" ({b / moved[t]:.2f}x its {moved[t] / 2**20:.1f} MiB a step)"
                                                     if moved.get(t) else "")
            for t, b in sorted(rep["registered_bytes"].items())))


def main(argv=None):
    args = parse_args(argv)
    # SIGTERM (compare.py's timeout, a CI runner) unwinds like Ctrl-C, so the cluster, and with
    # --netns the namespaces, are always removed
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    result = run(args)
    print_result(result)
    if args.json:
        os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
