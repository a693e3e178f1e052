"""benchmarks/fabric_bench.py runs end to end on loopback, with the columns that stream from
heap memory (--heap: what a TF send passes) next to those that stream from a region. Never
checks timing."""
import os
import re
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
#: One trial of two latency and two bandwidth sizes, 8 MiB each; headroom for a loaded box.
TIMEOUT_S = 300
NUMBER = r"\d+\.\d+"


def test_fabric_bench_streams_from_regions_and_from_heap_memory(tmp_path):
    p = subprocess.run([sys.executable, os.path.join(ROOT, "benchmarks", "fabric_bench.py"),
                        "--fabrics", "shm,tcp", "--heap", "--quick", "--trials", "1",
                        "--max-size", str(1 << 20), "--lat-iters", "200", "--trial-mib", "8",
                        "--json", str(tmp_path / "fb.json")],
                       capture_output=True, text=True, timeout=TIMEOUT_S, cwd=ROOT)
    assert p.returncode == 0, p.stderr[-3000:]
    head = re.search(r"^metric +memcpy +rawtcp +shm +tcp +shm\+heap +tcp\+heap +shm/memcpy +"
                     r"tcp/raw tcp +heap/memcpy +heap/raw tcp$", p.stdout, re.M)
    assert head, p.stdout
    # Latency is a ping-pong between regions: no heap column. Bandwidth has every column.
    for row in ("8 B one-way us", "4 KiB one-way us"):
        assert re.search(rf"^{row} +- +{NUMBER} +{NUMBER} +{NUMBER} +- +- +- +{NUMBER} +- +-$",
                         p.stdout, re.M), p.stdout
    for row in ("64 KiB GB/s K=32", "1 MiB GB/s K=2"):
        assert re.search(rf"^{row}( +{NUMBER}){{10}}$", p.stdout, re.M), p.stdout


def test_write_time_measures_writes_from_a_region_and_from_heap_memory():
    p = subprocess.run([sys.executable, os.path.join(ROOT, "benchmarks", "write_time.py"),
                        "--fabric", "shm", "--writes", "1"],
                       capture_output=True, text=True, timeout=TIMEOUT_S, cwd=ROOT)
    assert p.returncode == 0, p.stderr[-3000:]
    cell = rf"{NUMBER} \[{NUMBER}-{NUMBER}\]"
    for size in (64 << 10, 1 << 20, 16 << 20):
        assert re.search(rf"^ +{size} +{cell} +{cell}$", p.stdout, re.M), p.stdout
