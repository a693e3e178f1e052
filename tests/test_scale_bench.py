"""benchmarks/scale.py runs end to end at its smallest sizes: 2 and 3 tasks (1 ps + 1 and 2
workers) on 127.0.0.1, each twice (--repeats) on plain TF servers and on grpc+rdmadev. Never checks timing or a
slope's value: only that every configuration ran and was measured from /proc, that the step
gave bitwise the same losses and variable on both protocols, that no update was lost, and
that on rdmadev every worker's cross-task tensors were swapped onto the shm fabric."""
import json
import os
import subprocess
import sys

import pytest

pytestmark = [pytest.mark.tf, pytest.mark.slow]

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
#: Seconds the run may take: eight clusters of 2-3 tasks start in 6-10 s each and run a few
#: rounds of a tiny step in ~2 s; 70-100 s on this 2-core VM, the rest headroom for load.
TIMEOUT_S = 240


def test_scale_bench_smallest_sizes(tmp_path):
    prefix = str(tmp_path / "scale")
    cmd = [sys.executable, os.path.join(ROOT, "benchmarks", "scale.py"), "--sizes", "2", "3",
           "--repeats", "2", "--rounds", "2", "--check_steps", "2", "--fresh", "1", "--settle_s", "0", "--no_chart", "--prefix", prefix]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=TIMEOUT_S, cwd=ROOT)
    assert p.returncode == 0, (p.stdout + p.stderr)[-3000:]
    assert "| tasks | protocol | first round s (spread) | CPU s |" in p.stdout, p.stdout
    data = json.loads((tmp_path / "scale.json").read_text())
    assert not data["errors"] and not data["skipped"], (data["errors"], data["skipped"])
    rows = {(s["tasks"], s["protocol"]): s for s in data["summaries"]}
    assert set(rows) == {(n, proto) for n in (2, 3) for proto in ("grpc", "grpc+rdmadev")}
    assert len(data["runs"]) == 8
    for (n, proto), s in rows.items():
        assert s["first_s"] > 0 and s["new_first_s"] > 0 and s["step_s"] > 0, s
        # one first round per cluster: the median of the two
        assert len(s["first_runs_s"]) == 2 and s["first_s"] == sum(s["first_runs_s"]) / 2, s
        assert s["rounds"] == 4, s  # 2 per run
        # the processes used CPU in the first round: TF's own work at least
        assert s["first_cpu_s"] > 0, s
        # a TF server runs tens of threads and a handful of descriptors; each worker is one
        assert 10 < s["ps_threads"] < 1000 and 5 < s["ps_fds"] < 1000, s
        assert s["ps_anon_bytes"] > 50e6, s
        if proto == "grpc":  # plain TF holds no rdmadev memory
            assert s["ps_memfds"] == s["ps_memfd_maps"] == s["ps_registered_bytes"] == 0, s
        else:  # the ps receives from and sends to every worker: a region for each, placed
            # in that worker's chunk (a memfd per chunk: _native/core/arena.h)
            assert s["ps_regions"] >= 2 * (n - 1), s
            assert n - 1 <= s["ps_memfds"] < s["ps_regions"], s
            assert s["ps_held_bytes"] >= s["ps_registered_bytes"] >= (n - 1) * data["var_bytes"], s
            assert s["worker_memfd_maps"] > 0, s
    for n in (2, 3):
        c = data["checks"][str(n)]
        assert c["bitwise_equal"] and c["exact_sums"], c
        assert c["workers_swapped"] == c["workers"] == n - 1, c
        # each worker: the variable ps -> worker and its update back, at least
        assert c["swapped"] >= 2 * (n - 1) and c["kept_cross_task"] == 0, c
        assert {f.split("+")[0] for f in c["fabrics"]} == {"shm"}, c
        assert c["retraced"] == 0, c
    # more workers cost the ps at least one rdmadev region each, on top of TF
    beyond = data["slopes"]["beyond_grpc"]
    assert beyond["ps_memfds"] >= 1, beyond
