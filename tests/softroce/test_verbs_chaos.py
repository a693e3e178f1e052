"""The chaos tier's faults (tests/chaos) on real verbs: rdma_rxe in the Soft-RoCE guest
(tests/softroce/run-in-vm.sh), every task's fabric forced to verbs (RDMADEV_FABRIC), the same
in-graph job (tests/chaos/chaos_driver.py: 1 MiB each way between the ps and each of 2
workers per step) faulted at a random point of a step:

- kill -9 of the ps, and of a worker: tests/chaos's own case (test_chaos._run_case) and its
  bounds. A killed task's side-channel socket closes, which a verbs wait or transfer sees
  within its liveness poll; should that be missed, its QPs stop acknowledging and a transfer
  fails after the QP's retries (verbs_qp.h: (1 + 6) x 268 ms ~= 1.9 s), and the heartbeats
  find it silent within SILENT_BOUND_S: KILL_BOUND_S bounds it, as on shm and tcp.
- link down: the netdev rxe0 sits on (a dummy interface) set down, and up again once every
  task noticed. rxe0's port goes DOWN (`rdma link`: state DOWN, physical_state DISABLED), and
  a write posted on it fails at once (IBV_WC_LOC_QP_OP_ERR, "local QP operation error").
  In the guest every task's QPs sit on that one device, so link down cuts every verbs pair at
  once, not one task's; TF's gRPC, rdmadev's control connections and heartbeats run over
  loopback and go on, so no task is silent: each task finds its endpoints broken (a failed
  completion), unbinds their halves (the table's sweep, every WATCH_INTERVAL_S), asks the
  peer (it answers: the same process) and sets the pairs up again (recovery.py), which fails
  while the port is down. The step under way fails as transient, naming a peer task, and
  the job runs again, exact, once the link is up.

Each case also runs the job again once the task or link is back (exact) and finds no
channel, region, registered byte, memfd mapping or Python thread left over on any task,
fds within tests/chaos's slack. Skipped where verbs is not viable (the host's default suite),
unless RDMADEV_REQUIRE_VERBS=1 (tests/softroce/tier.sh), where it fails. tier.sh runs it
only with RDMADEV_SOFTROCE_FAULTS=1: its ~12 TF processes take minutes to start in the guest.
"""
import os
import random
import re
import subprocess
import sys
import time

import pytest

import rdmadev

HERE = os.path.dirname(os.path.abspath(__file__))
TESTS = os.path.dirname(HERE)
sys.path[:0] = [os.path.join(TESTS, "chaos"), TESTS,
                os.path.join(os.path.dirname(TESTS), "benchmarks")]
import test_chaos as chaos  # noqa: E402  (its driver, case, bounds and resource checks)
from graph_pass.devices import task_name  # noqa: E402
from rdmadev import Config, _core  # noqa: E402
from rdmadev.cluster import runtime  # noqa: E402
from rdmadev.cluster.channels import WATCH_INTERVAL_S  # noqa: E402
from rdmadev.testing import launch  # noqa: E402

# As in tests/test_verbs.py: with RDMADEV_REQUIRE_VERBS=1 these run, and fail, even when verbs
# is not viable.
VERBS = "verbs" in rdmadev.viable_fabrics() or os.environ.get("RDMADEV_REQUIRE_VERBS") == "1"
pytestmark = [pytest.mark.tf, pytest.mark.skipif(
    not VERBS, reason="verbs is not viable here: " + rdmadev._core.unviable_reason("verbs"))]

