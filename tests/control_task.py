"""A cluster task with rdmadev's control plane and no TensorFlow, for channel setup tests.

    python control_task.py --cluster SPEC_JSON --job worker --task 0

It runs the real Runtime (Domain, control service, ChannelTable) and, so that
rdmadev.testing.launch sees it ready, listens on its TF port with a plain socket. Extra
control requests drive the bound channels as the TF kernels would:

    t_send {key, count, size, seed}   sends `count` patterned transfers on `key`
    t_recv {key, count, seed}         receives `count`; returns the sequence numbers that were wrong
    bound  {}                         rdmadev._core.bound_channels()
"""
import argparse
import socket
import sys

import numpy as np

from rdmadev import _core
from rdmadev.cluster import runtime
from rdmadev.cluster.spec import parse_cluster, split_address


def pattern(size, seed):
    """`size` bytes that differ for every (size, seed)."""
    return np.random.default_rng(seed).integers(0, 256, size, dtype=np.uint8).tobytes()


def t_send(r):
    for i in range(r["count"]):
        _core.channel_send(r["key"], pattern(r["size"], r["seed"] + i), timeout=60)
    return r["count"]


def t_recv(r):
    bad = []
    for i in range(r["count"]):
        seq, data = _core.channel_recv(r["key"], timeout=60)
        if data != pattern(len(data), r["seed"] + i):
            bad.append(seq)
    return bad


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--cluster", required=True)
    ap.add_argument("--job", required=True)
    ap.add_argument("--task", type=int, required=True)
    args = ap.parse_args()
    spec = parse_cluster(args.cluster)
    runtime.register_handler("t_send", t_send)
    runtime.register_handler("t_recv", t_recv)
    runtime.register_handler("bound", lambda r: _core.bound_channels())
    # what a TF1 task's pass does for the sending halves it planned (rdmadev.tf.bridge)
    runtime.register_handler("t_want", lambda r: runtime.current().table.want_halves(r["sizes"]))
    runtime.log_to_stderr()  # as `rdmadev serve` does
    runtime.start(spec, args.job, args.task)
    host, port = split_address(spec[args.job][args.task], args.job)
    ready = socket.create_server((host, port))  # readiness for launch.Cluster
    print("CONTROL_TASK_READY", flush=True)
    while True:
        conn, _ = ready.accept()
        conn.close()


if __name__ == "__main__":
    sys.exit(main())
