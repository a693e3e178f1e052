"""benchmarks/fabric_bench.py --veth runs end to end: the tcp fabric and raw TCP, each between
two network namespaces joined by a veth pair, and every namespace is gone afterwards. Never
checks timing."""
import os
import re
import subprocess
import sys

import pytest

import netns

pytestmark = pytest.mark.netns
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
#: Two short latency trials and two bandwidth sizes of 128 MiB each; headroom for a loaded box.
TIMEOUT_S = 300


def test_fabric_bench_over_veth(tmp_path):
    netns.require()
    p = subprocess.run([sys.executable, os.path.join(ROOT, "benchmarks", "fabric_bench.py"), "--veth",
                        "--quick", "--trials", "1", "--max-size", str(1 << 20), "--lat-iters", "200",
                        "--json", str(tmp_path / "veth.json")],
                       capture_output=True, text=True, timeout=TIMEOUT_S, cwd=ROOT)
    assert p.returncode == 0, p.stderr[-3000:]
    where = re.search(r"namespaces (rdfb\S+) \(10\.231\.77\.1\) and (rdfb\S+) \(10\.231\.77\.2\) over veth",
                      p.stdout)
    assert where, p.stdout
    for row in ("8 B one-way us", "64 KiB GB/s K=32", "1 MiB GB/s K=2"):
        assert re.search(rf"^{re.escape(row)} +- +\d+\.\d+ +\d+\.\d+ +\d+\.\d+$|"
                         rf"^{re.escape(row)} +\d+\.\d+ +\d+\.\d+ +\d+\.\d+ +\d+\.\d+$", p.stdout, re.M), p.stdout
    listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    assert where.group(1) not in listed and where.group(2) not in listed
