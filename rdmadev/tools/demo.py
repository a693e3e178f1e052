"""`rdmadev demo`: two processes on this host move float32 tensors through a 2-slot ring
over every viable fabric; the receiver checks every element. Prints a table.

Example:
    $ rdmadev demo --sizes 4096,1048576 --count 20
"""
import argparse
import os
import time

import numpy as np

from ..testing import pair
from ..config import Config
from ..device import open_domain, viable_fabrics

__all__ = ["main"]

DEFAULT_SIZES = (4, 4096, 1 << 20, 64 << 20)  # bytes: a scalar .. a large weight tensor


def _pattern(nbytes, seq):
    """The float32 tensor number `seq` of `nbytes` bytes (both sides compute it)."""
    n = nbytes // 4
    return (np.arange(n, dtype=np.float32) * 0.5 + np.float32(seq)).view(np.uint8)


def _receiver(conn, fabric, secret, sizes, count):
    dom = open_domain("demo:receiver", Config(fabric=fabric, secret=secret))
    try:
        for size in sizes:
            rx = pair.ring_receiver(dom, conn, 2, size, fabric)
            bad = 0
            for i in range(count):
                seq, off, length = rx.acquire(timeout=60)
                got = np.frombuffer(rx.ring, np.uint8, length, off)
                if length != size or not np.array_equal(got, _pattern(size, seq)):
                    bad += 1
                rx.release(seq)
            conn.send(bad)
        pair.recv(conn)
    finally:
        dom.close()


def main(argv=None):
    ap = argparse.ArgumentParser(prog="rdmadev demo", description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default=",".join(map(str, DEFAULT_SIZES)),
                    help="comma-separated tensor sizes in bytes (multiples of 4)")
    ap.add_argument("--count", type=int, default=10, help="tensors per size")
    ap.add_argument("--fabrics", default="", help="comma-separated (default: every viable one)")
    args = ap.parse_args(argv)
    sizes = [int(s) for s in args.sizes.split(",") if s]
    fabrics = [f for f in args.fabrics.split(",") if f] or viable_fabrics()
    secret = os.urandom(32)
    print(f"rdmadev demo: {len(sizes)} sizes x {args.count} float32 tensors, sender -> receiver "
          f"process on this host, 2-slot ring, every element checked")
    print("(time per tensor includes numpy filling it; benchmarks/fabric_bench.py measures the fabrics)")
    print(f"{'fabric':<7}{'bytes':>12}{'tensors':>9}{'ms/tensor':>11}  result")
    failures = 0
    for fabric in fabrics:
        proc, conn = pair.spawn(_receiver, fabric, secret, sizes, args.count)
        dom = open_domain("demo:sender", Config(fabric=fabric, secret=secret))
        try:
            for size in sizes:
                tx = pair.ring_sender(dom, conn, 2, size, fabric, proc=proc)
                src = dom.allocate(size, label="src")
                view = np.frombuffer(src, np.uint8)
                t0 = time.perf_counter()
                for i in range(args.count):
                    view[:] = _pattern(size, tx.sent + 1)
                    tx.send(src, 0, size, timeout=60)
                bad = pair.recv(conn, proc=proc)
                dt = (time.perf_counter() - t0) / args.count
                failures += bad
                print(f"{fabric:<7}{size:>12}{args.count:>9}{dt * 1e3:>11.3f}"
                      f"  {'ok' if not bad else f'{bad} WRONG'}")
                del view
                src.close()
        finally:
            pair.stop(proc, conn)
            dom.close()
    print("all tensors arrived intact" if not failures else f"{failures} tensors were WRONG")
    return 1 if failures else 0
