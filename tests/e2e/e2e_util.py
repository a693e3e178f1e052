"""Helpers of the e2e tests: the `rdmadev serve` launcher for tests/tf_cluster.py and a
runner for tests/e2e/driver.py scenarios (each in its own coordinator process, or several
one after the other in one: run_many)."""
import json
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
import tf_cluster  # noqa: E402
from tf_cluster import rdmadev_launcher  # noqa: E402,F401

SECRET = "rdmadev-e2e-secret"
ENV = {"RDMADEV_SECRET": SECRET, "RDMADEV_DEADLINE_S": "60", "RDMADEV_FABRIC": "auto"}
# A coordinator process: TF import + connect + tracing + 30 steps, on a loaded 2-core box.
DRIVER_TIMEOUT_S = 300


def run_many(cluster, runs, env=None, timeout=DRIVER_TIMEOUT_S):
    """Runs [(mode, scenario), ...] one after the other in one coordinator process; returns
    their results (a run that raised: {"error": traceback}). `env` applies to the whole
    process: only rdmadev reads its RDMADEV_* settings, once per process (its runtime's
    Config)."""
    return run_driver(cluster, "runs", json.dumps([list(r) for r in runs]), env=env,
                      timeout=timeout)


def run_driver(cluster, mode, scenario, env=None, expect_ok=True, timeout=DRIVER_TIMEOUT_S):
    """Runs one scenario; returns its JSON result (or the failed process when not expect_ok)."""
    proc = subprocess.run(
        [sys.executable, os.path.join(HERE, "driver.py"), json.dumps(cluster.spec), mode, scenario],
        capture_output=True, text=True, timeout=timeout,
        env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2", **ENV, **(env or {})})
    lines = [l for l in proc.stdout.splitlines() if l.startswith("RESULT ")]
    if not expect_ok:
        return proc
    assert proc.returncode == 0 and lines, (proc.stdout + proc.stderr)[-4000:]
    return json.loads(lines[-1][len("RESULT "):])
