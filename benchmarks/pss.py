"""ParameterServerStrategy training throughput: steps/sec of a TF2 parameter-server job in the
shape of TF's tutorial, on TF's gRPC path, on rdmadev, and with no network at all.

    python benchmarks/pss.py                          # the matrix: 1 and 2 workers, loopback (shm) and --netns (tcp)
    python benchmarks/pss.py --workers 1 --modes loopback --windows 3 --steps 5   # a quick look
    python benchmarks/pss.py --one --num_workers 2 --netns --json out.json        # one configuration

One configuration (`--one`) starts 1 ps + N workers with rdmadev's launcher (`rdmadev serve`,
on 127.0.0.1, or with `--netns` one network namespace per task and the tcp fabric, as
benchmarks/cnn_netns.py) and is itself the coordinator: a `chief` task of the ClusterSpec
given to SimpleClusterResolver, `tf.distribute.ParameterServerStrategy`, a `ClusterCoordinator`,
a per-worker synthetic dataset (`create_per_worker_dataset`), a dense Keras model and a Keras
optimizer created under `strategy.scope()` (their variables live on the ps), and a training step
`@tf.function` (`strategy.run` of forward, backward and `apply_gradients`) scheduled with
`coordinator.schedule`. Three variants alternate window by window in the same process:

  grpc      the step as is: the worker that runs it reads the weights from the ps and sends
            the gradients back over TF's gRPC.
  rdmadev   the same Python step as a second tf.function, rewritten by rdmadev on the worker
            that instantiates it (see ROUTE below).
  local     "no network": the same model and optimizer with their variables on the worker that
            runs the step (one copy per worker), the compute-only ceiling of any transport.
            Scheduled with one worker; with more, driven by one coordinator thread per worker
            (PSS cannot pin a scheduled function to a worker; see build_variants).

Each function is traced once and instantiated once per worker (checked: no new rdmadev
instantiation during the windows); steps/sec is the median over windows of steps / seconds,
each window scheduling `--steps` steps and joining. With one worker the rdmadev step is also
checked against gRPC: the same steps from the same weights give bitwise the same losses and
weights. `--profile` adds variants that split the step's cost (PROFILE), and CPU time per step
of the ps, the workers and the coordinator is recorded for every variant. Without `--one`,
benchmarks/pss_matrix.py runs each configuration in its own process (TF keeps one cluster per
process) and writes benchmarks/results/pss_results.{json,md} and pss.png. Every process and
namespace started here is stopped at the end.
"""
import argparse
import json
import os
import secrets
import signal
import statistics
import sys
import threading
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.dirname(HERE))
RESULTS = os.path.join(HERE, "results")
#: How rdmadev is switched on for the rdmadev variant (as_rdmadev). "optimize":
#: `rdmadev.optimize(tf.function(step))`, a tf.function whose opt-in travels to the worker
#: that instantiates it (main since 330f645). "pass_mode": the route before that, a plain
#: second tf.function while RDMADEV_AUTO is flipped on in every task (the `pass_mode` control
#: request) during the rdmadev windows only. Switching is this one line (or `--route`).
ROUTE = "optimize"
VARIANTS = ("grpc", "rdmadev", "local")
#: --profile adds these to the alternation: a step that only reads one 16-byte variable on
#: the ps ("touch": what a function spanning worker and ps costs by itself), the same
#: training step on a tiny model (the per-step cost of a scheduled step: dispatch, small
#: transfers, control edges, result fetch), with no network and over ps, and the step's
#: traffic without its compute (every weight read by the worker, a same-sized update back).
#: With one worker also "local_threads": the no-network step driven by a coordinator thread,
#: as "local" is with more workers, to show that driver costs what schedule does.
PROFILE = ("local_floor", "grpc_touch", "rdmadev_touch", "grpc_floor", "rdmadev_floor",
           "grpc_comm", "rdmadev_comm")
