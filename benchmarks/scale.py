"""What a task costs as the cluster grows: 1 ps + N-1 workers for N = 2, 4, 8, 16, 32 on
127.0.0.1, each size run twice in the same run, on plain TF servers (protocol "grpc") and on
"grpc+rdmadev", and measured the same way from /proc.

    python benchmarks/scale.py                          # 2..32 tasks; writes results/scale.{json,png}
    python benchmarks/scale.py --sizes 2 4 --rounds 3   # a quick look
    python benchmarks/scale.py --one --tasks 4 --protocol grpc+rdmadev --json out.json
    python benchmarks/scale.py --fabric tcp --sizes 2 8 16 --prefix /tmp/scale_tcp
    python benchmarks/scale.py --replot                # the chart again from results/scale.json

Each (size, protocol) runs in its own `--one` process (TF keeps one cluster per process): it
starts every task as its own process (`--task`: `tf.distribute.Server` with the protocol, as a
user's launcher does; the grpc tasks with RDMADEV_PLUGIN=0, so plain TF), is itself the
coordinator (ParameterServerStrategy + ClusterCoordinator, `rpc_layer` = the protocol) and
runs a tiny step: each worker reads a small variable from the ps, computes a loss and sends
back an update of the variable's size (every element 1.0, so concurrent updates add up
exactly).

  first round  one step scheduled per worker and joined, on servers that are up and connected:
               what the first step costs (function registration, partitioning, and on
               rdmadev the plan, the endpoints and the channels set up); the coordinator's
               trace is timed apart (trace_s).
  new step     the same for `--fresh` new functions on the same servers, after the probes
               (endpoints and control connections exist by then): median.
  steady round the first round's step again, `--rounds` times (bounded by `--round_budget_s`):
               median seconds per round and spread ((max - min) / median).
  per task     from /proc/<pid> of each task, after the rounds and `--settle_s` (on rdmadev
               also until its heartbeats reach every peer): threads (and their names; also
               the most seen during the first round, sampled every 20 ms), descriptors by kind,
               mappings of rdmadev memfds, RSS, PSS and heap; from the task's open rdmadev
               memfds the regions it holds (= registrations on verbs: one per region) and their
               bytes rounded to pages (held); on rdmadev also its counters (registered bytes in
               use, control connections, Python thread names) and reports.
  check        from a reset variable, `--check_steps` steps one at a time: the losses and the
               final variable, compared bitwise between the protocols; on rdmadev every
               worker's reports (every cross-task tensor between ps and workers swapped).

Before a size, the memory it needs (the largest task heap measured so far times its tasks, TF's
libraries once, the coordinator and a margin) is checked against MemAvailable: a size that does
not fit is skipped and says so. Every configuration records the commit of the rdmadev it ran
(an editable install runs its source tree, which may move during a run). Output: one line per
configuration on stderr, a table on stdout, the JSON and a chart.
"""
import argparse
import collections
import faulthandler
import json
import os
import re
import secrets
import signal
import statistics
import subprocess
import sys
import tempfile
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
HERE = os.path.dirname(os.path.abspath(__file__))
RESULTS = os.path.join(HERE, "results")
PROTOCOLS = ("grpc", "grpc+rdmadev")
#: Float32 elements of the variable each step reads and updates: 1 KiB, small, so that the
#: step's compute is nothing and what is measured is what the cluster costs.
VAR_ELEMENTS = 256
#: Seconds all tasks of one size may take to listen: one TF server imports and starts in 5-9 s
#: of CPU on an idle 2-core VM; 32 starting at once need ~32 * 8 / 2 s, with room for load.
READY_S_PER_TASK = 15.0
#: Seconds one configuration process may take beyond its tasks' start: trace, first round,
#: rounds (bounded by --round_budget_s), check, counters. Only catches a hang.
CONFIG_TIMEOUT_S = 600.0
#: Seconds to wait before the tasks are probed after the rounds, on either protocol: more than
#: twice the interval at which an rdmadev task looks for new peers to ping (RDMADEV_LIVENESS_S
#: / PINGS_PER_LIVENESS = 2.5 s by default, rdmadev/cluster/liveness.py); and at most how long
#: to wait more on rdmadev for every task's heartbeats to be connected.
SETTLE_S = 6.0
#: Seconds between two samples of every task's thread count during the first round: a
#: transient thread lives at least a request's duration, and one sweep of 32 tasks' /proc
#: takes ~1 ms.
PEAK_SAMPLE_S = 0.02
SETTLE_MAX_S = 30.0
#: Bytes the coordinator process takes (TF, PSS, one thread per worker); the heap (anonymous
#: memory) assumed per task before one was measured; the pages all tasks share once (TF's
#: libraries: a task's RSS is ~0.7 GB, most of it these).
COORDINATOR_BYTES = 1.5e9
DEFAULT_TASK_BYTES = 0.4e9
SHARED_BYTES = 1.0e9
#: MemAvailable kept free while a size runs: the machine is shared.
MEMORY_MARGIN_BYTES = 2e9


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", type=int, nargs="+", default=[2, 4, 8, 16, 32],
                    help="tasks per cluster (1 ps + N-1 workers)")
    ap.add_argument("--rounds", type=int, default=7, help="steady rounds (one step per worker each)")
    ap.add_argument("--round_budget_s", type=float, default=90.0,
                    help="stop the steady rounds after this many seconds (at least 2 rounds)")
    ap.add_argument("--check_steps", type=int, default=3, help="steps of the bitwise check")
    ap.add_argument("--fresh", type=int, default=2,
                    help="new step functions whose first round is timed after the probes")
    ap.add_argument("--prefix", default=os.path.join(RESULTS, "scale"),
                    help="writes <prefix>.json and <prefix>.png")
    ap.add_argument("--no_chart", action="store_true")
    ap.add_argument("--replot", action="store_true",
                    help="only draw <prefix>.png again from <prefix>.json")
    ap.add_argument("--settle_s", type=float, default=SETTLE_S,
                    help="seconds to wait before probing the tasks (then, on rdmadev, until "
                         "their heartbeats are connected); 0 in the test, where only what "
                         "the channels hold is checked")
    ap.add_argument("--fabric", choices=["shm", "tcp", "verbs"],
                    help="RDMADEV_FABRIC of every task (default: rdmadev's choice, shm here)")
    ap.add_argument("--one", action="store_true", help="one configuration in this process")
    ap.add_argument("--tasks", type=int, default=2, help="with --one")
    ap.add_argument("--protocol", default="grpc", choices=PROTOCOLS, help="with --one")
    ap.add_argument("--json", help="with --one: write the result here")
    ap.add_argument("--task", nargs=4, metavar=("PROTOCOL", "JOB", "INDEX", "SPEC"),
                    help=argparse.SUPPRESS)  # serve one task (the launcher's command)
    args = ap.parse_args(argv)
    if min(args.sizes + [args.tasks]) < 2 or args.rounds < 2 or args.check_steps < 1 \
            or args.fresh < 0:
        ap.error("sizes and --tasks need >= 2 tasks (1 ps + 1 worker); --rounds >= 2, "
                 "--check_steps >= 1, --fresh >= 0")
    return args


