"""One TF job across two Soft-RoCE guests over verbs (too slow for CI: a recorded run):

    tests/softroce/run-two-vms.sh python3 tests/softroce/tf_across_guests.py [SCENARIO]

`rdmadev serve` tasks with RDMADEV_FABRIC=verbs: ps:0 in guest a, worker:0 and worker:1 and
the coordinator (tests/e2e/driver.py) in guest b, so every ps <-> worker tensor crosses the
virtual wire as RDMA WRITEs (and READs of stages) between the two rxe0 devices. The
coordinator runs SCENARIO (tf_over_verbs.py's: train, sparse or growing; default train) once
through TF's gRPC and once through rdmadev.optimize, in one process, and checks that both
give bitwise identical results and that every swapped transfer went over verbs. Prints
"RESULT <scenario>: bitwise identical" and exits 0 in guest b when they match; guest a
exits 0 when its ps ran until b was done.
"""
import os
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "e2e"))
from two_hosts import A, B, _mark, _wait_for  # noqa: E402

SPEC = {"ps": [f"{A}:24000"], "worker": [f"{B}:24001", f"{B}:24002"]}
# TF in a guest of one emulated vCPU: 75-180 s to import, more with three processes in one guest.
READY_TIMEOUT_S = 1200
DONE_TIMEOUT_S = 3600


def _serve(job, index):
    import json

    from e2e_util import ENV
    from tf_over_verbs import VERBS
    return subprocess.Popen([sys.executable, "-m", "rdmadev.server", "--cluster", json.dumps(SPEC),
                             "--job", job, "--task", str(index)],
                            env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2", **ENV, **VERBS})


def _listening(timeout):
    from rdmadev.testing.launch import _port_open
    end = time.monotonic() + timeout
    addrs = [a.rsplit(":", 1) for job in SPEC.values() for a in job]
    while not all(_port_open(h, int(p)) for h, p in addrs):
        if time.monotonic() > end:
            return False
        time.sleep(2)
    return True


def ps_side():
    ps = _serve("ps", 0)
    try:
        if not _wait_for(_mark("b.done"), DONE_TIMEOUT_S):
            print("guest a: guest b did not finish", flush=True)
            return 1
        return 0 if ps.poll() is None else 1
    finally:
        ps.kill()
        ps.wait(30)


def worker_side(scenario):
    import e2e_util
    import tf_over_verbs
    env, check = tf_over_verbs.SCENARIOS[scenario]
    workers = [_serve("worker", i) for i in range(2)]
    try:
        start = time.monotonic()
        if not _listening(READY_TIMEOUT_S):
            print(f"guest b: the cluster did not listen within {READY_TIMEOUT_S} s", flush=True)
            return 1
        print(f"cluster up in {time.monotonic() - start:.0f} s", flush=True)

        class Cluster:
            spec = SPEC
        grpc, rdma = e2e_util.run_many(Cluster, [("grpc", scenario), ("rdmadev", scenario)],
                                       env={**tf_over_verbs.VERBS, **env}, timeout=DONE_TIMEOUT_S)
        failed = [r["error"] for r in (grpc, rdma) if "error" in r]
        problems = failed or check(grpc, rdma) + tf_over_verbs.swapped_on_verbs(rdma["report"])
        if not failed:
            print(rdma["report"])
        print(f"RESULT {scenario} ({time.monotonic() - start:.0f} s):",
              "bitwise identical" if not problems else "; ".join(problems), flush=True)
        return 1 if problems else 0
    finally:
        open(_mark("b.done"), "w").close()
        for w in workers:
            w.kill()
            w.wait(30)


if __name__ == "__main__":
    guest = os.environ.get("RDMADEV_GUEST")
    if guest not in ("a", "b"):
        sys.exit("run this through tests/softroce/run-two-vms.sh (it sets RDMADEV_GUEST)")
    sys.exit(ps_side() if guest == "a" else worker_side((sys.argv[1:] or ["train"])[0]))