#: Upper bound on one configuration's measurement (all windows): stops early and says so.
MAX_MEASURE_S = 600.0


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--one", action="store_true", help="run one configuration in this process")
    ap.add_argument("--num_workers", type=int, default=1, help="with --one")
    ap.add_argument("--netns", action="store_true",
                    help="with --one: one network namespace per task, tcp fabric (root only)")
    ap.add_argument("--workers", type=int, nargs="+", default=[1, 2], help="matrix: worker counts")
    ap.add_argument("--modes", nargs="+", default=["loopback", "netns"],
                    choices=["loopback", "netns"], help="matrix: loopback (shm) and/or netns (tcp)")
    ap.add_argument("--features", type=int, default=784)
    ap.add_argument("--hidden", type=int, default=1024, help="units per hidden Dense layer")
    ap.add_argument("--layers", type=int, default=2, help="hidden Dense layers")
    ap.add_argument("--classes", type=int, default=10)
    ap.add_argument("--batch", type=int, default=32, help="examples per worker per step")
    ap.add_argument("--optimizer", default="sgd", choices=["sgd", "rmsprop", "adam"])
    ap.add_argument("--steps", type=int, default=10, help="steps per window")
    ap.add_argument("--windows", type=int, default=11, help="windows per variant")
    ap.add_argument("--warmup", type=int, default=3, help="untimed steps per variant")
    ap.add_argument("--check_steps", type=int, default=5,
                    help="steps of the bitwise rdmadev-vs-grpc check (one worker only; 0: skip)")
    ap.add_argument("--inter_op", type=int, default=0,
                    help="inter-op threads of every task (the coordinator's setting reaches the "
                         "tasks; 0: TF's default, one per core)")
    ap.add_argument("--route", default=ROUTE, choices=["optimize", "pass_mode"],
                    help="how the rdmadev variant asks for rdmadev (default %(default)s; see ROUTE)")
    ap.add_argument("--json", help="--one: write the result here")
    ap.add_argument("--prefix", default=os.path.join(RESULTS, "pss_"),
                    help="matrix: output path prefix (default benchmarks/results/pss_)")
    ap.add_argument("--append_md", help="matrix: append the table, command and date to this file")
    ap.add_argument("--profile", action="store_true",
                    help="with --one: also the dispatch floor and the traffic alone (PROFILE)")
    ap.add_argument("--show_report", action="store_true",
                    help="with --one: print the workers' rdmadev reports (what crosses, how)")
    ap.add_argument("--no_progress", action="store_true")
    args = ap.parse_args(argv)
    if min(args.num_workers, args.batch, args.steps, args.windows, args.layers, *args.workers) < 1:
        ap.error("worker counts, batch, steps, windows and layers must be >= 1")
    return args


# ----------------------------------------------------------------------------- one configuration

def build_model(keras, args, seed):
    """The dense model of every variant; seeded, so every copy starts from the same weights."""
    init = lambda i: keras.initializers.GlorotUniform(seed=seed + i)  # noqa: E731
    layers = [keras.layers.Dense(args.hidden, activation="relu", kernel_initializer=init(i))
              for i in range(args.layers)]
    model = keras.Sequential([keras.Input((args.features,)), *layers,
                              keras.layers.Dense(args.classes, kernel_initializer=init(99))])
    opt = {"sgd": lambda: keras.optimizers.SGD(0.01),
           "rmsprop": lambda: keras.optimizers.RMSprop(0.001),
           "adam": lambda: keras.optimizers.Adam(0.001)}[args.optimizer]()
    opt.build(model.trainable_variables)
    return model, opt


def make_dataset_fn(tf, args):
    """Synthetic batches made on the worker, element i a function of i only (deterministic)."""
    def dataset_fn(_context=None):
        def batch(i):
            x = tf.random.stateless_uniform([args.batch, args.features], tf.stack([i, 1]))
            y = tf.random.stateless_uniform([args.batch], tf.stack([i, 2]), maxval=args.classes,
                                            dtype=tf.int32)
            return x, y
        return tf.data.Dataset.range(1 << 40).map(batch).prefetch(2)
    return dataset_fn


def make_step(tf, keras, strategy, model, opt):
    """The tutorial's step: strategy.run of forward, backward and apply_gradients (without a
    strategy, for the private copies of the "local" variant, the replica function itself)."""
    loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)

    def replica_fn(x, y):
        with tf.GradientTape() as tape:
            loss = loss_fn(y, model(x, training=True))
        grads = tape.gradient(loss, model.trainable_variables)
        opt.apply_gradients(zip(grads, model.trainable_variables))
        return loss

    def step(iterator):
        x, y = next(iterator)
        if strategy is None:
            return replica_fn(x, y)
        return strategy.run(replica_fn, args=(x, y))

    return step


