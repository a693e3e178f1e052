"""Faults injected at a random point of a running job, through rdmadev and, under
RDMADEV_CHAOS_FULL=1, also on TF's own gRPC path (the same function, not optimized) on the
same cluster in the same run, which gives docs/faults/faults.md's comparison column. Two jobs:
an in-graph step moving 1 MiB each way between the ps and each of 2 workers
(chaos_driver.py), and ParameterServerStrategy's ClusterCoordinator scheduling a step that
moves as much on 2 workers (pss_chaos_driver.py).

- in-graph: kill -9 of the ps, a worker, or the coordinator; SIGSTOP then SIGCONT of the ps or
  the coordinator (loopback, shm); the ps's link down then up, 20 % packet loss on it, a
  worker's link down then up, and the coordinator cut off (network namespaces, tcp);
- PSS: kill -9 of a worker (TF's worker failure: no error, its closure run again at most once,
  training goes on) or of the ps (TF's ps failure, raised to the user), and a worker stopped
  (nothing fails, nothing runs again) (loopback, shm).

For each: when the coordinator's call failed (if it did) and whether its error names the
failed task; for rdmadev, when the surviving tasks knew (a silent task: their heartbeats,
`silent_peers`); that nothing hangs; that every step the faulted job finished is exact (each
applied once, before the fault and after the task came back); that the job runs again, with
exact numbers, once the task is back; and that no channel, region, registered byte, memfd
mapping, fd or thread is left over on any task. Bounds are asserted for rdmadev only; gRPC's
figures are reported.

TF itself waits for every component of a call: while a task is stopped or cut off, the
coordinator's call returns only once it is back, on either path. What rdmadev bounds is how
long the surviving tasks wait on it (RDMADEV_LIVENESS_S), and it names the task.
"""
import json
import os
import signal
import subprocess
import sys
import threading
import time

import pytest

import netns
from graph_pass.devices import task_name
from rdmadev import Config
from rdmadev.cluster import liveness, runtime
from rdmadev.testing import launch

pytestmark = [pytest.mark.chaos, pytest.mark.tf]

HERE = os.path.dirname(os.path.abspath(__file__))
SECRET = "rdmadev-chaos-secret"
#: RDMADEV_LIVENESS_S of the tier: short, so that a case takes seconds.
LIVENESS_S = 2.0
#: RDMADEV_DEADLINE_S of the tier.
DEADLINE_S = 120.0
ENV = {"RDMADEV_SECRET": SECRET, "RDMADEV_LIVENESS_S": str(LIVENESS_S),
       "RDMADEV_DEADLINE_S": str(int(DEADLINE_S))}
#: A silent task is known within liveness.py's bound, plus slack for a loaded 2-core box.
SILENT_BOUND_S = LIVENESS_S * (1 + 2 / liveness.PINGS_PER_LIVENESS) + 3.0
#: A killed task is known at once (its connections close, its pidfd fires: 0.03-0.08 s
#: measured, reported in the table); what bounds it, should those signals be missed, is the
#: heartbeats, so its bound is a silent task's. A fixed 2 s failed one CI run in three on
#: this loaded 2-core machine.
KILL_BOUND_S = SILENT_BOUND_S
#: How long a task stays stopped or cut off: well past SILENT_BOUND_S.
OUT_S = SILENT_BOUND_S + 3.0
#: A driver that neither fails nor steps for this long is hung (the tier's own no-hang bound).
HANG_S = 90.0
#: Steps of the recovery run.
RECOVERY_STEPS = 5
#: Counters that must be back exactly where they were once the job's functions are released.
#: (threads: rdmadev's lasting Python threads: each task's event loop, which serves its control
#: connections and heartbeats, and watchers; the loop's workers come and go with work.)
HELD = ("channels", "regions", "registered_bytes", "memfd_maps", "threads")
#: How long a baseline waits for released regions' pages to leave quarantine (2 s on shm,
#: 10 s on verbs: _native/core/arena.h), with room for a loaded host.
QUARANTINE_WAIT_S = 30
#: Counts a task may end a case above where it began: TF's own gRPC connections come and go
#: with its peers (a restarted peer, a coordinator that left); a task keeps one control link
#: per peer task (links.py), two for a moment while a restarted peer's replaces its old one,
#: and serves a connection per coordinator; a leak per case
#: or per step would pass this within a few cases (tests/test_soak_bench.py: per step). TF's
#: native threads are not judged: a task keeps each coordinator's eager context (and its
#: threads) after the coordinator is gone, ~14 threads per coordinator here, rdmadev or not.
SLACK = {"fds": 2, "served": 2}
PS, W0 = task_name("ps", 0), task_name("worker", 0)
TARGETS = {"ps": ("ps", 0), "worker": ("worker", 0)}
#: The paths each case runs on. TF's own gRPC path (the same function, not optimized) tests
#: TF, not rdmadev: it gives docs/faults/faults.md's comparison column, under RDMADEV_CHAOS_FULL=1
#: (`RDMADEV_CHAOS_FULL=1 pytest -m chaos tests/chaos`).
MODES = ["grpc", "rdmadev"] if os.environ.get("RDMADEV_CHAOS_FULL") == "1" else ["rdmadev"]


