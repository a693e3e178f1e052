"""Soak: the README's main job (examples/train_pss.py's model, dataset and step, through
rdmadev) for many steps, sampling what a leak would grow.

    python benchmarks/soak.py                        # 10,000 steps, a sample every 500
    python benchmarks/soak.py --steps 1500 --every 300 --json soak.json

Every `--every` steps the coordinator joins (a quiet point: no step in flight) and samples,
for each task and for itself: RSS, open fds and threads (/proc), and per task rdmadev's
channels, registered bytes and memfd mappings (rdmadev.counters()). The first WARMUP_SAMPLES
samples are warm-up: the first step traces and sets up channels, the heartbeats open their
connections within RDMADEV_LIVENESS_S, and TF's allocator and thread pools grow to their
working size. Over the samples after it the table gives first, last and the least-squares
slope per 1,000 steps, and the verdict:

- fds, channels, registered bytes, memfd maps: flat means constant (a leak of any of these
  is whole units per step or per setup). A task's fds are judged without its control
  connections (`control_fds`, from its counters), which grow to the most calls once in flight
  at once between two tasks and so with the machine's load, not with steps: flat means no
  more than CONTROL_SLACK above the first sample after warm-up;
- threads: flat means no more than THREAD_SLACK above the first sample after warm-up (TF's
  gRPC and executor pools start threads on demand). A slope is no test of these: a pool that
  grows by two between the last two samples of a short soak has a slope of 5 per 1,000 steps
  and is still bounded, while a thread leaked every few hundred steps passes the slack within
  the soak;
- RSS: flat means a slope below RSS_SLOPE_BOUND per 1,000 steps, or a fitted growth over the
  judged samples within RSS_JITTER. One step moves 3.2 MB of weights each way; keeping even
  1 KiB of each step would grow 1 MiB per 1,000 steps. Between quiet points the allocator
  moves RSS by a few MiB either way (a CI run saw a ps at 710, 706, 708, 710 MiB), so a short
  soak cannot resolve the slope bound: over 10,000 steps (9,000 judged) a leak of 1 MiB per
  1,000 steps shows 9 MiB and is called, over 1,600 steps (800 judged) only ~10 MiB per 1,000.

Exits 1 naming every quantity that is not flat. The cluster is always stopped.
"""
import argparse
import json
import os
import secrets
import sys
import time

import numpy as np

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "examples"))
import train_pss  # noqa: E402  (the main job's model, dataset and step: one definition)

#: Samples that are warm-up (see the module docstring).
WARMUP_SAMPLES = 2
#: Bytes per 1,000 steps of RSS growth still called flat (see the module docstring).
RSS_SLOPE_BOUND = 1 << 20
#: RSS growth over the judged samples that is allocator noise, not a leak (see the docstring).
RSS_JITTER = 8 << 20
#: Threads above the first sample after warm-up still called flat (on-demand pools).
THREAD_SLACK = 4
#: A task's control connections above the first sample after warm-up still called flat: a
#: link to a peer task that came after it (links.py), a tool's connection.
CONTROL_SLACK = 4
#: rdmadev.counters() fields sampled per task.
COUNTED = ("channels", "registered_bytes", "memfd_maps")
#: What must not change at all after warm-up (a task's fds: those outside control connections).
CONSTANT = ("fds", "channels", "registered_bytes", "memfd_maps")
#: Judged with a slack above the first sample after warm-up.
SLACK = {"threads": THREAD_SLACK, "control_fds": CONTROL_SLACK}


def proc_sample(pid):
    """RSS bytes, open fds and threads of process `pid`."""
    status = {}
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            key, _, value = line.partition(":")
            status[key] = value.split()
    return {"rss": int(status["VmRSS"][0]) * 1024, "threads": int(status["Threads"][0]),
            "fds": len(os.listdir(f"/proc/{pid}/fd"))}


def sample(rdmadev, pids, steps):
    counters = rdmadev.counters()
    out = {"steps": steps, "processes": {}}
    for name, pid in pids.items():
        s = proc_sample(pid)
        if name in counters:
            s.update({k: counters[name][k] for k in COUNTED})
            s["control_fds"] = sum(counters[name]["control_connections"].values())
            s["fds"] -= s["control_fds"]
        out["processes"][name] = s
    return out


def verdicts(samples):
    """{process: {quantity: {"first", "last", "slope_per_1000", "flat"}}} over the samples
    after warm-up."""
    kept = samples[WARMUP_SAMPLES:]
    steps = np.array([s["steps"] for s in kept], dtype=float)
    result = {}
    for name in kept[0]["processes"]:
        result[name] = {}
        for q in kept[0]["processes"][name]:
            values = np.array([s["processes"][name][q] for s in kept], dtype=float)
            slope = float(np.polyfit(steps, values, 1)[0] * 1000) if len(kept) > 1 else 0.0
            if q in CONSTANT:
                flat = bool((values == values[0]).all())
            elif q in SLACK:
                flat = bool(values.max() <= values[0] + SLACK[q])
            else:  # rss
                growth = slope * (steps[-1] - steps[0]) / 1000
                flat = bool(slope < RSS_SLOPE_BOUND or growth <= RSS_JITTER)
            result[name][q] = {"first": int(values[0]), "last": int(values[-1]),
                               "slope_per_1000": slope, "flat": flat}
    return result