def make_comm_step(tf, strategy, model):
    """The step's traffic alone: the worker reads every weight and sends back a same-sized
    update (the read times a worker-side factor that cannot be folded), the ps applies it."""
    def replica_fn(x):
        s = tf.reduce_mean(x) * 1e-9
        for v in model.trainable_variables:
            v.value.assign_sub(v.value * s)  # the tf.Variable: one read, one update
        return s

    def step(iterator):
        return strategy.run(replica_fn, args=(next(iterator)[0],))

    return step


def make_touch_step(tf, var):
    """One 16-byte read from the ps and nothing else."""
    def step(iterator):
        del iterator  # same signature as the others
        return tf.reduce_sum(var + 1.0)

    return step


def as_rdmadev(tf, rdmadev, py_step, route):
    """The rdmadev variant of a Python step: the one place that decides how rdmadev is asked.
    route "pass_mode": a plain second tf.function (its own trace and instantiation), which
    the workers rewrite because RDMADEV_AUTO is on while it runs (mode_for in run_one).
    route "optimize": rdmadev.optimize's tf.function, whose opt-in travels to the worker."""
    if route == "optimize":
        fn = rdmadev.optimize(tf.function(py_step))
        if not isinstance(fn, type(tf.function(lambda: None))):  # what schedule accepts
            raise SystemExit(f"--route optimize: rdmadev.optimize returned a {type(fn).__name__}, "
                             "which coordinator.schedule refuses (tf.functions only) in this "
                             "rdmadev; use --route pass_mode")
        return fn
    return tf.function(py_step)


def parse_reports(reports):
    """Sums some worker reports (rdmadev.cluster.reports.Report)."""
    out = {"instances": len(reports), "swapped": 0, "kept": 0, "swapped_bytes": 0,
           "fabrics": sorted({s[4] for r in reports for s in r.swapped}),
           "kept_lines": [f"{k[1]} {k[0]} ({k[2]})" for r in reports for k in r.kept]}
    for r in reports:
        out["swapped"] += len(r.swapped)
        out["kept"] += len(r.kept)
        out["swapped_bytes"] += sum(s[3] or 0 for s in r.swapped)  # run-time shapes: None
    return out


class Tasks:
    """rdmadev control requests to every task of the cluster (reports, pass_mode)."""

    def __init__(self, spec):
        from graph_pass.devices import task_name
        from rdmadev.cluster import runtime
        self.rt = runtime.start(spec)
        self.all = [task_name(j, i) for j, addrs in spec.items() for i in range(len(addrs))]
        self.workers = [task_name("worker", i) for i in range(len(spec["worker"]))]

    def pass_mode(self, auto):
        for t in self.all:
            self.rt.call(t, {"op": "pass_mode", "auto": bool(auto)})

    def reports(self):
        """{worker: [Report, ...]}, oldest first."""
        from rdmadev.cluster.reports import Report
        return {t: [Report.from_dict(d) for d in self.rt.call(t, {"op": "reports"})]
                for t in self.workers}


def run_steps(coordinator, fn, iterator, n, join_each=False):
    """Schedules n steps of fn and joins; returns the losses fetched (all if join_each).
    `coordinator` None: fn is the "local" variant's [(device, step, iterator)] per worker."""
    if coordinator is None:
        return run_local(fn, n)
    remote = []
    for _ in range(n):
        remote.append(coordinator.schedule(fn, args=(iterator,)))
        if join_each:
            coordinator.join()
    coordinator.join()
    return [float(r.fetch()) for r in (remote if join_each else remote[-1:])]


def run_local(local, n):
    """n steps over the workers' private copies, as PSS's worker threads run scheduled steps:
    one thread per worker takes the next step while any is left, runs it on its worker and
    fetches the loss before taking another. Returns the last loss."""
    from rdmadev.tf.startup import import_tensorflow
    tf = import_tensorflow()  # without TF's start-up lines
    left, lock, losses, errors = [n], threading.Lock(), [], []

    def worker(device, step, iterator):
        try:
            while True:
                with lock:
                    if left[0] == 0:
                        return
                    left[0] -= 1
                with tf.device(device):
                    loss = float(step(iterator))
                with lock:
                    losses.append(loss)
        except Exception as e:  # noqa: BLE001 (re-raised in the caller's thread)
            errors.append(e)

    threads = [threading.Thread(target=worker, args=w, daemon=True) for w in local]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    return losses[-1:]