#: The jobs a case runs: the in-graph step (chaos_driver.py) or ParameterServerStrategy
#: (pss_chaos_driver.py), each a script speaking the same lines.
SCRIPTS = {"in-graph": "chaos_driver.py", "pss": "pss_chaos_driver.py"}


class Driver:
    """A job's driver script (SCRIPTS) as a subprocess; its lines collected by a thread."""

    def __init__(self, cluster, mode, steps=0, job="in-graph"):
        self.lines = []
        bridge = getattr(cluster, "bridge_address", None)  # tasks in namespaces reach us there
        client = [f"{bridge}:{launch.free_ports(1)[0]}"] if bridge else []
        self.proc = subprocess.Popen(
            [sys.executable, os.path.join(HERE, SCRIPTS[job]), json.dumps(cluster.spec), mode,
             str(steps), *client], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
            env={**os.environ, **ENV, "TF_CPP_MIN_LOG_LEVEL": "2"})
        self.reader = threading.Thread(target=lambda: self.lines.extend(self.proc.stdout), daemon=True)
        self.reader.start()

    def steps(self):
        return [l.split() for l in list(self.lines) if l.startswith("STEP ")]

    def error(self):
        """(time.monotonic() of the failure, {"type", "message"}) or None."""
        for l in list(self.lines):
            if l.startswith("ERROR "):
                _, at, body = l.split(" ", 2)
                return float(at), json.loads(body)
        return None

    def wait(self, predicate, timeout):
        deadline = time.monotonic() + timeout
        while not predicate() and time.monotonic() < deadline and self.proc.poll() is None:
            time.sleep(0.02)
        self.reader.join(0.5 if self.proc.poll() is not None else 0)
        return predicate()

    def exact(self):
        """Whether it stepped, and every step it finished left w equal to its step count."""
        steps = self.steps()
        return bool(steps) and all(s[3] == "True" for s in steps)

    def stepped_since(self, t):
        return any(float(s[2]) > t for s in self.steps())

    def extra(self):
        """PSS: the steps applied twice (ClusterCoordinator ran them again), once it ended."""
        return next((int(l.split()[1]) for l in list(self.lines) if l.startswith("EXTRA ")), None)

    def interrupt(self):
        """SIGINT: the driver exits cleanly (its functions released); kill -9 past HANG_S."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
        try:
            self.proc.wait(HANG_S)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(30)
            self.reader.join(5)
            raise AssertionError("the driver did not exit within HANG_S of SIGINT: "
                                 + self.output())
        self.reader.join(5)

    def output(self):
        return "".join(self.lines)[-4000:]


def _held(rt, cluster):
    out = {}
    for job, index, _ in cluster.tasks():
        t = task_name(job, index)
        c = rt.call(t, {"op": "counters"})
        served = c["control_connections"]["served"]
        out[t] = {**{k: c[k] for k in HELD if k != "threads"}, "threads": c["py_threads"],
                  "served": served, "fds": c["fds"], "peers": c["peers"],
                  "thread_names": c["thread_names"]}
    return out


def _settled(rt, cluster, want, timeout=60.0):
    """(`_held` once it equals `want` on the tasks `want` has (releases and sweeps are
    asynchronous), or the last reading after `timeout`; seconds it took, None if it never
    did). Fds and threads: within SLACK."""
    def same(now):
        return all(now[t][k] == want[t][k] for t in want for k in HELD) and \
            all(now[t][k] <= want[t][k] + slack for t in want for k, slack in SLACK.items())
    start = time.monotonic()
    now = _held(rt, cluster)
    while not same(now) and time.monotonic() < start + timeout:
        time.sleep(0.25)
        now = _held(rt, cluster)
    return now, (time.monotonic() - start if same(now) else None)


def _recovery_run(cluster, mode, job="in-graph", within=HANG_S * 2):
    """A run of RECOVERY_STEPS steps (within `within` s): whether all of them were exact."""
    d = Driver(cluster, mode, RECOVERY_STEPS, job)
    assert d.wait(lambda: "DONE\n" in d.lines, within), d.output()
    d.proc.wait(60)
    return d.exact() and len(d.steps()) == RECOVERY_STEPS


def _warm(cluster, rt, mode, job):
    """One clean run, so the baseline has what stays between jobs (endpoints, heartbeats),
    read once no released region's pages are quarantined for late writes (their chunks go
    then: a baseline holding one would never be met again)."""
    assert _recovery_run(cluster, mode, job)
    time.sleep(2 * LIVENESS_S)  # the heartbeats' connections open within an interval
    deadline = time.monotonic() + QUARANTINE_WAIT_S
    while time.monotonic() < deadline and any(
            rt.call(task_name(job_, i), {"op": "counters"})["quarantined_bytes"]
            for job_, i, _ in cluster.tasks()):
        time.sleep(0.25)
    return _settled(rt, cluster, _held(rt, cluster), timeout=0)[0]


def _silent_seen(rt, survivors, failed, since, timeout):
    """Seconds from `since` until every surviving task lists `failed` as silent, or None."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if all(failed in rt.call(t, {"op": "counters"})["silent_peers"] for t in survivors):
            return time.monotonic() - since
        time.sleep(0.05)
    return None


