"""Where the time of swapped transfers goes, read from TensorFlow's profiler.

rdmadev's ops put every transfer on TF's profiler timeline (`_native/tf/kernels/trace.h`): an
``rdmadev.send`` or ``rdmadev.recv`` event per kernel execution with its channel, peer task,
bytes and chunks, and inside it the phases ``rdmadev.wait_credit``, ``rdmadev.write``,
``rdmadev.wait_data`` and ``rdmadev.copy``. They show in TensorBoard's trace viewer next to
TF's own ops; this module turns them into numbers.

    from rdmadev.tf import profile
    run = profile.capture(["127.0.0.1:2222", ...], "/tmp/trace", seconds=3, work=step)
    print(profile.table(profile.summarize(profile.read(run.run_dir), names)))

The tasks are traced through the profiler service every TF server runs on its gRPC port
(``tf.profiler.experimental.client.trace``), so nothing has to be started for it; with no
trace being taken the ops record nothing.
"""
import bisect
import collections
import glob
import os
import statistics
import threading
import time

__all__ = ["capture", "read", "matched", "notice_ns", "summarize", "table", "KINDS", "PHASES"]

#: Kernel spans and the phases inside them (trace.h names both).
KINDS = ("rdmadev.send", "rdmadev.recv")
PHASES = ("rdmadev.wait_credit", "rdmadev.write", "rdmadev.wait_data", "rdmadev.copy")

Transfer = collections.namedtuple(
    "Transfer", "task kind channel peer bytes chunks start_ns dur_ns phases")
Transfer.__doc__ = ("One kernel execution: `phases` maps a phase name (without 'rdmadev.') to "
                    "its nanoseconds in this execution.")


Capture = collections.namedtuple("Capture", "run_dir traced_from traced_until")
Capture.__doc__ = ("A trace run: its directory, and a time.perf_counter() interval during which "
                   "every task was surely being traced (empty if the call took twice `seconds`).")


def capture(addresses, logdir, seconds, work, max_calls=100000):
    """Traces the tasks at `addresses` ("host:port") for `seconds` while calling `work()` in a
    loop (at most `max_calls` times, and never past the trace); returns a Capture."""
    import tensorflow as tf

    done = threading.Event()
    failure = []

    def loop():
        try:
            for _ in range(max_calls):
                if done.is_set():
                    return
                work()
        except Exception as e:  # surfaced below: a trace of a failing step is no answer
            failure.append(e)

    before = set(glob.glob(os.path.join(logdir, "plugins", "profile", "*")))
    runner = threading.Thread(target=loop, name="rdmadev-profile-work", daemon=True)
    runner.start()
    try:
        time.sleep(min(1.0, seconds / 4))  # steps already in flight when the trace starts
        # The trace covers `seconds` somewhere between the call's start and its return (which
        # also waits for the files): only [return - seconds, start + seconds] is sure to be in.
        t0 = time.perf_counter()
        tf.profiler.experimental.client.trace(
            ",".join("grpc://" + a for a in addresses), logdir, int(seconds * 1000))
        t1 = time.perf_counter()
    finally:
        done.set()
        runner.join()
    if failure:
        raise failure[0]
    runs = sorted(set(glob.glob(os.path.join(logdir, "plugins", "profile", "*"))) - before)
    if not runs:
        raise RuntimeError(f"the profiler wrote no trace under {logdir}")
    return Capture(runs[-1], t1 - seconds, t0 + seconds)


def _stat_value(plane, stat):
    which = stat.WhichOneof("value")
    if which == "ref_value":
        return plane.stat_metadata[stat.ref_value].name
    return getattr(stat, which) if which else None


def read(run_dir):
    """The transfers in one trace run: a list of Transfer, `task` being the host:port of the
    file it came from (TF names each task's file after its address), times in ns since the
    epoch on every task (comparable across tasks of one host)."""
    from tensorflow.tsl.profiler.protobuf import xplane_pb2

    transfers = []
    for path in sorted(glob.glob(os.path.join(run_dir, "*.xplane.pb"))):
        task = os.path.basename(path)[:-len(".xplane.pb")]
        host, _, port = task.rpartition("_")
        task = f"{host}:{port}" if port.isdigit() else task
        space = xplane_pb2.XSpace()
        with open(path, "rb") as f:
            space.ParseFromString(f.read())
        # The profiler stores times relative to the task's own start of the trace, which it
        # records in its "Task Environment" plane: adding it back puts every task on one clock.
        origin = 0
        for plane in space.planes:
            for s in plane.stats:
                if plane.stat_metadata[s.metadata_id].name == "profile_start_time":
                    origin = s.uint64_value or s.int64_value
        for plane in space.planes:
            names = {k: m.name for k, m in plane.event_metadata.items()}
            for line in plane.lines:
                spans, phases = [], collections.defaultdict(list)
                for e in line.events:
                    name = names.get(e.metadata_id, "")
                    if name not in KINDS and name not in PHASES:
                        continue
                    stats = {plane.stat_metadata[s.metadata_id].name: _stat_value(plane, s)
                             for s in e.stats}
                    start = origin + line.timestamp_ns + e.offset_ps // 1000
                    dur = e.duration_ps // 1000
                    if name in KINDS:
                        spans.append((name, stats, start, dur))
                    else:
                        phases[stats.get("channel")].append((start, name, dur))
                for v in phases.values():
                    v.sort()
                for name, stats, start, dur in spans:
                    own = phases.get(stats.get("channel"), [])
                    lo = bisect.bisect_left(own, (start,))
                    hi = bisect.bisect_right(own, (start + dur, "\uffff"))
                    sums = collections.Counter()
                    for _, pname, pdur in own[lo:hi]:
                        sums[pname[len("rdmadev."):]] += pdur
                    transfers.append(Transfer(task, name[len("rdmadev."):], stats.get("channel"),
                                              stats.get("peer", ""), int(stats.get("bytes", 0)),
                                              int(stats.get("chunks", 0)), start, dur, dict(sums)))
    return transfers