class CpuClock:
    """CPU seconds (user + system, all threads) used by the ps, the workers and this
    coordinator: on 2 shared cores a step's CPU cost, not only its latency, sets throughput."""

    def __init__(self, cluster):
        import re
        from rdmadev.tf.server import READY_MARKER
        self.pids = {}
        deadline = time.monotonic() + 30  # the line follows the port opening by milliseconds
        for job, index, _ in cluster.tasks():
            while (job, index) not in self.pids and time.monotonic() < deadline:
                text = cluster.log_path(job, index).read_text(errors="replace")
                m = re.search(rf"{READY_MARKER} \S+ .* pid=(\d+)", text)
                if m:
                    self.pids[(job, index)] = int(m.group(1))
                else:
                    time.sleep(0.1)
        self.tick = os.sysconf("SC_CLK_TCK")

    def read(self):
        """{"ps": s, "workers": s, "coordinator": s} so far."""
        out = {"ps": 0.0, "workers": 0.0}
        for (job, _), pid in self.pids.items():
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()  # fields[11:13]: utime, stime
            out["ps" if job == "ps" else "workers"] += (int(fields[11]) + int(fields[12])) / self.tick
        t = os.times()
        out["coordinator"] = t.user + t.system
        return out


def tracing_counts(fns):
    """How often each variant's tf.function(s) traced so far (a retrace means a new function,
    instantiated and planned again on the worker)."""
    def count(f):
        return f.experimental_get_tracing_count() if hasattr(f, "experimental_get_tracing_count") else 0
    return {name: sum(count(f[1]) for f in fn) if isinstance(fn, list) else count(fn)
            for name, fn in fns.items()}


def build_variants(tf, keras, rdmadev, args, strategy, model, opt):
    """{name: step} for every variant of this run, in alternation order. A step is a
    tf.function to schedule, or for "local" with several workers [(device, tf.function,
    iterator)] per worker (run_local)."""
    n = args.num_workers
    # grpc and rdmadev: two tf.functions of one Python step, each traced once
    py_step = make_step(tf, keras, strategy, model, opt)
    fns = {"grpc": tf.function(py_step), "rdmadev": as_rdmadev(tf, rdmadev, py_step, args.route)}

    # "no network": a private model + optimizer (+ dataset) on each worker. With one worker it
    # is scheduled like the others (schedule can only pick that worker). With more, PSS can
    # neither pin a scheduled function to a worker nor let workers see each other, so these
    # steps are driven as PSS drives its workers: one coordinator thread per worker runs a
    # step on it and fetches the loss before taking the next.
    def private_copies(model_args):
        per_worker = []
        for k in range(n):
            device = f"/job:worker/replica:0/task:{k}"
            with tf.device(device):
                m, o = build_model(keras, model_args, seed=1)
                it = iter(make_dataset_fn(tf, args)())
            per_worker.append((device, tf.function(make_step(tf, keras, None, m, o)), it))
        scheduled = tf.function(make_step(tf, keras, strategy, m, o)) if n == 1 else None
        return scheduled or per_worker, per_worker

    fns["local"], threads = private_copies(args)
    if not args.profile:
        return fns
    tiny_args = argparse.Namespace(**{**vars(args), "hidden": 8, "layers": 1})
    with strategy.scope():
        tiny, tiny_opt = build_model(keras, tiny_args, seed=1)
        scalar = tf.Variable(tf.zeros([4]), name="touch")
    fns["local_floor"] = private_copies(tiny_args)[0]
    for name, py in (("touch", make_touch_step(tf, scalar)),
                     ("floor", make_step(tf, keras, strategy, tiny, tiny_opt)),
                     ("comm", make_comm_step(tf, strategy, model))):
        fns[f"grpc_{name}"] = tf.function(py)
        fns[f"rdmadev_{name}"] = as_rdmadev(tf, rdmadev, py, args.route)
    if n == 1:
        fns["local_threads"] = threads
    return fns