ENV = {**chaos.ENV, "RDMADEV_FABRIC": "verbs"}
#: Seconds the three servers may take to listen: the guest's CPU is emulated (TCG), where
#: importing TF alone took 73 s in one process (180 s with a cold page cache) on 2 vCPUs.
READY_TIMEOUT_S = 600.0
#: Seconds rxe0's port may take to follow its netdev's state (it follows at once: `rdma link`
#: read right after `ip link set` shows it).
PORT_STATE_S = 10.0
#: How soon after link down every task with verbs peers has found its endpoints broken:
#: the next write or credit on each fails at once, its sweep runs within WATCH_INTERVAL_S,
#: plus a loaded guest's slack (tests/chaos: 3 s).
BROKEN_BOUND_S = 2 * WATCH_INTERVAL_S + 3.0
#: The coordinator's error after link down: the step's writes fail at once, and a wait on a
#: half the sweep unbound fails at the sweep: the same bound.
LINK_ERROR_BOUND_S = BROKEN_BOUND_S
#: Seconds a chaos driver may take to finish its first step, or a recovery run its steps:
#: TF's import, connecting and tracing in the guest's emulated CPU took longer than
#: tests/chaos's whole-run bound (2 x HANG_S: 180 s) under load. After the first step the
#: tier's own no-hang bound (HANG_S) applies.
START_S = 900.0
#: Seconds for what a finished job held to go: verbs' late-write grace, plus a loaded guest's
#: slack.
SETTLE_S = _core.LATE_WRITE_GRACE_S + 60.0
TARGETS = {"ps": ("ps", 0), "worker": ("worker", 0)}
CASES = []  # (fault, target, coordinator's error after, tasks knew after, settled after), printed


def _rxe_netdev():
    """The netdev rdma_rxe's device sits on (`rdma link`: "... netdev dummy0")."""
    out = subprocess.run(["rdma", "link"], capture_output=True, text=True, timeout=30).stdout
    found = re.search(r"netdev (\S+)", out)
    assert found, f"no rxe link: {out!r}"
    return found.group(1)


def _set_link(netdev, up):
    """Sets `netdev` up or down and waits (bounded) until the rxe port follows."""
    subprocess.run(["ip", "link", "set", netdev, "up" if up else "down"], check=True,
                   capture_output=True, timeout=30)
    want = "state ACTIVE" if up else "state DOWN"
    deadline = time.monotonic() + PORT_STATE_S
    while time.monotonic() < deadline:
        if want in subprocess.run(["rdma", "link"], capture_output=True, text=True,
                                  timeout=30).stdout:
            return
        time.sleep(0.05)
    raise AssertionError(f"rxe's port on {netdev} did not go {'up' if up else 'down'}")


def _started(cluster):
    """A chaos driver that has run 3 steps (within START_S)."""
    d = chaos.Driver(cluster, "rdmadev")
    assert d.wait(lambda: len(d.steps()) >= 3, START_S), d.output()
    return d


def _recovery_run(cluster):
    """test_chaos's recovery run, within START_S (TF starts slowly in the guest)."""
    return chaos._recovery_run(cluster, "rdmadev", within=START_S)


def _baseline(cluster, rt):
    """What the tasks hold between jobs: once the heartbeats' connections are open, no ring is
    retired or parked and no released region's pages quarantined any more (verbs keeps a
    released receiver's ring registered for late writes for LATE_WRITE_GRACE_S, then its pages
    as long: a reading taken before that held one more region or chunk on a worker, failing
    the next case's check) and two readings a sweep apart agree; bounded."""
    time.sleep(2 * chaos.LIVENESS_S)
    deadline = time.monotonic() + SETTLE_S
    last = chaos._held(rt, cluster)
    while time.monotonic() < deadline:
        time.sleep(WATCH_INTERVAL_S)
        now = chaos._held(rt, cluster)
        idle = all(rt.call(t, {"op": "counters"})[k] == 0
                   for t in now for k in ("retired", "parked", "quarantined_bytes"))
        if idle and now == last:
            return now
        last = now
    raise AssertionError(f"the tasks' resources did not settle within {SETTLE_S} s: {last}")


