"""examples/slurm/ as a user submits it, to a private single-node Slurm (tests/slurm_cluster.py):
sbatch starts the coordinator, the ps and two workers as the 4 tasks of one step, TF's
SlurmClusterResolver builds the cluster in each (`rdmadev serve --slurm` in the ps and
workers), and the job trains over grpc+rdmadev bitwise as the same job over TF's gRPC, its
tensors on rdmadev's shm fabric. When the job ends, by itself or cancelled, no process of it
is left and its tasks' TF and rdmadev control ports are free. And `rdmadev serve --slurm`
refuses a task it cannot place, saying why, before TF starts.

The tests that submit jobs need root and Slurm (skipped, saying so, without them; failed
instead under RDMADEV_REQUIRE_SLURM=1)."""
import os
import re
import subprocess
import sys
import time

import numpy as np
import pytest

import slurm_cluster  # tests/ is on sys.path (tests/conftest.py)
from rdmadev.cluster.control import control_address


EXAMPLE = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
                       "examples", "slurm")
TASKS = 4
STEPS = 8
ENV = {"RDMADEV_SECRET": "rdmadev-slurm-test-secret", "RDMADEV_DEADLINE_S": "120"}
#: Seconds one job may take: 4 TF processes starting at once on 2 cores (~30 s loaded), then
#: tracing and STEPS steps; generous for a loaded machine.
JOB_TIMEOUT_S = 600
#: Seconds the tasks of an ended job get to be gone (Slurm's KillWait, with room).
RELEASE_TIMEOUT_S = 30


@pytest.fixture(scope="module")
def slurm():
    slurm_cluster.require()
    with slurm_cluster.SlurmCluster() as s:
        yield s


def _serve(*args, env=None, via=()):
    """`rdmadev serve ARGS` (through `via`, e.g. srun); its CompletedProcess."""
    return subprocess.run([*via, sys.executable, "-m", "rdmadev.server", *args], capture_output=True,
                          text=True, timeout=120, env=env)


@pytest.mark.parametrize("args, said", [
    (["--slurm", "chief=1,ps=1,worker=2"], "not a task of a Slurm job step (SLURM_PROCID, "),
    (["--slurm", "ps=0"], "'ps=0' is not job=count with a count >= 1"),
    (["--slurm", "ps=1,ps=2"], "name job 'ps' twice"),
    (["--slurm", "ps=1", "--job", "ps"], "--cluster, --job and --task cannot be given with it"),
])
def test_serve_refuses_a_bad_slurm_task_saying_why(args, said):
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    proc = _serve(*args, env=env)
    assert proc.returncode == 2 and said in proc.stderr and "Fix: " in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr


@pytest.mark.slow
def test_a_step_of_the_wrong_size_is_refused_before_tensorflow_starts(slurm):
    # Before the module's jobs take the node's CPUs (tests run in file order).
    proc = _serve("--slurm", "chief=1,ps=1,worker=2", env={**slurm.env, **ENV},
                  via=("srun", "--ntasks=3", "--kill-on-bad-exit=1"))
    assert proc.returncode != 0
    assert ("the Slurm step has 3 tasks but the jobs chief=1,ps=1,worker=2 need 4. "
            "Fix: start the step with srun --ntasks=4") in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr


class Job:
    """examples/slurm/train.sbatch submitted: its id, output file, first TF port, results file."""

    def __init__(self, slurm, rpc_layer, steps, port_base):
        self.port_base = port_base
        self.out = os.path.join(slurm.dir, f"job-{rpc_layer}-{port_base}.out")
        self.save = os.path.join(slurm.dir, f"result-{rpc_layer}-{port_base}.npz")
        env = {**ENV, "RPC_LAYER": rpc_layer, "PORT_BASE": str(port_base), "STEPS": str(steps),
               "SAVE": self.save}
        self.id = slurm.submit(["--output", self.out, "train.sbatch"], cwd=EXAMPLE, env=env)


@pytest.fixture(scope="module")
def jobs(slurm):
    """The module's three jobs, submitted at once (12 tasks on the node's 12 declared CPUs): one
    over grpc+rdmadev and one over gRPC to compare, and one (training for long) to cancel, which
    the first test cancels once its tasks serve. On 2026-12-04, on a machine loaded by other
    runs (load 8-13), the pair one after the other took 128 s and the cancelled job 50 s more;
    all three at once, 82 s of tests (99 s with the module's other tests and Slurm's start)."""
    base = slurm_cluster.consecutive_free_ports(3 * TASKS)
    return {"grpc+rdmadev": Job(slurm, "grpc+rdmadev", STEPS, base),
            "grpc": Job(slurm, "grpc", STEPS, base + TASKS),
            "cancelled": Job(slurm, "grpc+rdmadev", 10 ** 6, base + 2 * TASKS)}


