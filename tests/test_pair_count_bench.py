"""benchmarks/pair_count.py runs end to end on a small configuration: every variant of every
count is timed and the per-pair slopes are printed. Never checks timing."""
import os
import re
import subprocess
import sys

import pytest

pytestmark = [pytest.mark.tf, pytest.mark.slow]

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
#: Two tasks start in 5-40 s, twelve functions trace and 10 x 2 x 5 calls run in seconds; the rest
#: is headroom for a loaded machine.
TIMEOUT_S = 240


def test_pair_count_smallest_config():
    p = subprocess.run([sys.executable, os.path.join(ROOT, "benchmarks", "pair_count.py"),
                        "--counts", "1", "3", "--calls", "5", "--rounds", "2"],
                       capture_output=True, text=True, timeout=TIMEOUT_S, cwd=ROOT)
    assert p.returncode == 0, p.stderr[-3000:]
    for n in (1, 3):
        for name in ("local", "grpc", "rdmadev", "rdmadev 1ch", "grpc 1x", "rdmadev 1x"):
            assert re.search(rf"^ +{n} {re.escape(name)} +\d+\.\d+ ", p.stdout, re.M), p.stdout
    for name in ("grpc", "rdmadev", "rdmadev 1ch"):
        assert re.search(rf"per extra pair above local, {name}: -?\d+\.\d us", p.stdout), p.stdout
    assert "Failed to remove function" not in p.stderr, p.stderr[-3000:]
