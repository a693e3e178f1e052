"""benchmarks/staged.py runs end to end on loopback: the same tensors staged and in chunks
through TF's ops, with the staged count checked by the script itself. Never checks timing."""
import os
import re
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
#: TF import, two fabrics, one trial of one tensor each way: headroom for a loaded box.
TIMEOUT_S = 300
CELL = r"\d+\.\d+ \[\d+\.\d+-\d+\.\d+\]"


def test_staged_bench_moves_each_tensor_both_ways():
    p = subprocess.run([sys.executable, os.path.join(ROOT, "benchmarks", "staged.py"),
                        "--fabrics", "shm,tcp", "--slots", "64K,1M", "--sizes", "0.5,2",
                        "--trials", "1", "--count", "2"],
                       capture_output=True, text=True, timeout=TIMEOUT_S, cwd=ROOT)
    assert p.returncode == 0, p.stderr[-3000:]
    assert "cuInit" not in p.stderr, p.stderr  # the benchmarks import TF without its start-up noise
    rows = re.findall(rf"^(shm|tcp) +(64K|1M) +([\d.]+) +{CELL} +{CELL} +{CELL}$", p.stdout, re.M)
    # 0.5 MiB is not above a 1 MiB slot: skipped there.
    assert sorted(rows) == sorted((f, s, m) for f in ("shm", "tcp")
                                  for s, m in (("64K", "0.5"), ("64K", "2"), ("1M", "2"))), p.stdout