def _union_ns(intervals):
    total, end = 0, None
    for s, e in sorted(intervals):
        if end is None or s > end:
            total += e - s
            end = e
        elif e > end:
            total += e - end
            end = e
    return total


def matched(transfers):
    """Each receive with the send that carried its data: {receive's index: send's index} in
    `transfers`. A receive is matched with the last send of its channel that ended before it
    did, when that send ended after the channel's previous receive (so it is this transfer's);
    the first receive of each channel in the trace has no such bound and is left out."""
    sends = collections.defaultdict(list)
    recvs = collections.defaultdict(list)
    for i, t in enumerate(transfers):
        (sends if t.kind == "send" else recvs)[t.channel].append((t.start_ns + t.dur_ns, i))
    out = {}
    for channel, rs in recvs.items():
        ss = sorted(sends.get(channel, []))
        ends = [e for e, _ in ss]
        rs.sort()
        for (prev_end, _), (end, i) in zip(rs, rs[1:]):
            j = bisect.bisect_right(ends, end) - 1
            if j >= 0 and ends[j] > prev_end:
                out[i] = ss[j][1]
    return out


def notice_ns(transfers):
    """How long each matched receive took once its data was there: from the end of its send
    (or its own start, if the data came first) to its end. This is the receiver's own cost of
    noticing and delivering a transfer (progress thread wake-up, copy). {receive's index: ns}."""
    out = {}
    for i, j in matched(transfers).items():
        r, s = transfers[i], transfers[j]
        out[i] = r.start_ns + r.dur_ns - max(s.start_ns + s.dur_ns, r.start_ns)
    return out


def summarize(transfers, names=None):
    """Per task and direction, per step: channels, bytes, and milliseconds in each phase.

    A trace starts and ends mid-step, so each channel's totals are divided by the number of
    its own executions in the trace (a channel moves one tensor per step, in one or more
    chunks) and summed over channels; `steps` is the median of those counts. `*_ms` sums over
    a task's transfers, which overlap; `busy_ms` is the wall time during which at least one of
    its kernels ran, which is at most what a step can lose to them. `names` maps "host:port"
    to a task name for display."""
    names = names or {}
    by = collections.defaultdict(lambda: collections.defaultdict(list))
    for t in transfers:
        by[(names.get(t.task, t.task), t.kind)][t.channel].append(t)
    notice = collections.defaultdict(list)
    for i, ns in notice_ns(transfers).items():
        notice[names.get(transfers[i].task, transfers[i].task)].append(ns / 1e3)
    out = []
    phases = [p[len("rdmadev."):] for p in PHASES]
    for (task, kind), channels in sorted(by.items()):
        steps = max(1, round(statistics.median(len(ts) for ts in channels.values())))

        def per_step(value):
            return sum(sum(value(t) for t in ts) / len(ts) for ts in channels.values())

        every = [t for ts in channels.values() for t in ts]
        row = {"task": task, "kind": kind, "steps": steps, "channels": len(channels),
               "bytes": per_step(lambda t: t.bytes),
               "chunks": per_step(lambda t: t.chunks),
               "kernel_ms": per_step(lambda t: t.dur_ns) / 1e6,
               "busy_ms": _union_ns((t.start_ns, t.start_ns + t.dur_ns) for t in every) / steps / 1e6}
        for p in phases:
            row[p + "_ms"] = per_step(lambda t, p=p: t.phases.get(p, 0)) / 1e6
        seen = sorted(notice[task]) if kind == "recv" else []
        row["notice_us"] = statistics.median(seen) if seen else None
        row["notice_p90_us"] = seen[len(seen) * 9 // 10] if seen else None
        out.append(row)
    return out


def table(rows):
    """The summary as a fixed-width table (milliseconds and MiB per step)."""
    head = (f"{'task':<10} {'dir':<4} {'steps':>5} {'chans':>6} {'MiB':>8} | {'kernel':>8} "
            f"{'busy':>8} | {'credit':>8} {'write':>8} | {'wait':>8} {'copy':>8} | "
            f"{'notice us':>13}")
    lines = [head, "-" * len(head)]
    for r in rows:
        notice = (f"{r['notice_us']:>6.0f} {r['notice_p90_us']:>6.0f}"
                  if r.get("notice_us") is not None else "")
        lines.append(
            f"{r['task']:<10} {r['kind']:<4} {r['steps']:>5} {r['channels']:>6} "
            f"{r['bytes'] / 2**20:>8.1f} | {r['kernel_ms']:>8.2f} {r['busy_ms']:>8.2f} | "
            f"{r['wait_credit_ms']:>8.2f} {r['write_ms']:>8.2f} | {r['wait_data_ms']:>8.2f} "
            f"{r['copy_ms']:>8.2f} | {notice:>13}")
    lines.append("per step, ms summed over a task's transfers (they overlap) except busy: wall "
                 "time with at least one kernel running; credit/write: sender; wait/copy: "
                 "receiver; notice: us from the data being there to the receive's end, median "
                 "and p90")
    return "\n".join(lines)
