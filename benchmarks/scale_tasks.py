"""benchmarks/scale.py's tasks: how it starts one (`scale.py --task`, tf.distribute.Server with
the protocol, as a user's launcher does) and what it reads of each from /proc, the same way for
every protocol."""
import collections
import json
import os
import re
import sys

#: The script a task runs: scale.py itself, with --task.
SCALE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "scale.py")


def serve_task(protocol, job, index, spec_json):
    """A task as a user's launcher starts it: tf.distribute.Server with the protocol."""
    import tensorflow as tf
    server = tf.distribute.Server(tf.train.ClusterSpec(json.loads(spec_json)), job_name=job,
                                  task_index=int(index), protocol=protocol, start=True)
    print("READY", server.target, flush=True)
    server.join()


def probe(pid):
    """What process `pid` holds now, read from /proc the same way for every protocol.

    Returns:
        {"threads", "thread_names" (comm, digits dropped: count), "fds", "sockets",
         "memfds" (its open rdmadev memfds: one per chunk its regions are placed in),
         "held_bytes" (their sizes), "maps", "memfd_maps" (mappings of rdmadev
         memfds, its own and peers'), "rss_bytes", "pss_bytes" (its share of pages shared
         with other processes: TF's libraries), "anon_bytes" (its own heap)}.
    """
    base = f"/proc/{pid}"
    names = collections.Counter()
    for tid in os.listdir(f"{base}/task"):
        try:
            with open(f"{base}/task/{tid}/comm") as f:
                names[re.sub(r"\d+", "#", f.read().strip())] += 1
        except OSError:  # the thread ended meanwhile
            pass
    fds = sockets = memfds = held = 0
    kinds = collections.Counter()
    for fd in os.listdir(f"{base}/fd"):
        path = f"{base}/fd/{fd}"
        try:
            link = os.readlink(path)
            fds += 1
            kinds[fd_kind(link)] += 1
            if link.startswith("socket:"):
                sockets += 1
            elif link.startswith("/memfd:rdmadev:"):
                memfds += 1
                held += os.stat(path).st_size
        except OSError:  # closed meanwhile
            pass
    with open(f"{base}/maps") as f:
        maps = f.read().splitlines()
    with open(f"{base}/smaps_rollup") as f:
        kb = {l.split(":")[0]: int(l.split()[1]) * 1024 for l in f if l.endswith("kB\n")}
    return {"threads": sum(names.values()), "thread_names": dict(sorted(names.items())),
            "fds": fds, "fd_kinds": dict(sorted(kinds.items())), "sockets": sockets,
            "memfds": memfds, "held_bytes": held,
            "maps": len(maps), "memfd_maps": sum("/memfd:rdmadev:" in l for l in maps),
            "rss_bytes": kb["Rss"], "pss_bytes": kb["Pss"], "anon_bytes": kb["Anonymous"]}


def cpu_seconds(pids):
    """CPU seconds (user + system) that the processes `pids` ({task: pid}) and this one (the
    coordinator, "coordinator") have used so far, from /proc/<pid>/stat; a process gone reads
    as 0."""
    tick = os.sysconf("SC_CLK_TCK")
    used = {}
    for task, pid in {**pids, "coordinator": os.getpid()}.items():
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()  # after the command's name
            used[task] = (int(fields[11]) + int(fields[12])) / tick  # utime, stime
        except OSError:
            used[task] = 0.0
    return used


def cpu_used(before, after):
    """What the processes used between two cpu_seconds readings: {"ps", "workers" (summed),
    "coordinator"} in seconds."""
    spent = {t: after[t] - before[t] for t in before}
    return {"ps": sum(v for t, v in spent.items() if t.startswith("ps:")),
            "workers": sum(v for t, v in spent.items() if t.startswith("worker:")),
            "coordinator": spent["coordinator"]}


def fd_kind(link):
    """What a descriptor is, from its /proc link: "socket", "pipe", "memfd:rdmadev:credit"
    (a sending pair's credit region, rdmadev/cluster/channels.py attach_senders),
    "memfd:rdmadev:ring" (a receiving pair's region, open_pair), another "memfd",
    "anon_inode:[pidfd]" (and the like), or "file"."""
    link = link.removesuffix(" (deleted)")
    if link.startswith(("socket:", "pipe:")):
        return link.split(":")[0]
    if link.startswith("/memfd:rdmadev:"):
        return "memfd:rdmadev:" + ("credit" if "/credit<-" in link else "ring")
    if link.startswith("/memfd:"):
        return "memfd"
    return link if link.startswith("anon_inode:") else "file"


def task_launcher(protocol):
    def launch(job, index, spec_json):
        return [sys.executable, SCALE, "--task", protocol, job, str(index),
                spec_json]
    return launch


#: Seconds between two samples of every task's thread count during the first round: a
#: transient thread lives at least a request's duration, and one sweep of 32 tasks' /proc
#: takes ~1 ms.
PEAK_SAMPLE_S = 0.02


class PeakThreads:
    """The most threads each process had while the block ran, sampled every PEAK_SAMPLE_S on
    a thread of its own (transient threads: rdmadev's event loop runs blocking setup work
    on threads it ends after 5 s idle). ``peaks``: {task: threads}."""

    def __init__(self, pids):
        import threading
        self.pids, self.peaks = pids, {t: 0 for t in pids}
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True, name="scale-peak-threads")

    def _run(self):
        while True:
            for task, pid in self.pids.items():
                try:
                    self.peaks[task] = max(self.peaks[task], len(os.listdir(f"/proc/{pid}/task")))
                except OSError:
                    pass
            if self.stop.wait(PEAK_SAMPLE_S):
                return

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.stop.set()
        self.thread.join()
        return False
