"""What a task costs as the cluster grows: 1 ps + N-1 workers for N = 2, 4, 8, 16, 32 on
127.0.0.1, each size run twice in the same run, on plain TF servers (protocol "grpc") and on
"grpc+rdmadev", and measured the same way from /proc.

    python benchmarks/scale.py                          # 2..32 tasks; writes results/scale.{json,png}
    python benchmarks/scale.py --sizes 2 4 --rounds 3   # a quick look
    python benchmarks/scale.py --repeats 3              # three clusters per size: median first round
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
               trace is timed apart (trace_s). A cluster has one first round, so
               `--repeats` starts each configuration that many times (the protocols in
               turn) and the report takes the median, with its spread; also the CPU seconds
               that every task and the coordinator used in it (/proc/<pid>/stat): with all
               tasks on 2 cores, the first round is mostly CPU bound.
  new step     the same for `--fresh` new functions on the same servers, after the probes
               (endpoints and control connections exist by then): median, and its CPU.
  steady round the first round's step again, `--rounds` times (bounded by `--round_budget_s`):
               median seconds per round and spread ((max - min) / median).
  per task     from /proc/<pid> of each task, after the rounds and `--settle_s` (on rdmadev
               also until its heartbeats reach every peer): threads (and their names; also
               the most seen during the first round, sampled every 20 ms), descriptors by kind,
               mappings of rdmadev memfds, RSS, PSS and heap; from the task's open rdmadev
               memfds the chunks its regions are placed in (= registrations on verbs: one per
               chunk, _native/core/arena.h) and their bytes (held); on rdmadev also its counters
               (regions and registered bytes in use, control connections, Python thread names)
               and reports.
  check        from a reset variable, `--check_steps` steps one at a time: the losses and the
               final variable, compared bitwise between the protocols; on rdmadev every
               worker's reports (every cross-task tensor between ps and workers swapped).

Before a size, the memory it needs (the largest task heap measured so far times its tasks, TF's
libraries once, the coordinator and a margin) is checked against MemAvailable: a size that does
not fit is skipped and says so. Every configuration records the commit of the rdmadev it ran
(an editable install runs its source tree, which may move during a run). Output: one line per
configuration on stderr, a table on stdout, the JSON and a chart.

This file runs configurations and the matrix; scale_tasks.py starts a task and reads it from
/proc, scale_report.py turns the results into figures, the table and the chart.
"""
import argparse
import collections
import faulthandler
import json
import os
import secrets
import signal
import statistics
import subprocess
import sys
import tempfile
import time