# ------------------------------------------------------------------------- a task, from /proc

def serve_task(protocol, job, index, spec_json):
    """A task as a user's launcher starts it: tf.distribute.Server with the protocol."""
    import tensorflow as tf
    server = tf.distribute.Server(tf.train.ClusterSpec(json.loads(spec_json)), job_name=job,
                                  task_index=int(index), protocol=protocol, start=True)
    print("READY", server.target, flush=True)
    server.join()


def probe(pid):
    """What process `pid` holds now, read from /proc the same way for every protocol.

    Returns:
        {"threads", "thread_names" (comm, digits dropped: count), "fds", "sockets",
         "memfds" (its open rdmadev region memfds: one per region it allocated),
         "held_bytes" (their sizes, page-rounded), "maps", "memfd_maps" (mappings of rdmadev
         memfds, its own and peers'), "rss_bytes", "pss_bytes" (its share of pages shared
         with other processes: TF's libraries), "anon_bytes" (its own heap)}.
    """
    base = f"/proc/{pid}"
    names = collections.Counter()
    for tid in os.listdir(f"{base}/task"):
        try:
            with open(f"{base}/task/{tid}/comm") as f:
                names[re.sub(r"\d+", "#", f.read().strip())] += 1
        except OSError:  # the thread ended meanwhile
            pass
    fds = sockets = memfds = held = 0
    kinds = collections.Counter()
    for fd in os.listdir(f"{base}/fd"):
        path = f"{base}/fd/{fd}"
        try:
            link = os.readlink(path)
            fds += 1
            kinds[fd_kind(link)] += 1
            if link.startswith("socket:"):
                sockets += 1
            elif link.startswith("/memfd:rdmadev:"):
                memfds += 1
                held += os.stat(path).st_size
        except OSError:  # closed meanwhile
            pass
    with open(f"{base}/maps") as f:
        maps = f.read().splitlines()
    with open(f"{base}/smaps_rollup") as f:
        kb = {l.split(":")[0]: int(l.split()[1]) * 1024 for l in f if l.endswith("kB\n")}
    return {"threads": sum(names.values()), "thread_names": dict(sorted(names.items())),
            "fds": fds, "fd_kinds": dict(sorted(kinds.items())), "sockets": sockets,
            "memfds": memfds, "held_bytes": held,
            "maps": len(maps), "memfd_maps": sum("/memfd:rdmadev:" in l for l in maps),
            "rss_bytes": kb["Rss"], "pss_bytes": kb["Pss"], "anon_bytes": kb["Anonymous"]}