class Job:
    """The variants of one configuration against one cluster: runs steps of any of them with
    the right RDMADEV_AUTO in the tasks, and reads the workers' reports."""

    def __init__(self, args, tasks, coordinator, fns, iterator):
        self.args, self.tasks, self.coordinator = args, tasks, coordinator
        self.fns, self.iterator = fns, iterator

    def mode(self, name, warmup=False):
        """RDMADEV_AUTO in the tasks: on while an rdmadev variant runs on the pass_mode route,
        and while a "local" variant instantiates (its reports then show any cross-task
        transfer it has: none); off otherwise, so gRPC stays gRPC."""
        auto = ((name.startswith("rdmadev") and self.args.route == "pass_mode")
                or (warmup and name.startswith("local")))
        self.tasks.pass_mode(auto)

    def run(self, name, steps, iterator=None, join_each=False):
        fn = self.fns[name]
        if isinstance(fn, list):  # private copies driven by one thread per worker
            return run_local(fn, steps)
        return run_steps(self.coordinator, fn, self.iterator if iterator is None else iterator,
                         steps, join_each)

    def warm_up(self):
        """Traces, partitions, plans and instantiates every variant on every worker.
        Returns (first-steps seconds, {name: {worker: [Report]}} planned meanwhile)."""
        first, planned = {}, {}
        steps = max(self.args.warmup, 2 * self.args.num_workers)  # every worker gets some
        for name in self.fns:
            self.mode(name, warmup=True)
            seen = self.tasks.reports()
            t0 = time.perf_counter()
            self.run(name, steps)
            first[name] = time.perf_counter() - t0
            now = self.tasks.reports()
            planned[name] = {t: now[t][len(seen[t]):] for t in self.tasks.workers}
            print(f"{name}: first {steps} steps (trace + instantiate) {first[name]:.1f} s, "
                  f"{sum(map(len, planned[name].values()))} instantiations planned by rdmadev",
                  file=sys.stderr, flush=True)
        return first, planned

    def measure(self, clock):
        """Alternating windows; returns ({name: [steps/s per window]}, {name: CPU s by role})."""
        import cnn
        names = list(self.fns)
        windows = {name: [] for name in names}
        cpu = {name: {"ps": 0.0, "workers": 0.0, "coordinator": 0.0} for name in names}
        bar = cnn.Progress(not self.args.no_progress, self.args.windows * len(names))
        t_measure = time.perf_counter()
        try:
            for w in range(self.args.windows):
                r = w % len(names)
                for name in names[r:] + names[:r]:  # rotate: no variant always first
                    self.mode(name)
                    c0, t0 = clock.read(), time.perf_counter()
                    self.run(name, self.args.steps)
                    windows[name].append(self.args.steps / (time.perf_counter() - t0))
                    for k, v in clock.read().items():
                        cpu[name][k] += v - c0[k]
                    bar.tick(f"{name} window {w + 1}/{self.args.windows}")
                if time.perf_counter() - t_measure > MAX_MEASURE_S:
                    print(f"\nstopping after window {w + 1}: over {MAX_MEASURE_S:.0f} s",
                          file=sys.stderr)
                    break
        finally:
            bar.close()
            self.mode("off")
        return windows, cpu


def summarize_planned(planned, workers):
    """What rdmadev planned at warm-up: the rdmadev variant's transfers on every worker, and
    that gRPC and "local" planned nothing with a cross-task transfer."""
    flat = {name: sum(p.values(), []) for name, p in planned.items()}
    report = parse_reports(flat["rdmadev"])
    if not report["swapped"]:  # never a gRPC-vs-gRPC comparison labelled rdmadev
        raise SystemExit(f"the rdmadev variant was not rewritten on any worker: no transfer "
                         f"swapped; its reports: {flat['rdmadev']}")
    report["workers_planned"] = sum(1 for t in workers
                                    if parse_reports(planned["rdmadev"][t])["swapped"])
    local = parse_reports(flat["local"])
    report["local_instances"] = len(flat["local"])
    report["local_cross_task"] = local["swapped"] + local["kept"]
    report["grpc_instances"] = len(flat["grpc"])
    return report, flat


def coordinator_env(netns):
    """Sets this coordinator's environment for a run: a cluster secret, and with `netns` the
    tcp fabric on the bridge address. Exits naming why network namespaces are unavailable."""
    import cnn_netns
    os.environ.setdefault("RDMADEV_SECRET", secrets.token_hex(16))
    if netns:
        why = cnn_netns.unavailable_reason()
        if why:
            raise SystemExit(why)
        os.environ["RDMADEV_FABRIC"] = "tcp"
        os.environ["RDMADEV_TCP_ADDR"] = f"{cnn_netns.SUBNET}.1:0"  # the coordinator's bridge address


