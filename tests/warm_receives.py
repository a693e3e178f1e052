"""Large received tensors that are copied out of their slot, in a process of their own (TF's
CPU allocator is chosen when TF starts: TF_ENABLE_ONEDNN_OPTS=0 gives the malloc-backed one).

    python warm_receives.py FABRIC    prints RESULT {json}: per path, whether every tensor
                                      arrived as sent, whether a kept tensor stayed intact
                                      under later receives, and the "warm" counts.

Each path moves tensors of 32 MiB and more (the native ops' kWarmMinBytes) through one
channel: static (one slot), dynamic in chunks, dynamic staged.
"""
import dataclasses
import json
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402

from rdmadev.tf.startup import import_tensorflow  # noqa: E402

tf = import_tensorflow()

import rdmadev  # noqa: E402
from rdmadev import _core  # noqa: E402
from rdmadev.testing.pair import bind_local, ring_layout  # noqa: E402
from tf_steps import through  # noqa: E402  (this directory: the op tests' helpers)

MIB = 1 << 20
ROW = 64  # floats per row of the dynamic tensors
TIMEOUT_S = 120


def _tensor(mib, seed):
    rows = mib * MIB // (ROW * 4)
    return tf.random.stateless_uniform([rows, ROW], [seed, 7])


def run(path, tx, rx):
    """Receives: one kept while two more arrive, then three more each freed before the next.
    Returns what arrived and what the counts said."""
    if path == "static":
        capacity, rank, slots, sizes = 40 * MIB, None, 1, [40] * 6
    else:  # slots far smaller than the tensors: staged or in chunks, by the sender's config
        capacity, rank, slots, sizes = 256 << 10, 2, 2, [33, 40, 36, 40, 40, 33]
    key = f"warm:{path}"
    bind_local(tx, rx, key, ring_layout(slots, capacity, rank=rank), False)
    shape = [None, ROW] if rank else [40 * MIB // (ROW * 4), ROW]
    try:
        before = _core.transfer_counts()["warm"]
        sent = [_tensor(mib, i) for i, mib in enumerate(sizes)]
        kept = through(key, sent[0], tf.float32, shape, TIMEOUT_S)
        later = [through(key, x, tf.float32, shape, TIMEOUT_S) for x in sent[1:3]]
        intact = bool(np.array_equal(kept.numpy(), sent[0].numpy()))
        same = all(np.array_equal(y.numpy(), x.numpy()) for x, y in zip(sent[1:3], later))
        held = _core.transfer_counts()["warm"] - before
        del kept, later
        for x in sent[3:]:
            y = through(key, x, tf.float32, shape, TIMEOUT_S)
            same = same and bool(np.array_equal(y.numpy(), x.numpy()))
            del y
        return {"intact": intact, "same": same, "warm_while_held": held,
                "warm": _core.transfer_counts()["warm"] - before}
    finally:
        _core.unbind_channel(key)


def main(fabric):
    cfg = rdmadev.Config(fabric=fabric, secret=b"rdmadev-warm-receives-secret")
    rx = rdmadev.open_domain("rx", cfg)
    result = {}
    try:
        for path, tx_cfg in [("static", cfg), ("staged", cfg),
                             ("chunks", dataclasses.replace(cfg, stage_below_slot_bytes=4096))]:
            tx = rdmadev.open_domain(f"tx:{path}", tx_cfg)
            try:
                result[path] = run(path, tx, rx)
            finally:
                tx.close()
    finally:
        rx.close()
    print("RESULT " + json.dumps(result), flush=True)


if __name__ == "__main__":
    main(sys.argv[1])