def fd_kind(link):
    """What a descriptor is, from its /proc link: "socket", "pipe", "memfd:rdmadev:credit"
    (a sending pair's credit region, rdmadev/cluster/channels.py attach_senders),
    "memfd:rdmadev:ring" (a receiving pair's region, open_pair), another "memfd",
    "anon_inode:[pidfd]" (and the like), or "file"."""
    link = link.removesuffix(" (deleted)")
    if link.startswith(("socket:", "pipe:")):
        return link.split(":")[0]
    if link.startswith("/memfd:rdmadev:"):
        return "memfd:rdmadev:" + ("credit" if "/credit<-" in link else "ring")
    if link.startswith("/memfd:"):
        return "memfd"
    return link if link.startswith("anon_inode:") else "file"


def task_launcher(protocol):
    def launch(job, index, spec_json):
        return [sys.executable, os.path.abspath(__file__), "--task", protocol, job, str(index),
                spec_json]
    return launch


# ------------------------------------------------------------------------- one configuration

def make_step(tf, strategy, w):
    """Each worker reads `w` from the ps, computes a loss from it, and adds an update of w's
    size computed from what it read (1.0 wherever finite, so any order of updates adds up
    exactly): one tensor ps -> worker, one worker -> ps."""
    n = int(w.shape[0])

    @tf.function
    def step():
        def replica():
            v = w.read_value()
            x = tf.range(n, dtype=tf.float32) / n
            loss = tf.reduce_sum(tf.sin(v + x) * x)
            w.assign_add(tf.cast(tf.math.is_finite(v), tf.float32))
            return loss
        return strategy.run(replica)
    return step


class PeakThreads:
    """The most threads each process had while the block ran, sampled every PEAK_SAMPLE_S on
    a thread of its own (transient threads: rdmadev's event loop runs blocking setup work
    on threads it ends after 5 s idle). ``peaks``: {task: threads}."""

    def __init__(self, pids):
        import threading
        self.pids, self.peaks = pids, {t: 0 for t in pids}
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True, name="scale-peak-threads")

    def _run(self):
        while True:
            for task, pid in self.pids.items():
                try:
                    self.peaks[task] = max(self.peaks[task], len(os.listdir(f"/proc/{pid}/task")))
                except OSError:
                    pass
            if self.stop.wait(PEAK_SAMPLE_S):
                return

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.stop.set()
        self.thread.join()
        return False


def run_round(coordinator, step, steps, timings=None):
    """Schedules `steps` steps and joins; returns (seconds, [RemoteValue]). `timings`: its
    "trace_s" is set to the first schedule call's seconds (where the coordinator traces)."""
    t0 = time.perf_counter()
    out = [coordinator.schedule(step)]
    if timings is not None:
        timings["trace_s"] = time.perf_counter() - t0
    out += [coordinator.schedule(step) for _ in range(steps - 1)]
    coordinator.join()
    return time.perf_counter() - t0, out


def settle(protocol, spec, wait_s):
    """Waits until what a task holds per peer is all there before it is probed: `wait_s`
    (--settle_s, SETTLE_S by default) on either protocol, then on rdmadev until every task pings each of its peers on all LANES
    (a task starts a peer's heartbeats at its watch's next look, up to 2.5 s after the
    peer's first channel), at most SETTLE_MAX_S. Returns whether it did settle."""
    time.sleep(wait_s)
    if protocol == "grpc":
        return True
    import rdmadev
    from rdmadev.cluster.liveness import LANES
    deadline = time.monotonic() + SETTLE_MAX_S
    while True:
        counters = rdmadev.counters(spec)
        if all(isinstance(c, dict) and c["control_connections"]["heartbeats"]
               >= LANES * len(c["peers"]) for c in counters.values()):
            return True
        if time.monotonic() > deadline:
            return False
        time.sleep(0.5)