def _read(path):
    """The job's output so far ("" before Slurm creates the file)."""
    try:
        with open(path, errors="replace") as f:
            return f.read()
    except FileNotFoundError:
        return ""


def _job_processes(slurm, job):
    """Pids of live processes whose environment names `job` of this Slurm (its batch script
    and every task; zombies have none)."""
    marks = {f"SLURM_JOB_ID={job}".encode(), f"SLURM_CONF={slurm.env['SLURM_CONF']}".encode()}
    pids = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/environ", "rb") as f:
                if marks <= set(f.read().split(b"\0")):
                    pids.append(int(pid))
        except OSError:
            continue
    return pids


def _bound_ports(port_base):
    """Of the job's TF ports and their rdmadev control ports, those something still listens on
    (connections the tasks closed may linger in TIME_WAIT: they hold nothing a new task needs)."""
    return [p for port in range(port_base, port_base + TASKS)
            for p in (port, control_address(f"127.0.0.1:{port}")[1]) if not slurm_cluster.port_free(p)]


def _assert_released(slurm, job, port_base):
    deadline = time.monotonic() + RELEASE_TIMEOUT_S
    while (_job_processes(slurm, job) or _bound_ports(port_base)) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert _job_processes(slurm, job) == [], "processes of the ended job are left"
    assert _bound_ports(port_base) == [], "the ended job's task or control ports are still held"


def _finish(slurm, job):
    """The results the job saved and its output, once it has completed and left nothing."""
    state, code = slurm.wait(job.id, JOB_TIMEOUT_S)
    text = _read(job.out)
    # Every task exited 0: the chief when done, the ps and workers (rdmadev serve --slurm) by
    # themselves once the chief had; else the step would run to its time limit.
    assert (state, code) == ("COMPLETED", "0:0"), text[-4000:]
    _assert_released(slurm, job.id, job.port_base)
    with np.load(job.save) as r:
        return {k: r[k] for k in r.files}, text


@pytest.mark.tf
@pytest.mark.slow
def test_a_cancelled_job_leaves_no_task(slurm, jobs):
    job = jobs["cancelled"]
    deadline = time.monotonic() + JOB_TIMEOUT_S
    while (time.monotonic() < deadline and _read(job.out).count("RDMADEV_SERVER_READY") < 3
           and slurm.job(job.id).get("JobState") in ("PENDING", "RUNNING")):
        time.sleep(0.5)
    assert _read(job.out).count("RDMADEV_SERVER_READY") == 3, _read(job.out)[-4000:]
    assert len(_job_processes(slurm, job.id)) > TASKS  # the batch script and the 4 tasks
    slurm.run(["scancel", job.id])
    state, _ = slurm.wait(job.id, JOB_TIMEOUT_S)
    assert state == "CANCELLED"
    _assert_released(slurm, job.id, job.port_base)


@pytest.mark.tf
@pytest.mark.slow
def test_a_slurm_job_trains_over_rdmadev_bitwise_as_over_grpc_and_leaves_nothing(slurm, jobs):
    (ours, text), (grpc, grpc_text) = (_finish(slurm, jobs[k]) for k in ("grpc+rdmadev", "grpc"))

    # The coordinator's summary, one line per task: what rdmadev carried and over what.
    rows = {task: (int(done), int(pairs), fabrics, int(kept)) for task, done, pairs, fabrics, kept in
            re.findall(r"^rdmadev on (\S+): (\d+) transfers, (\d+) pairs swapped over (\S+), "
                       r"(\d+) stayed on gRPC$", text, re.M)}
    ps, workers = "/job:ps/replica:0/task:0", [f"/job:worker/replica:0/task:{i}" for i in (0, 1)]
    assert set(rows) == {ps, *workers}, text[-4000:]
    assert rows[ps][0] > 0 and rows[ps][3] == 0, rows  # tensors reached the ps over rdmadev
    # The workers plan their steps; ClusterCoordinator gives each step to whichever worker is
    # free, so one may run them all.
    ran = [rows[w] for w in workers if rows[w][1]]
    assert ran and all(done > 0 and fabrics == "shm" and kept == 0 for done, _, fabrics, kept in ran), rows
    # Quiet: the 3 tasks' ready lines, the coordinator's result and its summary, nothing else.
    lines = text.strip().splitlines()
    assert sum(l.startswith("RDMADEV_SERVER_READY ") for l in lines) == 3, text[-4000:]
    assert len(lines) == 3 + 1 + 3, text[-4000:]
    assert "rdmadev on" not in grpc_text and len(grpc_text.strip().splitlines()) == 3 + 1, grpc_text

    assert ours.keys() == grpc.keys()
    for name in ours:
        assert ours[name].tobytes() == grpc[name].tobytes(), f"{name} differs from gRPC's"
