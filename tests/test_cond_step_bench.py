"""benchmarks/cond_step.py runs end to end at a small size: a conditional across tasks, gRPC
against rdmadev with the branch's pairs on the fabric and kept on gRPC. Never checks timing:
only that every variant reports a time, the values agree (the script exits 1 otherwise), and
the branch's pairs moved in one rdmadev variant and not in the other."""
import os
import subprocess
import sys

import pytest

pytestmark = [pytest.mark.tf, pytest.mark.slow]

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
#: Seconds the run may take: 1 ps + 1 worker start in 5-40 s, three variants trace and run
#: a few calls in ~10 s; the rest is headroom for a loaded machine.
TIMEOUT_S = 300


def test_cond_step_bench_small():
    cmd = [sys.executable, os.path.join(ROOT, "benchmarks", "cond_step.py"), "--mib", "0.25",
           "--calls", "3", "--rounds", "1"]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=TIMEOUT_S, cwd=ROOT)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-3000:]
    for name in ("grpc", "rdmadev", "rdmadev, branch on gRPC"):
        assert f"  {name:<24} median " in p.stdout, p.stdout
    assert "rdmadev: 0 pairs of the branch stayed on gRPC" in p.stdout, p.stdout
    assert "rdmadev, branch on gRPC: 3 pairs of the branch stayed on gRPC" in p.stdout, p.stdout
    assert "Failed to remove function remotely" not in p.stderr, p.stderr[-3000:]
