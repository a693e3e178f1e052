"""benchmarks/control_flow.py runs end to end at a small size, for a conditional and for a loop
across tasks: gRPC against rdmadev with the pairs of the conditional or loop on the fabric and
kept on gRPC. Never checks timing: only that every variant reports a time, the values agree
(the script exits 1 otherwise), and those pairs moved in one rdmadev variant and not in the
other."""
import os
import subprocess
import sys

import pytest

pytestmark = [pytest.mark.tf, pytest.mark.slow]

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
#: Seconds the run may take: 1 ps + 1 worker start in 5-40 s, three variants trace and run
#: a few calls in ~10 s; the rest is headroom for a loaded machine.
TIMEOUT_S = 300


@pytest.mark.parametrize("flow, kept_before", [("cond", 3), ("loop", 9)])
def test_control_flow_bench_small(flow, kept_before):
    cmd = [sys.executable, os.path.join(ROOT, "benchmarks", "control_flow.py"), "--flow", flow,
           "--mib", "0.25", "--iterations", "3", "--calls", "3", "--rounds", "1"]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=TIMEOUT_S, cwd=ROOT)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-3000:]
    for name in ("grpc", "rdmadev", f"rdmadev, {flow} on gRPC"):
        assert f"  {name:<24} median " in p.stdout, p.stdout
    assert f"rdmadev: 0 pairs of the {flow} stayed on gRPC" in p.stdout, p.stdout
    assert f"rdmadev, {flow} on gRPC: {kept_before} pairs of the {flow} stayed on gRPC" in p.stdout, p.stdout
    assert "Failed to remove function remotely" not in p.stderr, p.stderr[-3000:]
