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

Each function is traced once and instantiated once per worker (checked: no new rdmadev
instantiation during the windows); steps/sec is the median over windows of steps / seconds,
each window scheduling `--steps` steps and joining. With one worker the rdmadev step is also
checked against gRPC: the same steps from the same weights give bitwise the same losses and
weights. The matrix mode runs each configuration in its own process (TF keeps one cluster per
process) and writes benchmarks/results/pss_results.{json,md} and pss.png. Every process and
namespace started here is stopped at the end.
"""
import argparse
import json
import os
import secrets
import signal
import statistics
import subprocess
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
#: --profile adds these to the alternation: the same step on a tiny model (the per-step cost
#: of a scheduled step: dispatch, control edges, result fetch), with no network and over
#: ps, and the step's traffic without its compute (every weight read by the worker, a
#: same-sized update back). With one worker also "local_sched": the no-network step
#: through coordinator.schedule, to show the thread driver of "local" costs what PSS's does.
PROFILE = ("local_floor", "grpc_floor", "rdmadev_floor", "grpc_comm", "rdmadev_comm")
#: Upper bound on one configuration's measurement (all windows): stops early and says so.
MAX_MEASURE_S = 600.0
#: Seconds one configuration process may take in matrix mode (start, trace, warm-up,
#: check, windows); only catches a hang.
RUN_TIMEOUT_S = 1200


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
        out["swapped_bytes"] += sum(s[3] for s in r.swapped)
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
    import tensorflow as tf
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


def run_one(args):
    """One configuration: its own cluster; returns the result dict."""
    import cnn
    import cnn_netns
    os.environ.setdefault("RDMADEV_SECRET", secrets.token_hex(16))
    if args.netns:
        why = cnn_netns.unavailable_reason()
        if why:
            raise SystemExit(why)
        os.environ["RDMADEV_FABRIC"] = "tcp"
        os.environ["RDMADEV_TCP_ADDR"] = f"{cnn_netns.SUBNET}.1:0"  # the coordinator's bridge address
    import tensorflow as tf
    import keras
    import rdmadev
    from rdmadev.testing import launch

    env = {"RDMADEV_SECRET": os.environ["RDMADEV_SECRET"]}
    fabric = "tcp" if args.netns else "shm"
    env["RDMADEV_FABRIC"] = fabric
    n = args.num_workers
    print(f"starting 1 ps + {n} workers ({'netns, tcp' if args.netns else '127.0.0.1, shm'}) ...",
          file=sys.stderr, flush=True)
    cluster_cm = (cnn_netns.NetnsCluster(1, n, env=env) if args.netns
                  else launch.Cluster(num_ps=1, num_workers=n, env=env))
    t_start = time.perf_counter()
    with cluster_cm as cluster:
        host = cnn_netns.SUBNET + ".1" if args.netns else launch.HOST
        spec = {"ps": cluster.spec["ps"], "worker": cluster.spec["worker"],
                "chief": [f"{host}:{launch.free_ports(1)[0]}"]}
        tasks = Tasks({"ps": spec["ps"], "worker": spec["worker"]})
        tasks.pass_mode(False)
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
        # grpc and rdmadev: two tf.functions of one Python step, each traced once
        py_step = make_step(tf, keras, strategy, model, opt)
        fns = {"grpc": tf.function(py_step), "rdmadev": as_rdmadev(tf, rdmadev, py_step, args.route)}
        names = list(VARIANTS)
        if args.profile:
            tiny_args = argparse.Namespace(**{**vars(args), "hidden": 8, "layers": 1})
            with strategy.scope():
                tiny, tiny_opt = build_model(keras, tiny_args, seed=1)
            floor = make_step(tf, keras, strategy, tiny, tiny_opt)
            comm = make_comm_step(tf, strategy, model)
            fns.update({"grpc_floor": tf.function(floor),
                        "rdmadev_floor": as_rdmadev(tf, rdmadev, floor, args.route),
                        "grpc_comm": tf.function(comm),
                        "rdmadev_comm": as_rdmadev(tf, rdmadev, comm, args.route)})
            names += PROFILE
        # "no network": a private model + optimizer (+ dataset) on each worker. PSS can
        # neither pin a scheduled function to a worker nor let workers see each other, so
        # these steps are driven like PSS drives its workers: one coordinator thread per
        # worker runs the step on it and fetches the loss, step after step.
        def private_copies(model_args):
            out = []
            for k in range(n):
                device = f"/job:worker/replica:0/task:{k}"
                with tf.device(device):
                    m, o = build_model(keras, model_args, seed=1)
                    it = iter(make_dataset_fn(tf, args)())
                out.append((device, tf.function(make_step(tf, keras, None, m, o)), it))
            return out, m, o

        fns["local"], m0, o0 = private_copies(args)
        if args.profile:
            fns["local_floor"] = private_copies(tiny_args)[0]
            if n == 1:  # one worker: schedule can only pick it (strategy.run, as scheduled)
                fns["local_sched"] = tf.function(make_step(tf, keras, strategy, m0, o0))
                names.append("local_sched")
        dataset = coordinator.create_per_worker_dataset(make_dataset_fn(tf, args))
        iterator = iter(dataset)

        def coord_for(name):
            return None if name in ("local", "local_floor") else coordinator

        def mode_for(name, warmup=False):
            """RDMADEV_AUTO in the tasks: on while the rdmadev variant runs (pass_mode route),
            and while "local" instantiates (its reports then show it has no cross-task
            transfer at all); off for gRPC."""
            auto = ((name.startswith("rdmadev") and args.route == "pass_mode")
                    or (warmup and name.startswith("local")))
            tasks.pass_mode(auto)

        # first steps: trace, partition, plan and instantiate on every worker
        first, planned = {}, {}
        warm = max(args.warmup, 2 * n)  # 2 per worker: every worker instantiates each function
        for name in names:
            mode_for(name, warmup=True)
            seen = tasks.reports()
            t0 = time.perf_counter()
            run_steps(coord_for(name), fns[name], iterator, warm)
            first[name] = time.perf_counter() - t0
            now = tasks.reports()
            planned[name] = {t: now[t][len(seen[t]):] for t in tasks.workers}
            print(f"{name}: first {warm} steps (trace + instantiate) {first[name]:.1f} s, "
                  f"{sum(map(len, planned[name].values()))} instantiations planned by rdmadev",
                  file=sys.stderr,
                  flush=True)
        flat = {name: sum(planned[name].values(), []) for name in names}
        if args.show_report:
            for name in names:
                for text in flat[name]:
                    print(f"[{name}] {text}", file=sys.stderr)
        report = parse_reports(flat["rdmadev"])
        if not report["swapped"]:  # never a gRPC-vs-gRPC comparison labelled rdmadev
            raise SystemExit(f"the rdmadev variant was not rewritten on any worker (route "
                             f"{args.route}): no transfer swapped; reports: {flat['rdmadev']}")
        report["workers_planned"] = sum(1 for t in tasks.workers
                                        if parse_reports(planned["rdmadev"][t])["swapped"])
        local_rep = parse_reports(flat["local"])
        report["local_instances"] = len(flat["local"])
        report["local_cross_task"] = local_rep["swapped"] + local_rep["kept"]
        report["grpc_instances"] = len(flat["grpc"])

        check = None
        if n == 1 and args.check_steps > 0:
            check = bitwise_check(tf, coordinator, dataset, fns, model, opt, args.check_steps, mode_for)
        after, traces = tasks.reports(), tracing_counts(fns)

        windows = {name: [] for name in names}
        clock = CpuClock(cluster)
        cpu = {name: {"ps": 0.0, "workers": 0.0, "coordinator": 0.0} for name in names}
        bar = cnn.Progress(not args.no_progress, args.windows * len(names))
        t_measure = time.perf_counter()
        try:
            for w in range(args.windows):
                r = w % len(names)
                order = names[r:] + names[:r]  # rotate: no variant always first
                for name in order:
                    mode_for(name)
                    c0, t0 = clock.read(), time.perf_counter()
                    run_steps(coord_for(name), fns[name], iterator, args.steps)
                    windows[name].append(args.steps / (time.perf_counter() - t0))
                    for k, v in clock.read().items():
                        cpu[name][k] += v - c0[k]
                    bar.tick(f"{name} window {w + 1}/{args.windows}")
                if time.perf_counter() - t_measure > MAX_MEASURE_S:
                    print(f"\nstopping after window {w + 1}: over {MAX_MEASURE_S:.0f} s",
                          file=sys.stderr)
                    break
        finally:
            bar.close()
        mode_for("off")
        end = tasks.reports()
        re_instantiated = sum(len(end[t]) - len(after[t]) for t in tasks.workers)
        retraced = {k: v - traces[k] for k, v in tracing_counts(fns).items() if v != traces[k]}
        result = {
            "num_workers": n, "fabric": fabric, "netns": args.netns, "route": args.route,
            "model_bytes": nbytes, "variables": len(model.trainable_variables),
            "config": {k: getattr(args, k) for k in ("features", "hidden", "layers", "classes",
                                                     "batch", "optimizer", "steps", "windows",
                                                     "warmup")},
            "steps_per_sec": {k: statistics.median(v) for k, v in windows.items()},
            "windows": windows, "first_steps_s": first, "report": report, "profile": args.profile,
            "cpu_ms_per_step": {name: {k: 1e3 * v / (args.steps * len(windows[name]))
                                       for k, v in c.items()} for name, c in cpu.items()},
            "instantiations_during_windows": re_instantiated, "retraced_during_windows": retraced,
            "check": check,
        }
        # Free the functions while the tasks still run (TF unregisters them on the tasks).
        del fns, iterator, dataset, coordinator, strategy
        import gc
        gc.collect()
    result["wall_s"] = time.perf_counter() - t_start
    return result


def bitwise_check(tf, coordinator, dataset, fns, model, opt, steps, mode_for):
    """grpc and rdmadev run the same steps (fresh iterators, one step at a time) from the same
    weights and optimizer state; returns both loss lists and whether all results are identical."""
    state = model.variables + opt.variables
    start = [v.numpy() for v in state]
    out = {}
    for name in ("grpc", "rdmadev"):
        for v, value in zip(state, start):
            v.assign(value)
        mode_for(name)
        losses = run_steps(coordinator, fns[name], iter(dataset), steps, join_each=True)
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
        base = "grpc_" + suffix if suffix in ("floor", "comm") else "grpc"
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
    if r["check"]:
        print(f"  check: bitwise identical to grpc over {r['check']['steps']} steps: "
              f"{r['check']['identical']}")


# ----------------------------------------------------------------------------- the matrix

def run_config(args, workers, mode):
    """One configuration in its own process (TF keeps one cluster per process)."""
    import tempfile
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "r.json")
        cmd = [sys.executable, os.path.abspath(__file__), "--one", "--num_workers", str(workers),
               "--json", out, "--no_progress"] + (["--netns"] if mode == "netns" else [])
        for k in ("features", "hidden", "layers", "classes", "batch", "optimizer", "steps",
                  "windows", "warmup", "check_steps", "route"):
            cmd += [f"--{k}", str(getattr(args, k))]
        p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            stdout, stderr = p.communicate(timeout=RUN_TIMEOUT_S)
        except BaseException:
            p.terminate()  # SIGTERM: the child stops its cluster (and namespaces) on the way out
            try:
                p.communicate(timeout=60)
            except subprocess.TimeoutExpired:
                p.kill()
                p.communicate()
            raise
        if p.returncode != 0 or not os.path.exists(out):
            tail = [l for l in stderr.splitlines() if "rror" in l or "xit" in l][-5:]
            return {"num_workers": workers, "netns": mode == "netns",
                    "error": f"exit {p.returncode}: " + " | ".join(tail)[-800:]}
        sys.stdout.write(stdout)
        with open(out) as f:
            return json.load(f)


def rows_of(results):
    """Table rows: one per (configuration, variant)."""
    rows = []
    for r in results:
        where = "tcp (netns)" if r.get("netns") else "shm (loopback)"
        if "error" in r:
            rows.append({"workers": r["num_workers"], "fabric": where, "variant": "-",
                         "error": r["error"]})
            continue
        g = r["windows"]["grpc"]
        for name in VARIANTS:
            w = r["windows"][name]
            ratios = [a / b for a, b in zip(w, g)]
            rows.append({"workers": r["num_workers"], "fabric": where, "variant": name,
                         "steps_per_sec": statistics.median(w), "min": min(w), "max": max(w),
                         "spread_pct": spread(w),
                         "ratio": statistics.median(w) / statistics.median(g),
                         "ratio_min": min(ratios), "ratio_max": max(ratios)})
    return rows


def markdown(rows):
    lines = ["| variant | workers | fabric | steps/s (median) | spread: min-max (% of median) "
             "| x gRPC (per-window range) |", "|---|---|---|---|---|---|"]
    for r in rows:
        if "error" in r:
            lines.append(f"| - | {r['workers']} | {r['fabric']} | failed: {r['error'][:150]} | | |")
            continue
        ratio = ("1.00" if r["variant"] == "grpc" else
                 f"**{r['ratio']:.2f}x** ({r['ratio_min']:.2f}-{r['ratio_max']:.2f})")
        name = "no-network" if r["variant"] == "local" else r["variant"]
        lines.append(f"| {name} | {r['workers']} | {r['fabric']} | {r['steps_per_sec']:.2f} | "
                     f"{r['min']:.2f}-{r['max']:.2f} ({r['spread_pct']:.0f}%) | {ratio} |")
    return "\n".join(lines) + "\n"


def notes(results):
    """Below the table: what crossed per step, the bitwise checks, re-instantiations."""
    out = []
    for r in results:
        if "error" in r:
            continue
        rep, check = r["report"], r["check"]
        where = "tcp (netns)" if r["netns"] else "shm (loopback)"
        out.append(f"- {r['num_workers']} worker(s), {where}: rdmadev swapped {rep['swapped']} "
                   f"transfers ({rep['swapped_bytes'] / 2**20:.1f} MiB per step, "
                   f"{', '.join(rep['fabrics'])}), {rep['kept']} stayed on gRPC; "
                   f"{r['instantiations_during_windows']} instantiations and "
                   f"{sum(r['retraced_during_windows'].values())} retraces during the windows"
                   + (f"; {check['steps']} steps bitwise identical to gRPC: "
                      f"{'yes' if check['identical'] else 'NO'}" if check else ""))
    return "\n".join(out) + "\n"


def plot(rows, path, note):
    """Bars of steps/s per configuration and variant, the ratio to gRPC written on top."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    configs = []
    for r in rows:
        if "error" not in r and (r["workers"], r["fabric"]) not in configs:
            configs.append((r["workers"], r["fabric"]))
    colors = {"grpc": "#888888", "rdmadev": "#d62728", "local": "#1f77b4"}
    fig, ax = plt.subplots(figsize=(7.5, 4.2))
    width = 0.27
    for j, name in enumerate(VARIANTS):
        for i, c in enumerate(configs):
            r = next(x for x in rows if "error" not in x and (x["workers"], x["fabric"]) == c
                     and x["variant"] == name)
            x = i + (j - 1) * width
            ax.bar(x, r["steps_per_sec"], width, color=colors[name],
                   yerr=[[r["steps_per_sec"] - r["min"]], [r["max"] - r["steps_per_sec"]]],
                   capsize=2, label=("no network (vars on worker)" if name == "local" else name)
                   if i == 0 else None)
            ax.annotate(f"{r['ratio']:.2f}x", (x, r["max"]), ha="center", va="bottom", fontsize=8,
                        fontweight="bold" if name == "rdmadev" else "normal")
    ax.set_xticks(range(len(configs)))
    ax.set_xticklabels([f"{w} worker{'s' if w > 1 else ''}\n{f}" for w, f in configs])
    ax.set_ylabel("steps/sec (median; bars: min-max of windows)")
    ax.set_title("ParameterServerStrategy, 1 ps: gRPC vs rdmadev vs no network (x gRPC on top)",
                 fontsize=10)
    ax.legend(fontsize=8)
    import textwrap
    fig.text(0.5, 0.01, "\n".join(textwrap.wrap(note, 120)), ha="center", fontsize=7)
    fig.tight_layout(rect=(0, 0.07, 1, 1))
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def run_matrix(args):
    if "netns" in args.modes:
        import cnn_netns
        why = cnn_netns.unavailable_reason()
        if why:
            print(f"skipping --netns configurations: {why}", file=sys.stderr)
            args.modes = [m for m in args.modes if m != "netns"]
    started = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    t0 = time.perf_counter()
    results = []
    for mode in args.modes:
        for workers in args.workers:
            print(f"[{time.perf_counter() - t0:5.0f} s] {workers} worker(s), {mode} ...",
                  file=sys.stderr, flush=True)
            try:
                results.append(run_config(args, workers, mode))
            except subprocess.TimeoutExpired:
                results.append({"num_workers": workers, "netns": mode == "netns",
                                "error": f"timed out after {RUN_TIMEOUT_S} s"})
    rows = rows_of(results)
    ok = [r for r in results if "error" not in r]
    c = args
    model = (f"Dense {c.features}-{'-'.join([str(c.hidden)] * c.layers)}-{c.classes}, "
             f"{ok[0]['model_bytes'] / 2**20:.1f} MiB of weights, " if ok else "")
    head = (f"{model}batch {c.batch}/worker, {c.optimizer}; median of {c.windows} windows of "
            f"{c.steps} steps per variant, alternating; route {c.route}")
    table = markdown(rows) + "\n" + notes(results)
    print(head)
    print(table)
    os.makedirs(os.path.dirname(os.path.abspath(args.prefix)), exist_ok=True)
    meta = {"started": started, "command": " ".join(["python", "benchmarks/pss.py"] + sys.argv[1:]),
            "host": os.uname().nodename, "cpus": os.cpu_count(), "head": head,
            "wall_s": time.perf_counter() - t0}
    with open(args.prefix + "results.json", "w") as f:
        json.dump({"meta": meta, "rows": rows, "runs": results}, f, indent=1)
    with open(args.prefix + "results.md", "w") as f:
        f.write(head + "\n\n" + table)
    if rows and any("error" not in r for r in rows):
        try:
            print("wrote", plot(rows, args.prefix.rstrip("_") + ".png",
                                f"{head}; {started}"))
        except ImportError:
            print("matplotlib is not installed: no chart", file=sys.stderr)
    if args.append_md:
        with open(args.append_md, "a") as f:
            f.write(f"\nRun of {started} (`{meta['command']}`, {meta['wall_s'] / 60:.0f} min):"
                    f" {head}.\n\n{table}")
    return 0 if all("error" not in r for r in results) else 1


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
    return run_matrix(args)


if __name__ == "__main__":
    sys.exit(main())