def start_cluster(netns, num_ps, num_workers):
    """The cluster of `rdmadev serve` tasks (a context manager) and the coordinator's host."""
    import cnn_netns
    from rdmadev.testing import launch
    env = {"RDMADEV_SECRET": os.environ["RDMADEV_SECRET"], "RDMADEV_FABRIC": "tcp" if netns else "shm"}
    print(f"starting {num_ps} ps + {num_workers} workers "
          f"({'netns, tcp' if netns else '127.0.0.1, shm'}) ...", file=sys.stderr, flush=True)
    if netns:
        return cnn_netns.NetnsCluster(num_ps, num_workers, env=env), cnn_netns.SUBNET + ".1"
    return launch.Cluster(num_ps=num_ps, num_workers=num_workers, env=env), launch.HOST


def run_one(args):
    """One configuration: its own cluster; returns the result dict."""
    coordinator_env(args.netns)
    from rdmadev.tf.startup import import_tensorflow
    tf = import_tensorflow()  # without TF's start-up lines
    import keras
    import rdmadev
    from rdmadev.testing import launch

    n = args.num_workers
    cluster_cm, host = start_cluster(args.netns, 1, n)
    t_start = time.perf_counter()
    with cluster_cm as cluster:
        tasks = Tasks(cluster.spec)
        tasks.pass_mode(False)
        spec = {**cluster.spec, "chief": [f"{host}:{launch.free_ports(1)[0]}"]}
        if args.inter_op:
            tf.config.threading.set_inter_op_parallelism_threads(args.inter_op)
        resolver = tf.distribute.cluster_resolver.SimpleClusterResolver(
            tf.train.ClusterSpec(spec), task_type="chief", task_id=0, rpc_layer="grpc")
        strategy = tf.distribute.ParameterServerStrategy(resolver)
        coordinator = tf.distribute.coordinator.ClusterCoordinator(strategy)
        with strategy.scope():
            model, opt = build_model(keras, args, seed=1)
        nbytes = sum(int(v.numpy().nbytes) for v in model.trainable_variables)
        where = sorted({v.value.device for v in model.trainable_variables})
        print(f"model: {len(model.trainable_variables)} variables, {nbytes / 2**20:.1f} MiB on {where}",
              file=sys.stderr, flush=True)
        fns = build_variants(tf, keras, rdmadev, args, strategy, model, opt)
        dataset = coordinator.create_per_worker_dataset(make_dataset_fn(tf, args))
        job = Job(args, tasks, coordinator, fns, iter(dataset))

        first, planned = job.warm_up()
        report, flat = summarize_planned(planned, tasks.workers)
        if args.show_report:
            for name, reps in flat.items():
                for rep in reps:
                    print(f"[{name}] {rep}", file=sys.stderr)
        check = None
        if n == 1 and args.check_steps > 0:
            check = bitwise_check(job, dataset, model, opt, args.check_steps)
        after, traces = tasks.reports(), tracing_counts(fns)
        windows, cpu = job.measure(CpuClock(cluster))
        end = tasks.reports()
        result = {
            "num_workers": n, "fabric": "tcp" if args.netns else "shm", "netns": args.netns,
            "route": args.route, "model_bytes": nbytes,
            "variables": len(model.trainable_variables),
            "config": {k: getattr(args, k) for k in ("features", "hidden", "layers", "classes",
                                                     "batch", "optimizer", "steps", "windows",
                                                     "warmup", "inter_op")},
            "steps_per_sec": {k: statistics.median(v) for k, v in windows.items()},
            "windows": windows, "first_steps_s": first, "report": report, "profile": args.profile,
            "cpu_ms_per_step": {name: {k: 1e3 * v / (args.steps * len(windows[name]))
                                       for k, v in c.items()} for name, c in cpu.items()},
            "instantiations_during_windows": sum(len(end[t]) - len(after[t]) for t in tasks.workers),
            "retraced_during_windows": {k: v - traces[k] for k, v in tracing_counts(fns).items()
                                        if v != traces[k]},
            "check": check,
        }
        if args.profile:  # one copy of a worker's step bytes at this host's memcpy speed now
            from rdmadev import _core
            size = 64 << 20
            gbs = statistics.median(size * 5 / _core.bench_memcpy(size, 5) / 1e9 for _ in range(5))
            result["memcpy_GBps"] = gbs
            result["one_copy_ms"] = report["swapped_bytes"] / n / gbs / 1e6
        # Free the functions while the tasks still run (TF unregisters them on the tasks).
        del fns, job, dataset, coordinator, strategy
        import gc
        gc.collect()
    result["wall_s"] = time.perf_counter() - t_start
    return result


