"""ParameterServerStrategy through rdmadev when a worker or the ps dies or a connection is
cut. The scenarios of a group run one after the other in one coordinator process with its own
cluster (it kills tasks): tests/e2e/pss_faults.py."""
import json
import os
import subprocess
import sys

import pytest

import rdmadev
from e2e_util import ENV, HERE

pytestmark = pytest.mark.tf

#: Three servers start (~40 s loaded), workers restart (~10-40 s each), ~200 steps a scenario.
TIMEOUT_S = 600
#: The verbs group runs in the Soft-RoCE guest, whose CPU is emulated: its four TF processes
#: take minutes to start there (pss_faults.READY_TIMEOUT_S).
GROUP_TIMEOUT_S = {"verbs": 1200}
#: As in tests/test_verbs.py: verbs where it is viable, and with RDMADEV_REQUIRE_VERBS=1 (the
#: Soft-RoCE tier: tests/softroce/tier.sh) always, so that a verbs not viable there fails.
VERBS = "verbs" in rdmadev.viable_fabrics() or os.environ.get("RDMADEV_REQUIRE_VERBS") == "1"
_groups = {}


def _run(scenario, group=None):
    """The result of `scenario`, from the run of its group (pss_faults.GROUPS; `group`: that
    one, else the first that runs it), which runs once."""
    import pss_faults
    group = group or next(g for g, (_, scenarios) in pss_faults.GROUPS.items()
                          if scenario in [f.__name__ for f in scenarios])
    if group not in _groups:
        proc = subprocess.run([sys.executable, os.path.join(HERE, "pss_faults.py"), group],
                              capture_output=True, text=True, cwd=HERE,
                              timeout=GROUP_TIMEOUT_S.get(group, TIMEOUT_S),
                              env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2", **ENV})
        results = {}
        for line in proc.stdout.splitlines():
            if line.startswith("RESULT "):
                _, name, body = line.split(" ", 2)
                results[name] = json.loads(body)
        _groups[group] = results, (proc.stdout + proc.stderr)[-6000:]
    results, output = _groups[group]
    assert scenario in results, output
    return results[scenario]


def test_a_killed_worker_restarted_at_its_address_trains_through_rdmadev_again():
    r = _run("restart_worker")
    # none lost; a step the dead worker had applied on the ps but not returned is run again
    # (ClusterCoordinator's at-least-once retry, on gRPC too)
    assert r["applied"] <= r["w"] <= r["applied"] + r["in_flight"]
    assert r["new_pid"] != r["old_pid"]
    restarted = [line for line in r["reports"] if f"instance {r['new_pid']:x}." in line]
    assert restarted and "on /job:worker/replica:0/task:1): 3 transfers swapped" in restarted[0]
    # the dead incarnation's halves on the ps went; nothing else grew
    assert r["after"] == r["before"], r


@pytest.mark.parametrize("fabric", ["shm", "tcp", pytest.param("verbs", marks=pytest.mark.skipif(
    not VERBS, reason="verbs is not viable here (the Soft-RoCE tier runs it)"))])
def test_a_killed_ps_fails_the_coordinator_promptly(fabric):
    """And as TF's gRPC does: ClusterCoordinator tells a lost ps (raised to the user, who
    restores the variables) from a lost worker (its closure runs again) by the task an error
    names; rdmadev's errors name a task its control plane found gone as gRPC names a remote
    target (recovery.py judge). TF's own classifiers judge the error the user got."""
    r = _run("kill_ps", group=fabric)
    assert r["error"], "training went on without its ps"
    assert r["ps_failure"] and not r["worker_failure"], r
    # from the ps's death being noticed, not from rdmadev's deadline running out
    assert r["seconds"] < float(ENV["RDMADEV_DEADLINE_S"]), r


def test_dropped_scheduled_functions_release_what_every_task_held():
    r = _run("release")
    for i, rnd in enumerate(r["rounds"]):
        assert rnd["swapped"] >= 2, rnd  # both workers ran the step through rdmadev
        for task in r["start"]:
            assert rnd["holding"][task]["channels"] > r["start"][task]["channels"], (i, task, rnd)
        assert rnd["after"] == r["start"], (i, rnd, r["start"])


def test_a_connection_cut_while_both_tasks_run_is_set_up_again_and_training_goes_on():
    """tcp fabric: worker:0's connection to the ps is reset mid-training (ss -K), both tasks
    running on. The steps it cut short fail as transient (Unavailable) and are run again."""
    r = _run("cut_connection")
    assert r["cut"] >= 1, r
    assert r["swapped"] >= 2, r  # both workers ran the step through rdmadev
    # none lost; a step applied on the ps whose return the reset cut is run again
    assert r["applied"] <= r["w"] <= r["applied"] + r["in_flight"], r
    ps, w0, w1 = (f"/job:{j}/replica:0/task:{i}" for j, i in (("ps", 0), ("worker", 0), ("worker", 1)))
    assert r["reopened"][ps] >= 1 and r["reopened"][w0] >= 1 and r["reopened"][w1] == 0, r
    # the old rings went, the new ones are the same size, worker:1 kept its own
    assert r["after"] == r["before"], r


def test_a_pair_set_up_again_after_a_cut_keeps_the_slots_its_channels_grew_to():
    """As above, with a step of run-time shapes whose channels outgrew their 256-byte slots:
    after the reset the pairs between worker:0 and the ps are set up with the grown slots,
    so neither task grows a ring or stages a tensor again, and no step is lost."""
    r = _run("cut_grown")
    ps, w0 = "/job:ps/replica:0/task:0", "/job:worker/replica:0/task:0"
    assert r["cut"] >= 1 and r["swapped"] >= 2, r
    assert r["reopened"][ps] >= 1 and r["reopened"][w0] >= 1, r
    assert r["grown_before"] and r["grown_before"][ps]["grown"] >= 1, r  # the ids, the ones
    assert r["grown_before"][w0]["grown"] >= 1, r  # the gathered rows
    assert r["grown_after"] == r["grown_before"], r
    # every row counts the steps applied: none lost, a cut one's retry applied at most twice
    assert len(set(r["rows"])) == 1 and r["applied"] <= r["rows"][0] <= r["applied"] + r["in_flight"], r


def test_a_restarted_worker_gets_the_slots_its_channels_to_the_ps_grew_to():
    """restart_worker's kill -9 and restart, with the step of run-time shapes whose channels
    outgrew their 256-byte slots: the restarted worker's channels to the ps (new keys: a new
    incarnation) are set up with the slots their lineage grew to, so the ps grows no ring
    again and the restarted worker stages none of its tensors; no step is lost."""
    r = _run("restart_grown")
    ps, w1 = "/job:ps/replica:0/task:0", "/job:worker/replica:0/task:1"
    assert r["new_pid"] != r["old_pid"] and r["restarted"], r
    assert r["before"][ps]["grown"] >= 2 and r["before"][w1]["staged"] >= 1, r  # ids, ones
    assert r["after"][ps]["grown"] == r["before"][ps]["grown"], r
    assert r["after"][w1]["staged"] == 0 and r["after"][w1]["stages"] == 0, r
    assert len(set(r["rows"])) == 1 and r["applied"] <= r["rows"][0] <= r["applied"] + r["in_flight"], r
