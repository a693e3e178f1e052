"""benchmarks/cnn.py runs end to end on its smallest configuration and rdmadev really carries
the model's traffic. Never checks timing: only that images/sec are reported for every variant
and the rdmadev report swapped the variable reads and gradients."""
import json
import os
import subprocess
import sys

import pytest

pytestmark = [pytest.mark.tf, pytest.mark.slow]

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
#: Seconds the run may take: 1 ps + 1 worker start in 5-40 s, six variants trace and run
#: 1 + 2 steps of alexnet at 32 px in ~20 s, the profiler trace takes ~5 s; the rest is
#: headroom for a loaded machine.
TIMEOUT_S = 300


def test_cnn_bench_smallest_config(tmp_path):
    out = tmp_path / "cnn.json"
    cmd = [sys.executable, os.path.join(ROOT, "benchmarks", "cnn.py"), "--model", "alexnet",
           "--batch_size", "2", "--num_workers", "1", "--num_ps", "1", "--image_size", "32",
           "--num_batches", "2", "--num_windows", "2", "--num_warmup_batches", "1",
           "--server_protocol", "both", "--reference", "--profile", "--no_progress",
           "--json", str(out)]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=TIMEOUT_S, cwd=ROOT)
    assert p.returncode == 0, p.stderr[-3000:]
    r = json.loads(out.read_text())
    assert set(r["images_per_sec"]) == {"grpc", "rdmadev", "local", "floor", "grpc_comm",
                                        "rdmadev_comm"}
    assert all(v > 0 for v in r["images_per_sec"].values())
    assert "images/sec" in p.stdout
    rep = r["report"]
    # 16 variables: 16 reads ps -> worker and 16 gradients back, all static shapes.
    big = r["model_bytes"]
    assert rep["swapped"] >= 32, rep
    assert rep["swapped_bytes_per_step"] >= 2 * big, rep
    # fabric names may carry a suffix ("shm+zc": zero-copy receive)
    assert rep["fabrics"] and {f.split("+")[0] for f in rep["fabrics"]} <= {"shm", "tcp", "verbs"}, rep
    # What stays on gRPC is only the coordinator's share (the loss it fetches).
    assert rep["kept_reasons"] == ["client_task"], rep
    # --profile's table comes from the ops' events in a TF profiler trace of every task: each
    # task sends and receives, and what the trace says a step moved is what the plan swapped.
    rows = {(t["task"], t["kind"]): t for t in r["trace"]["rows"]}
    assert set(rows) == {("ps:0", "send"), ("ps:0", "recv"), ("worker:0", "send"),
                         ("worker:0", "recv")}, r["trace"]
    sent = sum(t["bytes"] for (_, kind), t in rows.items() if kind == "send")
    received = sum(t["bytes"] for (_, kind), t in rows.items() if kind == "recv")
    assert sent == received == rep["swapped_bytes_per_step"], (r["trace"], rep)
    assert all(t["write_ms"] > 0 for (_, kind), t in rows.items() if kind == "send")
    assert "where the time goes (TF profiler" in p.stdout


def test_cnn_bench_between_graph_smallest_config(tmp_path):
    out = tmp_path / "cnn_bg.json"
    cmd = [sys.executable, os.path.join(ROOT, "benchmarks", "cnn.py"), "--between_graph",
           "--model", "alexnet", "--batch_size", "2", "--num_workers", "2", "--num_ps", "1",
           "--num_batches", "1", "--num_windows", "1", "--num_warmup_batches", "1",
           "--window_s", "2", "--no_progress", "--json", str(out)]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=TIMEOUT_S, cwd=ROOT)
    assert p.returncode == 0, p.stderr[-3000:]
    r = json.loads(out.read_text())
    assert set(r["images_per_sec"]) == {"grpc", "rdmadev"}
    assert all(v > 0 for v in r["images_per_sec"].values())
    # Per worker session: 16 variable reads and 16 gradients, each planned as a half on the
    # worker and on the ps; nothing stays on gRPC.
    assert r["halves_swapped"] >= 2 * 2 * 32 and r["kept_on_grpc"] == 0, r["reports"]
    assert "half pairs swapped" in p.stdout
    # The fully connected layers' weight gradients, whose shape the worker's TF leaves
    # unknown, came in 1 MiB chunks in the warm-up step: ps grew their channels.
    assert r["grown"] >= 2, r