def _noticed(rt, tasks, during, since, timeout):
    """Seconds from `since` until each of `tasks` reacted to its broken verbs endpoints
    (fewer channel halves bound than `during` the job: unbound by the sweep, or pairs set up
    again: `reopened` grew), or None."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        now = {t: rt.call(t, {"op": "counters"}) for t in tasks}
        if all(now[t]["channels"] < during[t]["channels"] or
               now[t]["reopened"] > during[t]["reopened"] for t in tasks):
            return time.monotonic() - since
        time.sleep(0.05)
    return None


def _left_over(before, after):
    """The (task, counter) pairs not back where they were (fds: within tests/chaos's slack)."""
    return [(t, k) for t in before for k in chaos.HELD if after[t][k] != before[t][k]] + \
        [(t, k) for t in before for k, slack in chaos.SLACK.items()
         if after[t][k] > before[t][k] + slack]


@pytest.fixture(scope="module")
def verbs_cluster():
    """1 ps + 2 workers on 127.0.0.1, every task (and the drivers) on verbs; a runtime to ask
    the tasks for their counters; what they hold after one clean run."""
    saved = os.environ.get("RDMADEV_FABRIC")
    os.environ["RDMADEV_FABRIC"] = "verbs"  # the drivers (chaos.Driver) inherit it
    try:
        with launch.Cluster(num_ps=1, num_workers=2, env=ENV,
                            ready_timeout=READY_TIMEOUT_S) as cluster:
            rt = runtime.Runtime(cluster.spec, config=Config(secret=chaos.SECRET.encode()))
            try:
                assert _recovery_run(cluster)
                yield cluster, rt, {"held": _baseline(cluster, rt)}
            finally:
                rt.close()
    finally:
        if saved is None:
            os.environ.pop("RDMADEV_FABRIC", None)
        else:
            os.environ["RDMADEV_FABRIC"] = saved
    if CASES:
        print("\nverbs chaos (fault, target, coordinator's error after, tasks knew after, "
              "resources settled after):")
        for case in CASES:
            print("  " + " | ".join(case))


def _fmt(seconds):
    return "-" if seconds is None else f"{seconds:.2f} s"


# Link down first: it restarts nothing; the ps last.
@pytest.mark.parametrize("fault,target", [("link down", "all"), ("kill -9", "worker"),
                                          ("kill -9", "ps")])
def test_verbs_fault(verbs_cluster, fault, target):
    cluster, rt, state = verbs_cluster
    before = state["held"]
    rng = random.Random(int(os.environ.get("RDMADEV_CHAOS_SEED") or
                            random.SystemRandom().randrange(1 << 32)))
    d = _started(cluster)
    during = {t: rt.call(t, {"op": "counters"}) for t in before}
    time.sleep(rng.uniform(0.0, 0.3))  # steps run back to back: a random point of one
    knew = None
    if fault == "kill -9":
        job, index = TARGETS[target]
        failed = task_name(job, index)
        fault_at = time.monotonic()
        cluster.kill(job, index)
        assert d.wait(lambda: d.error() is not None, chaos.HANG_S), "hang: " + d.output()
        cluster.restart(job, index)
        kept = {t: v for t, v in before.items() if t != failed}
    else:
        netdev = _rxe_netdev()
        cut = [t for t, held in before.items() if held["peers"]]  # tasks with verbs peers
        fault_at = time.monotonic()
        _set_link(netdev, up=False)
        try:
            knew = _noticed(rt, cut, during, fault_at, chaos.OUT_S)
        finally:
            _set_link(netdev, up=True)
        resumed = time.monotonic()
        assert d.wait(lambda: d.error() is not None or d.stepped_since(resumed), chaos.HANG_S), \
            "hang: " + d.output()
        kept = before
    error = d.error()
    d.interrupt()
    recovered = _recovery_run(cluster)
    after, settled_s = chaos._settled(rt, cluster, kept)
    named = [t for t in before if error and t in error[1]["message"]]
    CASES.append((fault, target, f"{error[0] - fault_at:.2f} s" if error else "no error",
                  _fmt(knew), _fmt(settled_s)))
    state["held"] = _baseline(cluster, rt)  # the next case's (a restarted task's: afresh)
    assert d.exact(), d.output()  # every step the faulted job finished applied exactly once
    assert recovered, d.output()
    assert not _left_over(kept, after), (kept, after)
    if fault == "kill -9":
        assert error is not None and error[0] - fault_at <= chaos.KILL_BOUND_S, (error, fault_at)
        assert failed in named, error
    else:
        assert knew is not None and knew <= BROKEN_BOUND_S, (cut, knew)
        # Every pair is cut, so the step under way fails; it names a task it lost a pair to.
        assert error is not None and error[0] - fault_at <= LINK_ERROR_BOUND_S, (error, fault_at)
        assert named, error