def table(result):
    rows = ["| process | quantity | first | last | slope per 1,000 steps | flat |",
            "|---|---|---|---|---|---|"]
    for name, qs in result.items():
        for q, v in qs.items():
            if q in ("rss", "registered_bytes"):
                size = lambda x: f"{x / 2**20:.1f} MiB"  # noqa: E731
                first, last, slope = size(v["first"]), size(v["last"]), size(v["slope_per_1000"])
            else:
                first, last, slope = v["first"], v["last"], f"{v['slope_per_1000']:.2f}"
            rows.append(f"| {name} | {q} | {first} | {last} | {slope} | "
                        f"{'yes' if v['flat'] else 'NO'} |")
    return "\n".join(rows)


def soak(tf, rdmadev, cluster, steps, every, deadline):
    spec = cluster.spec
    full = {**spec, "chief": [f"127.0.0.1:{cluster_free_port()}"]}
    resolver = tf.distribute.cluster_resolver.SimpleClusterResolver(
        tf.train.ClusterSpec(full), task_type="chief", task_id=0, rpc_layer="grpc")
    strategy = tf.distribute.ParameterServerStrategy(resolver)
    coordinator = tf.distribute.coordinator.ClusterCoordinator(strategy)
    _, _, train_step, _ = train_pss.build(tf, strategy)
    iterator = iter(coordinator.create_per_worker_dataset(train_pss.dataset_fn(tf)))
    step = rdmadev.optimize(train_step)
    from graph_pass.devices import task_name
    pids = {task_name(job, i): cluster.pid(job, i)
            for job, addresses in spec.items() for i in range(len(addresses))}
    pids["coordinator"] = os.getpid()

    samples, done, start = [], 0, time.perf_counter()
    while done < steps:
        if time.monotonic() > deadline:
            raise TimeoutError(f"the soak ran out of time after {done} of {steps} steps "
                               "(raise --timeout)")
        for _ in range(min(every, steps - done)):
            coordinator.schedule(step, args=(iterator,))
        coordinator.join()
        done += min(every, steps - done)
        samples.append(sample(rdmadev, pids, done))
        rate = done / (time.perf_counter() - start)
        rss = {n: f"{p['rss'] / 2**20:.0f}" for n, p in samples[-1]["processes"].items()}
        print(f"  {done:6d} steps  {rate:6.1f} steps/s  RSS MiB {rss}", flush=True)
    return samples, done / (time.perf_counter() - start)


def cluster_free_port():
    from rdmadev.testing import launch
    return launch.free_ports(1)[0]


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=10_000)
    ap.add_argument("--every", type=int, default=500, help="steps between samples")
    ap.add_argument("--timeout", type=float, default=3600, help="seconds for the whole soak")
    ap.add_argument("--json", help="write the samples and verdicts here")
    args = ap.parse_args(argv)
    if args.steps < (WARMUP_SAMPLES + 2) * args.every:
        ap.error(f"--steps must allow {WARMUP_SAMPLES} warm-up samples and 2 more "
                 f"(>= {(WARMUP_SAMPLES + 2) * args.every} at --every {args.every})")
    deadline = time.monotonic() + args.timeout
    os.environ.setdefault("RDMADEV_SECRET", secrets.token_hex(16))

    from rdmadev.tf.startup import import_tensorflow
    tf = import_tensorflow()  # without TF's start-up lines
    import rdmadev
    from rdmadev.testing import launch

    print(f"soak: {args.steps} steps of the main job (1 ps + 2 workers on 127.0.0.1), "
          f"a sample every {args.every}", flush=True)
    cluster = launch.Cluster(num_ps=1, num_workers=2,
                             env={"RDMADEV_SECRET": os.environ["RDMADEV_SECRET"]}).start()
    try:
        samples, rate = soak(tf, rdmadev, cluster, args.steps, args.every, deadline)
    finally:
        launch.release_remote_functions(cluster.spec)
        cluster.stop()
    result = verdicts(samples)
    print(f"\n{args.steps} steps at {rate:.1f} steps/s; warm-up: the first {WARMUP_SAMPLES} "
          f"samples ({WARMUP_SAMPLES * args.every} steps)\n")
    print(table(result))
    grown = [f"{n} {q}" for n, qs in result.items() for q, v in qs.items() if not v["flat"]]
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"steps": args.steps, "every": args.every, "rate": rate,
                       "samples": samples, "verdicts": result}, f, indent=1)
    print("\nflat: " + ("yes" if not grown else "NO, grew: " + ", ".join(grown)))
    return 1 if grown else 0


if __name__ == "__main__":
    sys.exit(main())