def _record(results, job, fault, target, fabric, mode, error, fault_at, survivors_s, named,
            recovered, settled_s, note=""):
    coordinator = (f"{error[0] - fault_at:.2f} s" if error else "no error") + note
    results.append({"job": job, "fault": fault, "target": target, "fabric": fabric, "mode": mode,
                    "coordinator": coordinator, "survivors_s": survivors_s, "named": named,
                    "recovered": recovered, "settled_s": settled_s})


#: (cluster, job) -> what every task held after the last case's recovery run, which settled
#: (the next case's baseline: no warm-up run needed).
_baselines = {}


def _run_case(cluster, rt, mode, fault, target, rng, results, fabric, cut=None, job="in-graph"):
    """One fault on one path of one job; asserts the rdmadev bounds; returns nothing."""
    pss = job == "pss"
    task_job, index = TARGETS.get(target, (None, None))
    failed = task_name(task_job, index) if task_job else None
    # rdmadev: a clean run first, so that what stays between jobs (endpoints, heartbeats) is
    # in the baseline (the last case's recovery run of this job is one, unless it restarted a
    # task, whose heartbeats may still be connecting); gRPC's path changes none of these.
    before = _baselines.pop((id(cluster), job), None) if mode == "rdmadev" else None
    before = before or (_warm(cluster, rt, mode, job) if mode == "rdmadev" else _held(rt, cluster))
    d = Driver(cluster, mode, job=job)
    assert d.wait(lambda: len(d.steps()) >= 3, HANG_S * 2), d.output()
    time.sleep(rng.uniform(0.0, 0.3))  # steps run back to back: a random point of one
    fault_at = time.monotonic()
    # The tasks that wait on the failed one: those with channels (endpoints) to it.
    survivors = [t for t, held in before.items() if failed in held["peers"]]
    survivors_s, note = None, ""
    if fault == "kill -9":
        if target == "coordinator":
            d.proc.kill()
        else:
            cluster.kill(task_job, index)
        if pss and target == "worker":
            # a worker failure: ClusterCoordinator runs its closures again on the other worker
            # and waits for it; restarted, it takes steps again
            assert d.wait(lambda: d.error() is not None or d.stepped_since(fault_at), HANG_S), \
                "hang: " + d.output()
            cluster.restart(task_job, index)
            resumed = time.monotonic()
            assert d.wait(lambda: d.error() is not None or d.stepped_since(resumed), HANG_S), \
                "hang: " + d.output()
        elif target != "coordinator":
            assert d.wait(lambda: d.error() is not None, HANG_S), "hang: " + d.output()
    else:  # a task out for OUT_S: stopped, cut off, or losing packets
        pid = d.proc.pid if target == "coordinator" else cluster.pid(task_job, index)
        out, back = {
            "SIGSTOP": (lambda: os.kill(pid, signal.SIGSTOP), lambda: os.kill(pid, signal.SIGCONT)),
            "link down": (lambda: cut.link(task_job, index, up=False),
                          lambda: cut.link(task_job, index, up=True)),
            "20% loss": (lambda: cut.loss(task_job, index, 20), lambda: cut.loss(task_job, index, 0)),
            "cut off": (lambda: cut.root(up=False), lambda: cut.root(up=True)),
        }[fault]
        out()
        try:
            if mode == "rdmadev" and fault != "20% loss" and failed:
                survivors_s = _silent_seen(rt, survivors, failed, fault_at, OUT_S)
            time.sleep(max(0.0, OUT_S - (time.monotonic() - fault_at)))
        finally:
            back()
        resumed = time.monotonic()
        note = f" (back at {resumed - fault_at:.1f} s)"
        assert d.wait(lambda: d.error() is not None or d.stepped_since(resumed), HANG_S), \
            "hang: " + d.output()
    error = d.error()
    if not (fault == "kill -9" and target == "coordinator"):  # else it is gone already
        d.interrupt()
    restarted = fault == "kill -9" and target != "coordinator"
    if restarted and not cluster.running(task_job, index):
        cluster.restart(task_job, index)
    recovered = _recovery_run(cluster, mode, job)
    named = bool(error and failed and failed in error[1]["message"])
    # A restarted task starts afresh: the others must be where they were.
    kept = {t: v for t, v in before.items() if not (restarted and t == failed)}
    after, settled_s = _settled(rt, cluster, kept)
    _record(results, job, fault, target, fabric, mode, error, fault_at, survivors_s, named,
            recovered, settled_s, note)
    # What every case must satisfy, on both paths: no hang (above), every step the faulted job
    # finished applied exactly once (in-graph: w == its step count, none lost or applied twice,
    # before the fault or after the task came back; PSS: each at least once, and w agreeing),
    # and the job runs again.
    assert d.exact(), d.output()
    assert recovered, d.output()
    if mode != "rdmadev":
        return
    # rdmadev's bounds.
    if pss and fault == "kill -9" and target == "worker":
        # TF's worker failure: no error, the closure it had (one at a time) run again
        assert error is None, error
        assert d.extra() is not None and d.extra() <= 1, d.output()
    elif fault == "kill -9" and target != "coordinator":
        assert error is not None and error[0] - fault_at <= KILL_BOUND_S, (error, fault_at)
        assert named, error
        if pss:  # TF's ps failure, raised to the user, who restores the variables
            assert error[1]["ps_failure"] and not error[1]["worker_failure"], error
    if target == "coordinator" and fault in ("SIGSTOP", "cut off"):
        # No task waits on the coordinator: the step under way finishes, the next waits for
        # the coordinator to send it, and the job goes on once it runs again.
        assert error is None, error
    elif fault in ("SIGSTOP", "link down"):
        assert survivors and survivors_s is not None and survivors_s <= SILENT_BOUND_S, \
            (survivors, survivors_s)
        # As on gRPC: a task that is out fails nothing; the step under way finishes once it is
        # back (liveness.py), under ClusterCoordinator with no closure run again
        assert error is None, error
        if pss:
            assert d.extra() == 0, d.output()
    for t in kept:  # nothing left over
        for k in HELD:
            assert after[t][k] == before[t][k], _left_over(t, k, before[t], after[t])
        for k, slack in SLACK.items():
            assert after[t][k] <= before[t][k] + slack, _left_over(t, k, before[t], after[t])
    _baselines[(id(cluster), job)] = None if restarted else _held(rt, cluster)


