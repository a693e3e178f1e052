"""TensorFlow-level runs over verbs (run them inside the Soft-RoCE guest):

    tests/softroce/run-in-vm.sh python tests/softroce/tf_over_verbs.py [SCENARIO ...]

Starts a loopback 1 ps + 2 worker cluster of `rdmadev serve` tasks with RDMADEV_FABRIC=verbs
(every task's domain opens only the verbs fabric, so every planned transfer is an RDMA WRITE
over rxe0) and runs e2e suite scenarios (tests/e2e/driver.py) once through TF's gRPC and once
through rdmadev.optimize, checking that they give bitwise identical results:

    train    a dense training step, static shapes (30 steps)
    sparse   an embedding step: tf.unique'd ids, gathered rows and IndexedSlices gradients,
             every tensor of a run-time shape; ragged and empty batches; 256-byte slots, so
             all but the smallest are staged by their sender and pulled with RDMA READ
    growing  a run-time-shaped tensor outgrows its 4 KiB slots twice: staged and read, then ps
             moves the channel to larger slots (a new ring registered on rxe0) and later steps
             take one slot each; a tensor of 0 elements too

Default: all three. Exit status 0 when every scenario matched; prints each rdmadev report.
Too slow under emulation for CI (TF starts ~10x slower than on the host); BENCHMARKS.md
records the runs.
"""
import os
import re
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "e2e"))
import e2e_util  # noqa: E402
from e2e_util import ENV, rdmadev_launcher, run_driver, tf_cluster  # noqa: E402

# TF under software emulation starts ~10x slower than on the host.
READY_TIMEOUT_S = 900
e2e_util.DRIVER_TIMEOUT_S = 1500
VERBS = {"RDMADEV_FABRIC": "verbs", "RDMADEV_DEADLINE_S": "600",
         "RDMADEV_E2E_GROWTH_WAIT_S": "600"}


def swapped_on_verbs(report):
    """Problems with a report: a swapped transfer on another fabric, or a pair kept on gRPC
    for any reason but touching the coordinator."""
    problems = []
    for line in report.splitlines():
        m = re.match(r"\s+(\S+)\s+\S+ -> \S+\s+\S+", line)
        if not m:
            continue
        kept = re.search(r"\((\w+)\)\s*$", line)
        if m.group(1) == "grpc" and not (kept and kept.group(1) == "client_task"):
            problems.append("kept on gRPC: " + line.strip())
        elif m.group(1) != "grpc" and not m.group(1).startswith("verbs"):
            problems.append("not on verbs: " + line.strip())
    return problems


def check_train(grpc, rdma):
    return [] if (rdma["losses"], rdma["w"], rdma["b"]) == (grpc["losses"], grpc["w"], grpc["b"]) \
        else ["losses or weights differ"]


def check_sparse(grpc, rdma):
    problems = [f"{k} differs" for k in ("losses", "unique", "table", "dense") if rdma[k] != grpc[k]]
    if rdma["report"].count("run-time shape") < 3:
        problems.append("fewer than 3 run-time-shaped transfers swapped")
    return problems


def check_growing(grpc, rdma):
    problems = [] if rdma["values"] == grpc["values"] else ["values differ"]
    # As tests/e2e/test_e2e.py: 12000 B past 4 KiB slots, then 400000 B past the 64 KiB ones,
    # each one staged transfer; each growth one new ring.
    if rdma["chunks"] != [1] * 7 or rdma["staged"] != [1, 0, 0, 1, 0, 0, 0] \
            or rdma["grown"] != [1, 0, 0, 1, 0, 0, 0]:
        problems.append(f"transfers {rdma['chunks']}, staged {rdma['staged']}, grown {rdma['grown']}")
    return problems


SCENARIOS = {
    "train": ({}, check_train),
    "sparse": ({"RDMADEV_DYNAMIC_CAPACITY": "256"}, check_sparse),
    "growing": ({"RDMADEV_DYNAMIC_CAPACITY": "4K"}, check_growing),
}


def main(names):
    unknown = sorted(set(names) - SCENARIOS.keys())
    if unknown:
        sys.exit(f"unknown scenario {unknown[0]}; choose from {', '.join(SCENARIOS)}")
    failed = []
    with tf_cluster.Cluster(env={**ENV, **VERBS}, launcher=rdmadev_launcher,
                            ready_timeout=READY_TIMEOUT_S) as cluster:
        for name in names:
            env, check = SCENARIOS[name]
            start = time.monotonic()
            grpc = run_driver(cluster, "grpc", name, env=VERBS)
            rdma = run_driver(cluster, "rdmadev", name, env={**VERBS, **env})
            problems = check(grpc, rdma) + swapped_on_verbs(rdma["report"])
            print(f"== {name} ({time.monotonic() - start:.0f} s)\n{rdma['report']}")
            print(f"RESULT {name}:", "bitwise identical" if not problems else "; ".join(problems),
                  flush=True)
            failed += [name] if problems else []
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:] or list(SCENARIOS)))
