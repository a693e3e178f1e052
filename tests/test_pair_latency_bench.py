"""benchmarks/pair_latency.py runs end to end on a small configuration: every variant is timed
and rdmadev's pairs are matched across the two tasks' profiler traces. Never checks timing."""
import os
import re
import subprocess
import sys

import pytest

pytestmark = [pytest.mark.tf, pytest.mark.slow]

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
#: Two tasks start in 5-40 s, three functions trace and 3 x 2 x 20 calls run in seconds, the
#: trace takes ~3 s; the rest is headroom for a loaded machine.
TIMEOUT_S = 240


def test_pair_latency_smallest_config():
    p = subprocess.run([sys.executable, os.path.join(ROOT, "benchmarks", "pair_latency.py"),
                        "--calls", "20", "--rounds", "2", "--trace_s", "1.5"],
                       capture_output=True, text=True, timeout=TIMEOUT_S, cwd=ROOT)
    assert p.returncode == 0, p.stderr[-3000:]
    for name in ("floor", "grpc", "rdmadev"):
        assert re.search(rf"^  {name} +median +\d+\.\d+", p.stdout, re.M), p.stdout
    pairs = int(re.search(r"(\d+) matched pairs", p.stdout).group(1))
    assert pairs >= 10, p.stdout
    assert re.search(r"^  delivery +median +\d+\.\d", p.stdout, re.M), p.stdout
