"""tf_cnn_benchmarks itself, unchanged, over `grpc` and `grpc+rdmadev`: the user's way of
running it (each task started with `--server_protocol`, between-graph replication, nothing
imports rdmadev). It is not shipped here; fetch tensorflow/benchmarks and point --dir at its
scripts/tf_cnn_benchmarks:

    git clone https://github.com/tensorflow/benchmarks && git -C benchmarks checkout 8fb7907
    python benchmarks/tf_cnn.py --dir benchmarks/scripts/tf_cnn_benchmarks --rounds 3 \\
        -- --model=alexnet --batch_size=8

Each round runs one job per protocol, alternating (grpc, grpc+rdmadev, grpc, ...): 1 ps +
num_workers workers on 127.0.0.1, `--variable_update=parameter_server` on CPU, plus the
flags after `--`. A job's figure is its workers' "total images/sec" (each prints its own rate
times the number of workers; the mean of theirs is the job's rate); the table
gives each protocol's median over rounds, the spread, and the ratio. `--reference` adds the
no-network limit to each round: num_workers single-process jobs at once (local variables),
sharing the machine as the workers do. TF_USE_LEGACY_KERAS=1
(tf_cnn_benchmarks needs tf_keras on TF 2.16+). Every process started here is stopped.
"""
import argparse
import os
import re
import secrets
import statistics
import subprocess
import sys
import time

PROTOCOLS = ("grpc", "grpc+rdmadev")
#: Seconds one job may take: TF import, graph build and registration, warm-up and the
#: measured batches of alexnet at 224 px on a loaded 2-core machine.
JOB_TIMEOUT_S = 900
TOTAL = re.compile(r"total images/sec: ([0-9.]+)")


def free_ports(n):
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    from rdmadev.testing.launch import free_ports as free
    return free(n)


def _run(args, flag_sets, measured):
    """Starts tf_cnn_benchmarks once per flag list of `flag_sets` (all at once), waits for the
    `measured` ones (indexes) and stops the rest; returns ``(outputs, totals)`` of the
    measured ones, each total its last "total images/sec"."""
    env = {**os.environ, "TF_USE_LEGACY_KERAS": "1", "TF_CPP_MIN_LOG_LEVEL": "2"}
    script = os.path.join(args.dir, "tf_cnn_benchmarks.py")
    procs = [subprocess.Popen([sys.executable, script, "--local_parameter_device=cpu",
                               "--device=cpu", "--data_format=NHWC", *flags], cwd=args.dir,
                              env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
             for flags in flag_sets]
    try:
        outs = [procs[i].communicate(timeout=JOB_TIMEOUT_S)[0] for i in measured]
    finally:
        for p in procs:
            p.kill()
            p.wait()
    for out in outs:
        if not TOTAL.search(out):
            raise SystemExit(f"a tf_cnn_benchmarks process printed no total images/sec:\n"
                             f"{out[-3000:]}")
    return outs, [float(TOTAL.findall(o)[-1]) for o in outs]


def job(args, protocol, extra):
    """Runs one tf_cnn_benchmarks job; returns (its images/sec, the rdmadev half pairs the
    workers' logs report swapped)."""
    ps, *workers = [f"127.0.0.1:{p}" for p in free_ports(1 + args.num_workers)]
    common = [f"--ps_hosts={ps}", f"--worker_hosts={','.join(workers)}",
              f"--server_protocol={protocol}", "--variable_update=parameter_server", *extra]
    tasks = [("ps", 0)] + [("worker", i) for i in range(args.num_workers)]
    outs, totals = _run(args, [[f"--job_name={j}", f"--task_index={i}", *common] for j, i in tasks],
                        range(1, len(tasks)))
    halves = sum(len(re.findall(r"^\s+\S+ half ", o, re.M)) for o in outs)
    # Each worker's "total" is its own rate times the number of workers: their mean is the
    # job's rate.
    return statistics.mean(totals), halves


def local_jobs(args, extra):
    """The no-network reference: num_workers single-process jobs at once (the same flags
    without a cluster: variables local to each), sharing the machine as the workers do;
    returns the sum of their images/sec."""
    return sum(_run(args, [extra] * args.num_workers, range(args.num_workers))[1])


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dir", required=True, help="tensorflow/benchmarks' scripts/tf_cnn_benchmarks")
    ap.add_argument("--num_workers", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--reference", action="store_true",
                    help="add the no-network reference to each round (local_jobs)")
    ap.add_argument("extra", nargs="*", help="tf_cnn_benchmarks flags (after --)")
    args = ap.parse_args(argv)
    os.environ.setdefault("RDMADEV_SECRET", secrets.token_hex(16))
    extra = args.extra or ["--model=alexnet", "--batch_size=8"]
    variants = PROTOCOLS + (("no network",) if args.reference else ())
    rates, halves = {v: [] for v in variants}, 0
    t0 = time.perf_counter()
    for r in range(args.rounds):
        for protocol in variants:
            rate, n = (local_jobs(args, extra), 0) if protocol == "no network" else \
                job(args, protocol, extra)
            rates[protocol].append(rate)
            if protocol == "grpc+rdmadev":
                halves = n
            print(f"round {r + 1}/{args.rounds} {protocol}: {rate:.2f} images/sec "
                  f"({time.perf_counter() - t0:.0f} s)", file=sys.stderr, flush=True)
    print(f"tf_cnn_benchmarks {' '.join(extra)}, 1 ps + {args.num_workers} workers, "
          f"median of {args.rounds} jobs each")
    base = statistics.median(rates["grpc"])
    for protocol, v in rates.items():
        m = statistics.median(v)
        print(f"  {protocol:<13} {m:8.2f} images/sec  [{min(v):.2f}-{max(v):.2f}]  "
              f"({m / base:.2f}x grpc)")
    print(f"  rdmadev: {halves} half pairs swapped on the workers (their own reports)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
