"""benchmarks/pss.py runs end to end on its smallest configuration: one ps and one worker on
127.0.0.1, a few steps of each variant, and its table is printed. Never checks timing: only
that every variant reports steps/sec, that rdmadev really carried the weights and gradients
(the worker's report), that nothing was instantiated again during the windows, and that the
rdmadev steps gave bitwise the same losses as gRPC."""
import json
import os
import subprocess
import sys

import pytest

pytestmark = [pytest.mark.tf, pytest.mark.slow]

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
#: Seconds the run may take: 1 ps + 1 worker start in 5-40 s, three variants trace and run
#: a few steps of a small model in ~10 s; the rest is headroom for a loaded machine.
TIMEOUT_S = 300


def test_pss_bench_smallest_config(tmp_path):
    prefix = str(tmp_path / "pss_")
    cmd = [sys.executable, os.path.join(ROOT, "benchmarks", "pss.py"), "--workers", "1",
           "--modes", "loopback", "--hidden", "256", "--steps", "2", "--windows", "2",
           "--warmup", "1", "--check_steps", "3", "--prefix", prefix]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=TIMEOUT_S, cwd=ROOT)
    assert p.returncode == 0, p.stderr[-3000:]
    assert "| variant | workers | fabric | steps/s (median) |" in p.stdout
    for name in ("grpc", "rdmadev", "no-network"):
        assert f"| {name} | 1 | shm (loopback) |" in p.stdout, p.stdout
    data = json.loads((tmp_path / "pss_results.json").read_text())
    (run,) = data["runs"]
    assert all(v > 0 for v in run["steps_per_sec"].values())
    rep = run["report"]
    # 6 variables: their reads ps -> worker and their gradients back, at least
    assert rep["swapped"] >= 12 and rep["kept"] == 0, rep
    assert rep["swapped_bytes"] >= 2 * run["model_bytes"], rep
    assert {f.split("+")[0] for f in rep["fabrics"]} == {"shm"}, rep
    assert rep["workers_planned"] == 1 and rep["grpc_instances"] == 0, rep
    assert rep["local_cross_task"] == 0, rep
    assert run["instantiations_during_windows"] == 0 and not run["retraced_during_windows"], run
    assert run["check"]["identical"], run["check"]
    assert (tmp_path / "pss_results.md").exists()
