"""ParameterServerStrategy's worker fault tolerance through rdmadev, as on TF's gRPC path
(issue 59, item 3): workers killed between and midst functions, both at once, one again and
again, and values fetched after a failure (tests/e2e/pss_fault_tolerance.py, both paths on
one cluster). A lost worker must be a worker failure to ClusterCoordinator: its closures run
again and training goes on, every step applied at least once and at most once more than
the steps in flight. (A lost ps: test_pss_faults.py.)"""
import json
import os
import subprocess
import sys

import pytest

from e2e_util import ENV, HERE

pytestmark = [pytest.mark.tf, pytest.mark.slow]

#: Three servers start, 9 worker restarts a path, ~300 steps a path (~80 s measured).
TIMEOUT_S = 600
SCENARIOS = ("values_fetched_after_a_worker_failure", "worker_preempted_between_functions",
             "worker_preempted_midst_functions", "two_workers_preempted", "worker_continuous_failure")


@pytest.fixture(scope="module")
def results():
    proc = subprocess.run([sys.executable, os.path.join(HERE, "pss_fault_tolerance.py")],
                          capture_output=True, text=True, timeout=TIMEOUT_S, cwd=HERE,
                          env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2", **ENV})
    out = {}
    for line in proc.stdout.splitlines():
        if line.startswith(("RESULT ", "FAILED ")):
            kind, name, path, body = line.split(" ", 3)
            out[(name, path)] = json.loads(body) if kind == "RESULT" else {"failed": body}
    assert out, (proc.stdout + proc.stderr)[-6000:]
    return out, (proc.stdout + proc.stderr)[-6000:]


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_a_lost_worker_is_a_worker_failure_and_training_goes_on_as_on_grpc(results, scenario):
    out, log = results
    grpc, ours = out.get((scenario, "grpc")), out.get((scenario, "rdmadev"))
    assert grpc is not None and "failed" not in grpc, (grpc, log)  # TF's own path holds it
    assert ours is not None and "failed" not in ours, (ours, log)
    for r in (grpc, ours):
        assert r["scheduled"] <= r["applied"] <= r["scheduled"] + r["in_flight"], r
    if scenario == "worker_preempted_between_functions":  # nothing in flight: exactly once
        assert ours["applied"] == ours["scheduled"], ours
    if scenario == "values_fetched_after_a_worker_failure":
        assert ours["fetched"] == ours["scheduled"] and ours["positive"], ours
    # the steps ran through rdmadev (the live workers' instantiations: a killed one's reports
    # went with it; in two_workers_preempted every one is a restarted worker's)
    assert grpc["swapped"] == 0 and ours["swapped"] >= 1, ours
