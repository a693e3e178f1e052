"""benchmarks/keras_fit.py runs end to end at a small size: Keras 3 fit with and without
steps_per_execution, variables on a ps, gRPC against rdmadev. Never checks timing: only that
every variant reports a rate, the weights agree (the script exits 1 otherwise), and the train
loop's pairs moved each iteration with none left on gRPC."""
import os
import subprocess
import sys

import pytest

pytestmark = [pytest.mark.tf, pytest.mark.slow]

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
#: Seconds the run may take: 1 ps + 1 worker start in 5-40 s, four models trace and fit a few
#: steps in ~20 s; the rest is headroom for a loaded machine.
TIMEOUT_S = 300


def test_keras_fit_bench_small():
    cmd = [sys.executable, os.path.join(ROOT, "benchmarks", "keras_fit.py"), "--steps_per_execution", "1,4",
           "--steps", "4", "--rounds", "1"]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=TIMEOUT_S, cwd=ROOT)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-3000:]
    for n in (1, 4):
        for mode in ("grpc", "rdmadev"):
            assert f"  steps_per_execution={n:<3} {mode:<8} median " in p.stdout, p.stdout
    assert "steps_per_execution=1   rdmadev: 0 pairs moved each loop iteration, 0 on gRPC []" in p.stdout, p.stdout
    looped = [line for line in p.stdout.splitlines() if line.startswith("  steps_per_execution=4   rdmadev: ")]
    assert looped and looped[0].endswith(", 0 on gRPC []") and not looped[0].startswith(
        "  steps_per_execution=4   rdmadev: 0 pairs"), p.stdout
    assert "Failed to remove function remotely" not in p.stderr, p.stderr[-3000:]
