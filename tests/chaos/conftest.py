"""The chaos tier (`pytest -m chaos`): faults injected into a running job, rdmadev against
TF's own gRPC path in the same run. A results table is printed at the end of the session, and
written to $RDMADEV_CHAOS_RESULTS when set."""
import os
import random
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path[:0] = [HERE, os.path.dirname(HERE), os.path.join(ROOT, "benchmarks")]

RESULTS = []


@pytest.fixture
def rng(request):
    """A random.Random whose seed is printed (RDMADEV_CHAOS_SEED replays it)."""
    seed = int(os.environ.get("RDMADEV_CHAOS_SEED") or random.SystemRandom().randrange(1 << 32))
    print(f"\n{request.node.name}: RDMADEV_CHAOS_SEED={seed}")
    return random.Random(seed)


@pytest.fixture
def results():
    return RESULTS


def _fmt(seconds):
    return "-" if seconds is None else f"{seconds:.2f} s"


def pytest_terminal_summary(terminalreporter):
    if not RESULTS:
        return
    lines = ["| job | fault | target | fabric | path | coordinator's error after | survivors knew after "
             "| named the task | recovered | held resources back after |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for r in RESULTS:
        # What rdmadev gives back (HELD); the job holds none of it on gRPC's path, not judged there.
        back = "-" if r["mode"] != "rdmadev" else "NO" if r["settled_s"] is None else _fmt(r["settled_s"])
        lines.append(f"| {r['job']} | {r['fault']} | {r['target']} | {r['fabric']} | {r['mode']} | "
                     f"{r['coordinator']} | {_fmt(r['survivors_s'])} | "
                     f"{'yes' if r['named'] else 'no'} | {'yes' if r['recovered'] else 'NO'} | "
                     f"{back} |")
    table = "\n".join(lines)
    terminalreporter.write_line("\nchaos results (times from the fault; resources: from the end "
                                "of the recovery run):\n" + table)
    path = os.environ.get("RDMADEV_CHAOS_RESULTS")
    if path:
        with open(path, "w") as f:
            f.write(table + "\n")