def _left_over(task, counter, before, after):
    """What a task holds that it did not before the case: the counter, and its threads."""
    names = {n: (before["thread_names"].get(n, 0), after["thread_names"].get(n, 0))
             for n in before["thread_names"].keys() | after["thread_names"].keys()}
    return (f"{task} {counter}: {before[counter]} -> {after[counter]}; threads whose count "
            f"changed: {({n: c for n, c in names.items() if c[0] != c[1]})}")


@pytest.fixture(scope="module")
def loopback():
    with launch.Cluster(num_ps=1, num_workers=2, env=ENV) as cluster:
        rt = runtime.Runtime(cluster.spec, config=Config(secret=SECRET.encode()))
        try:
            yield cluster, rt
        finally:
            rt.close()


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("fault,target", [("kill -9", "ps"), ("kill -9", "worker"),
                                          ("kill -9", "coordinator"), ("SIGSTOP", "ps"),
                                          ("SIGSTOP", "coordinator")])
def test_loopback(loopback, mode, fault, target, rng, results):
    cluster, rt = loopback
    _run_case(cluster, rt, mode, fault, target, rng, results, "shm")


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("fault,target", [("kill -9", "worker"), ("kill -9", "ps"),
                                          ("SIGSTOP", "worker")])
def test_pss(loopback, mode, fault, target, rng, results):
    """ParameterServerStrategy under ClusterCoordinator: a lost worker is a worker failure
    (no error, its closure run again), a lost ps TF's ps failure, a stopped worker nothing."""
    cluster, rt = loopback
    _run_case(cluster, rt, mode, fault, target, rng, results, "shm", job="pss")


