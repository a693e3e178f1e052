"""How long one write keeps its caller, from a region of the domain and from heap memory (what
a TF send passes), alternating; each write starts on an idle endpoint (the peer has seen the
previous one). On verbs a region is written without a copy and the write returns at its
completion, heap memory is staged and the write returns once posted.

    python benchmarks/write_time.py                      # verbs (the Soft-RoCE guest:
    tests/softroce/run-in-vm.sh python benchmarks/write_time.py   #   see BENCHMARKS.md)
    python benchmarks/write_time.py --fabric shm

Prints milliseconds per write, median of --writes [min-max], per size.
"""
import argparse
import os
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path[:0] = [ROOT, os.path.join(ROOT, "tests")]

import rdmadev  # noqa: E402
from remote import RemotePeer  # noqa: E402

SIZES = (64 << 10, 1 << 20, 16 << 20)
#: Per write; a 16 MiB write on Soft-RoCE under emulation takes ~0.3 s.
TIMEOUT_S = 120


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--fabric", default="verbs")
    ap.add_argument("--writes", type=int, default=9, help="writes per size and source")
    args = ap.parse_args(argv)
    secret = os.urandom(32)
    dom = rdmadev.open_domain("write_time", rdmadev.Config(fabric=args.fabric, secret=secret))
    try:
        with RemotePeer(args.fabric, secret) as peer:
            ep = dom.connect(peer.address, args.fabric)
            remote = ep.attach(peer.call("alloc", "dst", 64 + max(SIZES)))
            sources = {"region": dom.allocate(max(SIZES)), "heap": bytearray(b"\x01") * max(SIZES)}
            seq = 0
            print(f"{args.fabric}: ms per write, median of {args.writes} [min-max]")
            print(f"{'bytes':>10} {'region':>24} {'heap':>24}")
            for n in SIZES:
                ms = {name: [] for name in sources}
                for _ in range(args.writes):
                    for name, src in sources.items():
                        seq += 1
                        t0 = time.perf_counter()
                        ep.write(src, 0, remote, 64, n, signal=(0, seq, n), timeout=TIMEOUT_S)
                        ms[name].append((time.perf_counter() - t0) * 1e3)
                        peer.call("wait", "dst", 0, seq, TIMEOUT_S)
                cells = [f"{statistics.median(v):.2f} [{min(v):.2f}-{max(v):.2f}]" for v in ms.values()]
                print(f"{n:>10} " + " ".join(f"{c:>24}" for c in cells))
    finally:
        dom.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
