"""A tensor larger than its channel's slots, through TF's RdmadevSend/RdmadevRecv: staged (the
sender copies it into its stage, the receiver reads it from there in one go) against chunks
(slot-sized pieces through the ring, each waiting for a credit), alternating trial by trial in
the same run.

Each fabric gets one receiving domain and two sending ones, one that always stages
(RDMADEV_STAGE_BELOW_SLOT_BYTES above every slot) and one that never does (0). Their channels
are dynamic, with 2 slots of each `--slots` size (64 KiB; 1 MiB, the default
RDMADEV_DYNAMIC_CAPACITY; 4 MiB, the largest slots growth gives a channel), and carry tensors
of each `--sizes` size larger than the slot. A trial sends `--count` tensors from a thread and
receives them here; each cell is the median over trials, with the range.

    python benchmarks/staged.py                      # shm and tcp, ~3 min
    python benchmarks/staged.py --fabrics shm --slots 4M --sizes 64 --trials 9
"""
import argparse
import dataclasses
import os
import statistics
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

MIB = 1 << 20
#: Seconds one trial may take before the benchmark gives up (a loaded 2-core box, 128 MiB x count).
TRIAL_TIMEOUT_S = 300


def _mib(text):
    """'64K' / '4M' / '8' (MiB) as bytes."""
    unit = {"K": 1 << 10, "M": MIB}.get(text[-1:].upper())
    return int(float(text[:-1]) * unit) if unit else int(float(text) * MIB)


def _trial(key, x, count):
    """Seconds to move `count` tensors `x` through channel `key` (sent from a thread)."""
    from rdmadev.tf.startup import import_tensorflow
    tf = import_tensorflow()  # without TF's start-up lines
    from rdmadev.tf import ops
    errors = []

    def send():
        try:
            for _ in range(count):
                ops.send(x, key, timeout_s=TRIAL_TIMEOUT_S)
        except Exception as e:  # reported below
            errors.append(e)

    t0 = time.perf_counter()
    sender = threading.Thread(target=send, daemon=True)
    sender.start()
    for _ in range(count):
        y = ops.recv(tf.float32, [None], key, timeout_s=TRIAL_TIMEOUT_S)
    sender.join(TRIAL_TIMEOUT_S)
    elapsed = time.perf_counter() - t0
    if errors or sender.is_alive():
        raise SystemExit(f"channel {key}: the sender failed: {errors or 'still running'}")
    if y.shape != x.shape:
        raise SystemExit(f"channel {key}: received {y.shape}, sent {x.shape}")
    return elapsed


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--fabrics", default="shm,tcp")
    ap.add_argument("--slots", default="64K,1M,4M", help="slot payloads (K/M suffix), comma-separated")
    ap.add_argument("--sizes", default="1,8,32,128",
                    help="tensor sizes in MiB, comma-separated (those not above a slot are skipped)")
    ap.add_argument("--trials", type=int, default=5)
    ap.add_argument("--count", type=int, default=4, help="tensors per trial")
    args = ap.parse_args()

    import numpy as np
    from rdmadev.tf.startup import import_tensorflow
    tf = import_tensorflow()  # without TF's start-up lines
    import rdmadev
    from rdmadev import _core
    from rdmadev.testing.pair import bind_local, ring_layout

    secret = os.urandom(16)
    print(f"{'fabric':6} {'slot':>5} {'MiB':>5} {'staged ms':>22} {'chunks ms':>22} "
          f"{'staged / chunks':>22}")
    for fabric, slot in ((f, s) for f in args.fabrics.split(",") for s in args.slots.split(",")):
        cfg = rdmadev.Config(fabric=fabric, secret=secret)
        rx = rdmadev.open_domain("rx:0", cfg)
        staging = rdmadev.open_domain("tx:0", dataclasses.replace(cfg, stage_below_slot_bytes=1 << 40))
        chunking = rdmadev.open_domain("tx:1", dataclasses.replace(cfg, stage_below_slot_bytes=0))
        keys = {"staged": f"bench-staged-{fabric}", "chunks": f"bench-chunks-{fabric}"}
        layout = ring_layout(2, _mib(slot), rank=1)  # a dynamic channel's two slots
        bind_local(staging, rx, keys["staged"], layout)
        bind_local(chunking, rx, keys["chunks"], layout)
        try:
            for mib in (float(s) for s in args.sizes.split(",")):
                if mib * MIB <= _mib(slot):
                    continue
                x = tf.constant(np.random.default_rng(int(mib)).random(int(mib * MIB) // 4, np.float32))
                before = _core.transfer_counts()["staged"]
                for key in keys.values():  # warm-up: the stage is registered here
                    _trial(key, x, 1)
                ms = {path: [] for path in keys}
                for _ in range(args.trials):
                    for path, key in keys.items():
                        ms[path].append(_trial(key, x, args.count) / args.count * 1e3)
                staged = _core.transfer_counts()["staged"] - before
                if staged != 1 + args.trials * args.count:
                    raise SystemExit(f"{staged} tensors went staged, expected "
                                     f"{1 + args.trials * args.count}")
                ratio = [s / c for s, c in zip(ms["staged"], ms["chunks"])]

                def cell(v, fmt):
                    return f"{statistics.median(v):{fmt}} [{min(v):{fmt}}-{max(v):{fmt}}]"
                print(f"{fabric:6} {slot:>5} {mib:>5g} {cell(ms['staged'], '.1f'):>22} "
                      f"{cell(ms['chunks'], '.1f'):>22} {cell(ratio, '.2f'):>22}", flush=True)
        finally:
            for key in keys.values():
                _core.unbind_channel(key)
            for d in (staging, chunking, rx):
                d.close()


if __name__ == "__main__":
    main()