def rdmadev_view(spec):
    """Counters and reports of every task of a grpc+rdmadev cluster (its control services)."""
    import rdmadev
    counters = rdmadev.counters(spec)
    keep = ("regions", "registered_bytes", "channels", "transfers", "fds", "memfd_maps",
            "py_threads", "thread_names", "control_connections", "peers")
    view = {t: ({k: c[k] for k in keep if k in c} if isinstance(c, dict) else {"error": c})
            for t, c in counters.items()}
    for task, reps in rdmadev.task_reports(spec).items():
        swapped = [s for r in reps for s in r.swapped]
        kept = [k for r in reps for k in r.kept]
        view.setdefault(task, {})["report"] = {
            "instances": len(reps), "swapped": len(swapped),
            "swapped_bytes": sum(s[3] or 0 for s in swapped),
            "fabrics": sorted({s[4] for s in swapped}),
            "kept": len(kept), "kept_reasons": dict(collections.Counter(k[2] for k in kept)),
            "errors": [r.error for r in reps if r.error]}
    return view


def run_one(args):
    """One (size, protocol): its cluster, its rounds, its probes. Returns the result dict."""
    os.environ.setdefault("RDMADEV_SECRET", secrets.token_hex(16))
    from rdmadev.testing import launch
    from rdmadev.tf.startup import import_tensorflow
    tf = import_tensorflow()  # without TF's start-up lines

    workers = args.tasks - 1
    env = {"RDMADEV_SECRET": os.environ["RDMADEV_SECRET"]}
    if args.protocol == "grpc":
        env["RDMADEV_PLUGIN"] = "0"  # plain TF: not even rdmadev's inert protocol loader
    if args.fabric:
        env["RDMADEV_FABRIC"] = os.environ["RDMADEV_FABRIC"] = args.fabric
    result = {"tasks": args.tasks, "workers": workers, "protocol": args.protocol,
              "var_bytes": 4 * VAR_ELEMENTS, "commit": code_version(), "fabric": args.fabric}
    t0, result["mem_available_before"] = time.perf_counter(), mem_available()
    with launch.Cluster(num_ps=1, num_workers=workers, env=env,
                        launcher=task_launcher(args.protocol),
                        ready_timeout=max(launch.READY_TIMEOUT_S, READY_S_PER_TASK * args.tasks)) as cluster:
        result["start_s"] = time.perf_counter() - t0
        pids = {f"{job}:{i}": cluster.pid(job, i) for job, i, _ in cluster.tasks()}
        result["idle"] = {t: probe(p) for t, p in pids.items()}
        t1 = time.perf_counter()
        strategy, coordinator = launch.pss_coordinator(cluster.spec, rpc_layer=args.protocol)
        with strategy.scope():
            w = tf.Variable(tf.zeros([VAR_ELEMENTS]), name="w")
        result["connect_s"] = time.perf_counter() - t1
        step = make_step(tf, strategy, w)

        # schedule traces the step in this process (the first call, once): timed apart
        with PeakThreads(pids) as peak:
            result["first_s"], first = run_round(coordinator, step, workers, result)
        result["first_peak_threads"] = peak.peaks
        traces = step.experimental_get_tracing_count()
        result["after_first"] = {t: probe(p) for t, p in pids.items()}
        rounds, done = [], workers
        t_rounds = time.perf_counter()
        for _ in range(args.rounds):
            rounds.append(run_round(coordinator, step, workers)[0])
            done += workers
            if len(rounds) >= 2 and time.perf_counter() - t_rounds > args.round_budget_s:
                break
        result["rounds_s"] = rounds
        total = w.numpy()
        result["exact_sum"] = bool((total == float(done)).all())  # no update lost or doubled
        result["steps"] = done

        w.assign(tf.zeros([VAR_ELEMENTS]))  # the check: steps one at a time from zero
        losses = []
        for _ in range(args.check_steps):
            losses += [r.fetch() for r in run_round(coordinator, step, 1)[1]]
        result["check"] = {"losses": [float(l) for l in losses],
                           "bits": b"".join(tf.constant(l).numpy().tobytes() for l in losses).hex(),
                           "final_bits": w.numpy().tobytes().hex()}
        result["retraced"] = step.experimental_get_tracing_count() - traces
        result["settled"] = settle(args.protocol, cluster.spec, args.settle_s)
        result["after"] = {t: probe(p) for t, p in pids.items()}
        result["mem_available_after"] = mem_available()
        if args.protocol != "grpc":
            result["rdmadev"] = rdmadev_view(cluster.spec)
        fresh = []  # new steps (new functions) on the same servers, after the probes
        for _ in range(args.fresh):
            fresh.append(make_step(tf, strategy, w))
            timings = {}
            result.setdefault("fresh_first_s", []).append(
                run_round(coordinator, fresh[-1], workers, timings)[0])
            result.setdefault("fresh_trace_s", []).append(timings["trace_s"])
        del first, step, fresh, coordinator, strategy, w
        launch.release_remote_functions(cluster.spec)
    result["wall_s"] = time.perf_counter() - t0
    return result