from scale_report import PROTOCOLS, checks, chart, growth_by_name, print_report, ratios, slopes, summarize
from scale_tasks import PeakThreads, cpu_seconds, cpu_used, probe, serve_task, task_launcher

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
HERE = os.path.dirname(os.path.abspath(__file__))
RESULTS = os.path.join(HERE, "results")
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
    ap.add_argument("--repeats", type=int, default=1,
                    help="clusters per size and protocol (a first round happens once per "
                         "cluster): the report takes the median of their first rounds")
    ap.add_argument("--prefix", default=os.path.join(RESULTS, "scale"),
                    help="writes <prefix>.json and <prefix>.png")
    ap.add_argument("--no_chart", action="store_true")
    ap.add_argument("--replot", action="store_true",
                    help="only draw <prefix>.png again from <prefix>.json")
    ap.add_argument("--settle_s", type=float, default=SETTLE_S,
                    help="seconds to wait before probing the tasks (then, on rdmadev, until "
                         "every peer answers their heartbeats); 0 in the test, where only what "
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


# ------------------------------------------------------------------------- one configuration

def make_step(tf, strategy, w, returns_loss=False):
    """Each worker reads `w` from the ps, computes a loss from it, and adds an update of w's
    size computed from what it read (1.0 wherever finite, so any order of updates adds up
    exactly): one tensor ps -> worker, one worker -> ps. The loss is returned only with
    `returns_loss`, by the check's steps, which run one at a time: ClusterCoordinator copies a
    step's output to the coordinator as soon as the step is done, and in TF 2.21 that copy, in
    rounds of three workers' steps, now and then fails with "Unable to parse request"
    from the worker (RunComponentFunction), or crashes the coordinator in TF's pybind11 error
    path (PyErr_Occurred without the GIL; a core dump of 2026-12-04), on plain gRPC as on
    grpc+rdmadev."""
    n = int(w.shape[0])

    @tf.function
    def step():
        def replica():
            v = w.read_value()
            x = tf.range(n, dtype=tf.float32) / n
            loss = tf.reduce_sum(tf.sin(v + x) * x)
            w.assign_add(tf.cast(tf.math.is_finite(v), tf.float32))
            return loss if returns_loss else None
        return strategy.run(replica)
    return step


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
    (--settle_s, SETTLE_S by default) on either protocol, then on rdmadev until every task
    hears each of its peers' heartbeats by datagram (a task starts a peer's heartbeats at its
    watch's next look, up to 1.25 s after the peer's first channel), at most SETTLE_MAX_S. Returns whether it did settle."""
    time.sleep(wait_s)
    if protocol == "grpc":
        return True
    import rdmadev
    deadline = time.monotonic() + SETTLE_MAX_S
    while True:
        counters = rdmadev.counters(spec)
        if all(isinstance(c, dict) and c["heard_by_datagram"] >= len(c["peers"])
               for c in counters.values()):
            return True
        if time.monotonic() > deadline:
            return False
        time.sleep(0.5)


def rdmadev_view(spec):
    """Counters and reports of every task of a grpc+rdmadev cluster (its control services)."""
    import rdmadev
    counters = rdmadev.counters(spec)
    keep = ("regions", "registered_bytes", "channels", "transfers", "fds", "memfd_maps",
            "py_threads", "thread_names", "control_connections", "heard_by_datagram", "peers")
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
        cpu = cpu_seconds(pids)
        with PeakThreads(pids) as peak:
            result["first_s"], first = run_round(coordinator, step, workers, result)
        result["first_cpu_s"] = cpu_used(cpu, cpu_seconds(pids))
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
        check = make_step(tf, strategy, w, returns_loss=True)
        losses = []
        for _ in range(args.check_steps):
            losses += [r.fetch() for r in run_round(coordinator, check, 1)[1]]
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
            timings, cpu = {}, cpu_seconds(pids)
            result.setdefault("fresh_first_s", []).append(
                run_round(coordinator, fresh[-1], workers, timings)[0])
            result.setdefault("fresh_cpu_s", []).append(cpu_used(cpu, cpu_seconds(pids)))
            result.setdefault("fresh_trace_s", []).append(timings["trace_s"])
        del first, step, check, fresh, coordinator, strategy, w
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
        for repeat in range(args.repeats):
            order = PROTOCOLS if (k + repeat) % 2 == 0 else PROTOCOLS[::-1]  # neither always first
            for proto in order:
                r = run_config(args, n, proto)
                results.append(r)
                if "error" in r:
                    print(f"{n:>2} tasks {proto:<13} FAILED: {r['error']}", file=sys.stderr,
                          flush=True)
                    continue
                a = r["after"]
                task_bytes = max(task_bytes, 1.2 * max(v["anon_bytes"] for v in a.values()))
                print(f"{n:>2} tasks {proto:<13} start {r['start_s']:5.1f} s  first round "
                      f"{r['first_s']:6.2f} s  steady {statistics.median(r['rounds_s']):6.3f} s  "
                      f"ps threads {a['ps:0']['threads']:4d} fds {a['ps:0']['fds']:4d}  "
                      f"({time.perf_counter() - t_all:5.0f} s in)", file=sys.stderr, flush=True)
    ok = [r for r in results if "error" not in r]
    summaries = [summarize([r for r in ok if (r["tasks"], r["protocol"]) == config])
                 for config in sorted({(r["tasks"], r["protocol"]) for r in ok},
                                      key=lambda c: (c[0], PROTOCOLS.index(c[1])))]
    report = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
              "commit": commit, "commit_at_end": code_version(), "config": {k: getattr(args, k) for k in
                                               ("sizes", "repeats", "rounds", "round_budget_s",
                                                "check_steps", "fresh", "fabric", "settle_s")},
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
