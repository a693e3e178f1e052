"""perftest (ib_write_bw / ib_write_lat) on the RDMA device rdmadev's verbs fabric would
use: the hardware baseline fabric_bench.py measures in the same run (--perftest).

Each call starts the server and the client of one perftest tool on this host (loopback
through the device, like fabric_bench's two processes), parses the client's result line and
returns GB/s (10^9 bytes per second) or one-way microseconds.

Example:
    >>> dev, gid = perftest.device()
    >>> perftest.write_bw(1 << 20, 200, dev, gid)
"""
import os
import shutil
import subprocess
import time

from rdmadev.cluster import facts

__all__ = ["available", "device", "write_bw", "write_lat"]

# ib_write_bw runs with --report_gbits: its bandwidth columns are 10^9 bits per second.
BITS_PER_BYTE = 8
# The server needs a moment to listen (about 1-2 s under emulation): the client retries.
CONNECT_ATTEMPTS = 20
RETRY_PAUSE_S = 0.5
# Bound on one perftest run (server and client).
RUN_TIMEOUT_S = 300
# perftest refuses fewer iterations than this.
MIN_ITERS = 5
# perftest's default TCP port for its own connection setup; runs are sequential.
PORT = 18515


def available():
    return shutil.which("ib_write_bw") is not None and shutil.which("ib_write_lat") is not None


def device():
    """(device, GID index) as rdmadev chooses them: RDMADEV_DEVICE / RDMADEV_GID_INDEX, else
    the first ACTIVE port's first RoCE v2 GID holding an IPv4 address (else index 0)."""
    want = os.environ.get("RDMADEV_DEVICE", "")
    for p in facts.rdma_ports():
        if (want and p["device"] != want) or "ACTIVE" not in (p["state"] or ""):
            continue
        if os.environ.get("RDMADEV_GID_INDEX"):
            return p["device"], int(os.environ["RDMADEV_GID_INDEX"])
        for g in p["gids"]:
            if "RoCE v2, IPv4" in g["kind"]:
                return p["device"], g["index"]
        return p["device"], 0
    raise RuntimeError("no ACTIVE RDMA port for perftest")


def _pin(cpu):
    """A preexec_fn pinning the child to `cpu` (when this machine has it)."""
    def pin():
        if (os.cpu_count() or 1) > cpu:
            os.sched_setaffinity(0, {cpu})
    return pin


def _run(tool, size, iters, dev, gid, extra=()):
    args = [tool, "-d", dev, "-x", str(gid), "-F", "-s", str(size), "-n", str(max(MIN_ITERS, iters)),
            "-p", str(PORT), *extra]
    # Placed like fabric_bench's own two processes: server (the far side) on CPU 1, client on 0.
    server = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                              preexec_fn=_pin(1))
    try:
        out = ""
        for _ in range(CONNECT_ATTEMPTS):
            time.sleep(RETRY_PAUSE_S)
            client = subprocess.run(args + ["127.0.0.1"], capture_output=True, text=True,
                                    timeout=RUN_TIMEOUT_S, preexec_fn=_pin(0))
            out = client.stdout + client.stderr
            if client.returncode == 0:
                server.communicate(timeout=RUN_TIMEOUT_S)
                return out
            if "Couldn't connect" not in out and "Unable to open" not in out:
                break
        raise RuntimeError(f"{tool} failed:\n{out}")
    finally:
        if server.poll() is None:
            server.kill()
            server.wait()


def _result_row(out, size):
    for line in out.splitlines():
        cols = line.split()
        if len(cols) > 3 and cols[0] == str(size) and cols[1].isdigit():
            return [float(c) for c in cols[2:]]
    raise RuntimeError(f"no result row for {size} B in:\n{out}")


def write_bw(size, iters, dev, gid):
    """ib_write_bw average bandwidth in GB/s."""
    row = _result_row(_run("ib_write_bw", size, iters, dev, gid, ["--report_gbits"]), size)
    return row[1] / BITS_PER_BYTE  # BW peak, BW average (Gb/s), MsgRate


def write_lat(size, iters, dev, gid):
    """ib_write_lat typical one-way latency in microseconds."""
    out = _run("ib_write_lat", size, iters, dev, gid)
    row = _result_row(out, size)
    return row[2]  # t_min, t_max, t_typical, t_avg, ...