# ------------------------------------------------------------------------- the matrix

def mem_available():
    with open("/proc/meminfo") as f:
        return next(int(l.split()[1]) * 1024 for l in f if l.startswith("MemAvailable:"))


def run_config(args, tasks, protocol):
    """One configuration in its own process; its result, or {"error": ...}."""
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "r.json")
        cmd = [sys.executable, os.path.abspath(__file__), "--one", "--tasks", str(tasks),
               "--protocol", protocol, "--json", out, "--rounds", str(args.rounds),
               "--round_budget_s", str(args.round_budget_s), "--check_steps", str(args.check_steps),
               "--fresh", str(args.fresh), "--settle_s", str(args.settle_s)]
        cmd += ["--fabric", args.fabric] if args.fabric else []
        p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        try:
            _, stderr = p.communicate(timeout=CONFIG_TIMEOUT_S + READY_S_PER_TASK * tasks)
        except BaseException:
            p.terminate()  # SIGTERM: the child stops its cluster on the way out
            try:
                p.communicate(timeout=60)
            except subprocess.TimeoutExpired:
                p.kill()
                p.communicate()
            return {"tasks": tasks, "protocol": protocol, "error": "timed out"}
        if p.returncode != 0 or not os.path.exists(out):
            lines = [l for l in stderr.splitlines() if l.strip()]
            fatal = [i for i, l in enumerate(lines) if l.startswith("Fatal Python error")]
            tail = lines[fatal[0]:fatal[0] + 60] if fatal else lines[-6:]  # a crash: its stacks
            return {"tasks": tasks, "protocol": protocol,
                    "error": f"exit {p.returncode}: " + " | ".join(tail)[-(6000 if fatal else 1200):]}
        with open(out) as f:
            return json.load(f)


def _mean(xs):
    return sum(xs) / len(xs) if xs else float("nan")


def summarize(r):
    """The figures of one configuration: ps and mean worker after the rounds."""
    after = r["after"]
    ps, ws = after["ps:0"], [v for k, v in after.items() if k.startswith("worker:")]
    rounds = r["rounds_s"]
    fresh = r.get("fresh_first_s") or [float("nan")]
    s = {"tasks": r["tasks"], "protocol": r["protocol"], "first_s": r["first_s"],
         "new_first_s": statistics.median(fresh),
         "step_s": statistics.median(rounds),
         "spread_pct": 100 * (max(rounds) - min(rounds)) / statistics.median(rounds),
         "rounds": len(rounds), "start_s": r["start_s"]}
    for key in ("threads", "fds", "sockets", "memfd_maps", "memfds", "held_bytes", "rss_bytes",
                "pss_bytes", "anon_bytes"):
        s[f"ps_{key}"] = ps[key]
        s[f"worker_{key}"] = _mean([w[key] for w in ws])
    peaks = r.get("first_peak_threads", {})
    s["ps_peak_threads"] = peaks.get("ps:0", 0)
    s["worker_peak_threads"] = _mean([v for k, v in peaks.items() if k.startswith("worker:")])
    rd = r.get("rdmadev", {})
    psr = rd.get("/job:ps/replica:0/task:0", {})
    wr = [v for k, v in rd.items() if "/job:worker/" in k]
    s["ps_registered_bytes"] = psr.get("registered_bytes", 0)
    s["worker_registered_bytes"] = _mean([v.get("registered_bytes", 0) for v in wr]) if wr else 0
    s["ps_regions"] = psr.get("regions", 0)
    s["ps_py_threads"] = psr.get("py_threads", 0)
    s["ps_control_connections"] = psr.get("control_connections", {})
    s["worker_regions"] = _mean([v.get("regions", 0) for v in wr]) if wr else 0
    return s


def slope(points):
    """Least-squares slope of [(x, y)]; None with fewer than 2 distinct x."""
    xs, ys = [x for x, _ in points], [y for _, y in points]
    if len(set(xs)) < 2:
        return None
    return statistics.linear_regression(xs, ys).slope


def checks(results):
    """Per size: bitwise equal between protocols, every update exact, and on rdmadev every
    worker's cross-task tensors swapped (none kept but those to the coordinator)."""
    out = {}
    by = {(r["tasks"], r["protocol"]): r for r in results if "error" not in r}
    for n in sorted({t for t, _ in by}):
        g, d = by.get((n, "grpc")), by.get((n, "grpc+rdmadev"))
        if not (g and d):
            continue
        reps = {t: v.get("report", {}) for t, v in d["rdmadev"].items() if "/job:worker/" in t}
        out[n] = {
            "bitwise_equal": g["check"]["bits"] == d["check"]["bits"]
                             and g["check"]["final_bits"] == d["check"]["final_bits"],
            "exact_sums": g["exact_sum"] and d["exact_sum"],
            "workers_swapped": sum(1 for v in reps.values() if v.get("swapped")),
            "workers": n - 1,
            "kept_cross_task": sum(c for v in reps.values()
                                   for why, c in v.get("kept_reasons", {}).items()
                                   if why != "client_task"),
            "swapped": sum(v.get("swapped", 0) for v in reps.values()),
            "fabrics": sorted({f for v in reps.values() for f in v.get("fabrics", [])}),
            "retraced": g["retraced"] + d["retraced"]}
    return out