def bitwise_check(job, dataset, model, opt, steps):
    """grpc and rdmadev run the same steps (fresh iterators, one step at a time) from the same
    weights and optimizer state; returns both loss lists and whether all results are identical."""
    state = model.variables + opt.variables
    start = [v.numpy() for v in state]
    out = {}
    for name in ("grpc", "rdmadev"):
        for v, value in zip(state, start):
            v.assign(value)
        job.mode(name)
        losses = job.run(name, steps, iterator=iter(dataset), join_each=True)
        out[name] = {"losses": losses, "final": [v.numpy() for v in state]}
    for v, value in zip(state, out["grpc"]["final"]):  # leave the grpc result in place
        v.assign(value)
    same = out["grpc"]["losses"] == out["rdmadev"]["losses"] and all(
        (a == b).all() for a, b in zip(out["grpc"]["final"], out["rdmadev"]["final"]))
    print(f"check: {steps} steps, losses grpc {out['grpc']['losses']} rdmadev "
          f"{out['rdmadev']['losses']}; bitwise identical: {same}", file=sys.stderr, flush=True)
    return {"steps": steps, "grpc_losses": out["grpc"]["losses"],
            "rdmadev_losses": out["rdmadev"]["losses"], "identical": bool(same)}


def spread(values):
    """(max - min) / median of a variant's windows, in percent."""
    return 100.0 * (max(values) - min(values)) / statistics.median(values)


def print_one(r):
    sps = r["steps_per_sec"]
    print(f"{r['num_workers']} worker(s), fabric {r['fabric']}{' (netns)' if r['netns'] else ''}, "
          f"{r['model_bytes'] / 2**20:.1f} MiB of weights, median of {len(r['windows']['grpc'])} "
          f"windows of {r['config']['steps']} steps")
    for name in sps:
        suffix = name.partition("_")[2]
        base = "grpc_" + suffix if suffix in ("touch", "floor", "comm") else "grpc"
        c = r["cpu_ms_per_step"][name]
        print(f"  {name:<14} {sps[name]:8.2f} steps/s {1e3 / sps[name]:8.1f} ms/step  spread "
              f"{spread(r['windows'][name]):5.1f}%  {sps[name] / sps[base]:.2f}x {base:<11} CPU ms "
              f"per step: ps {c['ps']:5.1f} workers {c['workers']:5.1f} coordinator "
              f"{c['coordinator']:5.1f}")
    rep = r["report"]
    print(f"  rdmadev: {rep['swapped']} transfers swapped ({rep['swapped_bytes'] / 2**20:.1f} MiB "
          f"per step, {','.join(rep['fabrics']) or '-'}), {rep['kept']} stayed on gRPC; "
          f"{rep['workers_planned']}/{r['num_workers']} workers planned; instantiations during "
          f"the windows: {r['instantiations_during_windows']}, retraces: "
          f"{r['retraced_during_windows'] or 'none'}; local: {rep['local_instances']} "
          f"instantiations, {rep['local_cross_task']} cross-task transfers")
    if "memcpy_GBps" in r:
        print(f"  memcpy {r['memcpy_GBps']:.1f} GB/s (64 MiB): one copy of a worker's "
              f"{rep['swapped_bytes'] / r['num_workers'] / 2**20:.1f} MiB per step = "
              f"{r['one_copy_ms']:.1f} ms")
    if r["check"]:
        print(f"  check: bitwise identical to grpc over {r['check']['steps']} steps: "
              f"{r['check']['identical']}")


def main(argv=None):
    args = parse_args(argv)
    # SIGTERM (a timeout, a CI runner) unwinds like Ctrl-C: the cluster and namespaces go
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    if args.one:
        r = run_one(args)
        print_one(r)
        if args.json:
            with open(args.json, "w") as f:
                json.dump(r, f, indent=1)
        return 0
    import pss_matrix
    return pss_matrix.run_matrix(args)


if __name__ == "__main__":
    sys.exit(main())