class _NetnsCut:
    """Cuts a task of a NetnsCluster off (its link to the bridge down) or drops a share of
    the packets it sends (nftables in its namespace: the kernel here has no netem), or cuts
    off the root namespace, where the coordinator runs (root)."""

    def __init__(self, cluster):
        self.cluster = cluster

    def _ns(self, job, index):
        return self.cluster._ns(job, index)

    def link(self, job, index, up):
        n = [(j, i) for j, i, _ in self.cluster.tasks()].index((job, index))
        subprocess.run(["ip", "link", "set", f"{self.cluster.tag}v{n}", "up" if up else "down"],
                       check=True, capture_output=True, timeout=30)

    def loss(self, job, index, percent):
        ns = ["ip", "netns", "exec", self._ns(job, index), "nft"]
        subprocess.run(ns + ["delete", "table", "inet", "chaos"], capture_output=True, timeout=30)
        if percent:
            rules = ("add table inet chaos\n"
                     "add chain inet chaos out { type filter hook output priority 0; }\n"
                     f"add rule inet chaos out numgen random mod 100 < {percent} drop\n")
            subprocess.run(ns + ["-f", "-"], input=rules, text=True, check=True,
                           capture_output=True, timeout=30)

    def root(self, up):
        """Drops every packet between the root namespace (the coordinator, at the bridge's
        address) and the tasks, both ways; the tasks still reach each other through the
        bridge, whose forwarding these hooks do not see."""
        table, address = f"rdmadev_chaos_{os.getpid()}", self.cluster.bridge_address
        subprocess.run(["nft", "delete", "table", "inet", table], capture_output=True, timeout=30)
        if not up:
            rules = (f"add table inet {table}\n"
                     f"add chain inet {table} out {{ type filter hook output priority 0; }}\n"
                     f"add chain inet {table} in {{ type filter hook input priority 0; }}\n"
                     f"add rule inet {table} out ip saddr {address} ip daddr != {address} drop\n"
                     f"add rule inet {table} in ip daddr {address} ip saddr != {address} drop\n")
            subprocess.run(["nft", "-f", "-"], input=rules, text=True, check=True,
                           capture_output=True, timeout=30)


@pytest.fixture(scope="module")
def namespaces():
    netns.require("nft")
    from cnn_netns import NetnsCluster
    with NetnsCluster(1, 2, env=ENV) as cluster:
        rt = runtime.Runtime(cluster.spec, config=Config(secret=SECRET.encode()))
        try:
            yield cluster, rt
        finally:
            rt.close()


@pytest.mark.netns
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("fault,target", [("link down", "ps"), ("20% loss", "ps"),
                                          ("link down", "worker"), ("cut off", "coordinator")])
def test_namespaces(namespaces, mode, fault, target, rng, results):
    cluster, rt = namespaces
    _run_case(cluster, rt, mode, fault, target, rng, results, "tcp", cut=_NetnsCut(cluster))