def growth_by_name(results, protocol, role="ps"):
    """Thread names whose count on the ps (or first worker) changes from the smallest to the
    largest size measured: {name: (at smallest, at largest)}; on rdmadev also the names of
    the task's Python threads (its counters' thread_names), as "python: <name>"."""
    runs = sorted((r for r in results if r["protocol"] == protocol and "error" not in r),
                  key=lambda r: r["tasks"])
    if len(runs) < 2:
        return {}
    key = "ps:0" if role == "ps" else "worker:0"
    a, b = runs[0]["after"][key]["thread_names"], runs[-1]["after"][key]["thread_names"]
    out = {k: (a.get(k, 0), b.get(k, 0)) for k in sorted(set(a) | set(b)) if a.get(k, 0) != b.get(k, 0)}
    if protocol != "grpc":  # /proc names Python's threads "python": rdmadev names its own
        task = "/job:ps/replica:0/task:0" if role == "ps" else "/job:worker/replica:0/task:0"
        a, b = (r["rdmadev"][task].get("thread_names", {}) for r in (runs[0], runs[-1]))
        out.update({f"python: {k}": (a.get(k, 0), b.get(k, 0)) for k in sorted(set(a) | set(b))
                    if a.get(k, 0) != b.get(k, 0)})
    return out


def table(summaries):
    """Markdown table: one row per size and protocol."""
    head = ("| tasks | protocol | first round s | new step's first round s | "
            "steady round s (spread) | ps threads (peak in first round) | "
            "worker threads | ps fds | worker fds | ps memfd maps | worker memfd maps | "
            "ps regions | ps registered / held | worker registered / held | ps / worker heap MB |")
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for s in summaries:
        lines.append(
            f"| {s['tasks']} | {s['protocol']} | {s['first_s']:.2f} | {s['new_first_s']:.2f} | "
            f"{s['step_s']:.3f} "
            f"({s['spread_pct']:.0f}%) | {s['ps_threads']} ({s['ps_peak_threads']}) | "
            f"{s['worker_threads']:.1f} | "
            f"{s['ps_fds']} | {s['worker_fds']:.1f} | {s['ps_memfd_maps']} | "
            f"{s['worker_memfd_maps']:.1f} | {s['ps_regions']} | "
            f"{s['ps_registered_bytes'] / 1024:.1f} / {s['ps_held_bytes'] / 1024:.0f} KiB | "
            f"{s['worker_registered_bytes'] / 1024:.1f} / {s['worker_held_bytes'] / 1024:.0f} KiB | "
            f"{s['ps_anon_bytes'] / 1e6:.0f} / {s['worker_anon_bytes'] / 1e6:.0f} |")
    return "\n".join(lines)


#: (metric, role) pairs whose slope per added worker is reported.
SLOPES = [(m, role) for role in ("ps", "worker")
          for m in ("threads", "fds", "sockets", "memfd_maps", "memfds", "registered_bytes",
                    "held_bytes", "anon_bytes", "peak_threads")] + [("first_s", None), ("new_first_s", None),
                                                     ("step_s", None)]


def slopes(summaries):
    """{protocol: {metric: slope per added worker}} and rdmadev's beyond gRPC's."""
    out = {}
    for proto in PROTOCOLS:
        rows = [s for s in summaries if s["protocol"] == proto]
        out[proto] = {(f"{role}_{m}" if role else m):
                      slope([(s["tasks"] - 1, s[f"{role}_{m}" if role else m]) for s in rows])
                      for m, role in SLOPES}
    out["beyond_grpc"] = {k: (v - out["grpc"][k] if v is not None and out["grpc"][k] is not None
                              else None) for k, v in out["grpc+rdmadev"].items()}
    return out


def chart(summaries, path):
    """Threads and fds per task vs tasks (ps and mean worker, both protocols); first step."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.2))
    style = {"grpc": ("tab:gray", "gRPC"), "grpc+rdmadev": ("tab:blue", "grpc+rdmadev")}
    for ax, metric, label in ((axes[0], "threads", "threads per task"),
                              (axes[1], "fds", "file descriptors per task")):
        for proto, (color, name) in style.items():
            rows = sorted((s for s in summaries if s["protocol"] == proto), key=lambda s: s["tasks"])
            xs = [s["tasks"] for s in rows]
            ax.plot(xs, [s[f"ps_{metric}"] for s in rows], "o-", color=color, label=f"{name}: ps")
            ax.plot(xs, [s[f"worker_{metric}"] for s in rows], "s--", color=color,
                    label=f"{name}: worker (mean)")
            if metric == "threads" and proto != "grpc":
                ax.plot(xs, [s["ps_peak_threads"] for s in rows], "^:", color=color,
                        label=f"{name}: ps, most during the first round")
        ax.set_title(label)
        ax.set_ylim(bottom=0)
    for proto, (color, name) in style.items():
        rows = sorted((s for s in summaries if s["protocol"] == proto), key=lambda s: s["tasks"])
        axes[2].plot([s["tasks"] for s in rows], [s["first_s"] for s in rows], "o-", color=color,
                     label=f"{name}: first round")
        axes[2].plot([s["tasks"] for s in rows], [s["new_first_s"] for s in rows], "^:", color=color,
                     label=f"{name}: a new step's first round")
        axes[2].plot([s["tasks"] for s in rows], [s["step_s"] for s in rows], "s--", color=color,
                     label=f"{name}: steady round (median)")
    axes[2].set_title("seconds per round (one step per worker)")
    axes[2].set_yscale("log")
    for ax in axes:
        ax.set_xscale("log", base=2)
        ax.set_xlabel("tasks (1 ps + N-1 workers)")
        ax.set_xticks(sorted({s["tasks"] for s in summaries}))
        ax.get_xaxis().set_major_formatter(matplotlib.ticker.ScalarFormatter())
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.suptitle("rdmadev scale: what a task holds, 1 ps + N-1 workers on 127.0.0.1 "
                 "(benchmarks/scale.py)", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def fits(tasks, task_bytes):
    """(whether `tasks` tasks fit in MemAvailable with the margin, the sentence saying so)."""
    need = tasks * task_bytes + SHARED_BYTES + COORDINATOR_BYTES + MEMORY_MARGIN_BYTES
    have = mem_available()
    return need <= have, (f"{tasks} tasks need ~{need / 1e9:.1f} GB ({task_bytes / 1e9:.2f} GB "
                          f"of heap per task, TF's libraries once, the coordinator and a "
                          f"{MEMORY_MARGIN_BYTES / 1e9:.0f} GB margin); {have / 1e9:.1f} GB available")


def run_matrix(args):
    results, skipped = [], {}
    task_bytes = DEFAULT_TASK_BYTES
    commit = code_version()
    t_all = time.perf_counter()
    for k, n in enumerate(sorted(set(args.sizes))):
        ok, why = fits(n, task_bytes)
        if not ok:
            skipped[n] = why
            print(f"skip {n} tasks: {why}", file=sys.stderr, flush=True)
            continue
        order = PROTOCOLS if k % 2 == 0 else PROTOCOLS[::-1]  # neither always runs first
        for proto in order:
            r = run_config(args, n, proto)
            results.append(r)
            if "error" in r:
                print(f"{n:>2} tasks {proto:<13} FAILED: {r['error']}", file=sys.stderr, flush=True)
                continue
            a = r["after"]
            task_bytes = max(task_bytes, 1.2 * max(v["anon_bytes"] for v in a.values()))
            print(f"{n:>2} tasks {proto:<13} start {r['start_s']:5.1f} s  first round "
                  f"{r['first_s']:6.2f} s  steady {statistics.median(r['rounds_s']):6.3f} s  "
                  f"ps threads {a['ps:0']['threads']:4d} fds {a['ps:0']['fds']:4d}  "
                  f"({time.perf_counter() - t_all:5.0f} s in)", file=sys.stderr, flush=True)
    summaries = [summarize(r) for r in results if "error" not in r]
    report = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
              "commit": commit, "commit_at_end": code_version(), "config": {k: getattr(args, k) for k in
                                               ("sizes", "rounds", "round_budget_s", "check_steps",
                                                "fresh", "fabric", "settle_s")},
              "var_bytes": 4 * VAR_ELEMENTS, "cpus": os.cpu_count(),
              "summaries": summaries, "slopes": slopes(summaries), "checks": checks(results),
              "ratios": ratios(summaries), "skipped": skipped,
              "thread_growth": {p: {role: growth_by_name(results, p, role) for role in ("ps", "worker")}
                                for p in PROTOCOLS},
              "errors": [r for r in results if "error" in r], "runs": results,
              "wall_s": time.perf_counter() - t_all}
    os.makedirs(os.path.dirname(os.path.abspath(args.prefix)), exist_ok=True)
    with open(args.prefix + ".json", "w") as f:
        json.dump(report, f, indent=1)
    if summaries and not args.no_chart:
        chart(summaries, args.prefix + ".png")
    print_report(report)
    return 0 if not report["errors"] else 1


def ratios(summaries):
    """{tasks: {"first": rdmadev / gRPC, "step": ...}} where both ran."""
    by = {(s["tasks"], s["protocol"]): s for s in summaries}
    return {n: {"first": by[(n, "grpc+rdmadev")]["first_s"] / by[(n, "grpc")]["first_s"],
                "new_first": by[(n, "grpc+rdmadev")]["new_first_s"] / by[(n, "grpc")]["new_first_s"],
                "step": by[(n, "grpc+rdmadev")]["step_s"] / by[(n, "grpc")]["step_s"]}
            for n, p in by if p == "grpc" and (n, "grpc+rdmadev") in by}


def code_version():
    """The commit of the rdmadev that the tasks import (its source tree: an editable install
    runs that tree's files, whatever this script's checkout), and whether its code differs
    from that commit: "<short hash>[+dirty]", or "" outside git."""
    import importlib.util
    spec = importlib.util.find_spec("rdmadev")
    tree = os.path.dirname(os.path.dirname(spec.origin)) if spec and spec.origin else HERE

    def git(*a):
        return subprocess.run(["git", "-C", tree, *a], capture_output=True, text=True,
                              timeout=10).stdout.strip()
    try:
        head = git("rev-parse", "--short", "HEAD")
        dirty = git("status", "--porcelain", "--", "rdmadev", "_native", "graph_pass")
    except (OSError, subprocess.SubprocessError):
        return ""
    return head + ("+dirty" if dirty else "")


def print_report(report):
    print(table(report["summaries"]))
    print()
    for n, c in report["checks"].items():
        rt = report["ratios"].get(n, {})
        print(f"{n} tasks: rdmadev/gRPC first round {rt.get('first', float('nan')):.2f}x, a new "
              f"step's first round {rt.get('new_first', float('nan')):.2f}x, steady "
              f"{rt.get('step', float('nan')):.2f}x; bitwise equal {c['bitwise_equal']}, exact "
              f"updates {c['exact_sums']}, {c['workers_swapped']}/{c['workers']} workers swapped "
              f"{c['swapped']} transfers ({','.join(c['fabrics'])}), {c['kept_cross_task']} "
              f"cross-task kept on gRPC, retraced {c['retraced']}")
    ran = sorted({r.get("commit", "") for r in report["runs"]})
    if len(ran) > 1 or report["commit"] != report["commit_at_end"]:
        print(f"the rdmadev measured changed during the run: {report['commit']} at its start, "
              f"{report['commit_at_end']} at its end; configurations ran {', '.join(ran)}")
    sl = report["slopes"]
    for k in ("ps_threads", "ps_peak_threads", "ps_fds", "ps_memfd_maps", "ps_registered_bytes", "worker_threads",
              "worker_fds", "first_s", "new_first_s"):
        vals = [sl[p][k] for p in (*PROTOCOLS, "beyond_grpc")]
        if None not in vals:
            print(f"per added worker, {k}: gRPC {vals[0]:+.2f}, grpc+rdmadev {vals[1]:+.2f}, "
                  f"beyond gRPC {vals[2]:+.2f}")
    for proto, roles in report["thread_growth"].items():
        for role, names in roles.items():
            if names:
                print(f"{proto} {role} threads by name (smallest -> largest size): "
                      + ", ".join(f"{k} {a}->{b}" for k, (a, b) in names.items()))
    for n, why in report["skipped"].items():
        print(f"skipped {n} tasks: {why}")
    for e in report["errors"]:
        print(f"FAILED {e['tasks']} tasks {e['protocol']}: {e['error']}")


def main(argv=None):
    args = parse_args(argv)
    if args.task:
        serve_task(*args.task)
        return 0
    # SIGTERM (a timeout, a CI runner) unwinds like Ctrl-C: the cluster goes with it
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    if args.replot:
        with open(args.prefix + ".json") as f:
            chart(json.load(f)["summaries"], args.prefix + ".png")
        return 0
    if args.one:
        faulthandler.enable(all_threads=True)  # a crash says where, in run_config's error
        r = run_one(args)
        if args.json:
            with open(args.json, "w") as f:
                json.dump(r, f, indent=1)
        else:
            print(json.dumps(r, indent=1))
        return 0
    return run_matrix(args)


if __name__ == "__main__":
    sys.exit(main())
