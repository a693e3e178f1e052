"""Between-graph replication over rdmadev: each task plans only its half of every pair (a TF1
task's GraphMgr runs the pass on its own partition) and the halves meet through the receiver
(rdmadev/cluster/half_pairs.py; send_op.cc's and recv_op.cc's `owned` kernels).

The job is a user's TF1 script run unchanged (tests/between_graph_client.py: replica_device_setter,
MonitoredTrainingSession, one client per worker, both workers at once) on real TF servers:
once on a gRPC cluster and once on a grpc+rdmadev cluster, compared bitwise. The module's
tests share those clusters (Shared)."""
import json
import re
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest

import netns
import tf_cluster
from graph_pass.devices import task_name
from rdmadev import Config
from rdmadev.cluster import runtime
from rdmadev.cluster.reports import Report
from rdmadev.tf import bridge, protocol

HERE = Path(__file__).resolve().parent
SECRET = "rdmadev-between-graph-secret"
ENV = {"RDMADEV_SECRET": SECRET, "RDMADEV_DEADLINE_S": "60", "TF_CPP_MIN_LOG_LEVEL": "2"}
# A client process: TF import, session setup, a few steps and the reports, with two at once on
# a loaded 2-core machine.
CLIENT_TIMEOUT_S = 300
W0 = task_name("worker", 0)
WORKERS = 2


# Deregistering a closed session's graphs on every task, on a loaded machine.
RELEASE_WAIT_S = 60


class Shared:
    """The clusters this module's tests share, by protocol and fabric: 2 ps + 2 workers (2 ps
    + 1 worker on tcp), each started at its first use, and for rdmadev's a control runtime of
    this process that reads what its tasks hold and planned. A test gives its clients a part
    of one (`spec`) and judges what changed while they ran, never totals; tests that kill a
    task start a cluster of their own. Each client script names its variables apart, as they
    live on the ps across sessions."""

    def __init__(self):
        self.clusters, self.runtimes = {}, {}

    def cluster(self, rpc_layer, tcp=False):
        key = (rpc_layer, tcp)
        if key not in self.clusters:
            env = {**ENV, "RDMADEV_FABRIC": "tcp"} if tcp else ENV
            self.clusters[key] = tf_cluster.Cluster(
                num_ps=2, num_workers=1 if tcp else 2, env=env,
                launcher=tf_cluster.protocol_launcher(rpc_layer)).start()
        return self.clusters[key]

    def runtime(self, cluster):
        if cluster not in self.runtimes:
            self.runtimes[cluster] = runtime.Runtime(cluster.spec, config=Config(secret=SECRET.encode()))
        return self.runtimes[cluster]

    def counters(self, cluster, spec):
        rt = self.runtime(cluster)
        return {t: rt.call(t, {"op": "counters"}) for t in _tasks(spec)}

    def reports(self, cluster, spec):
        """{task: [report text]} of the tasks of `spec`, oldest first."""
        rt = self.runtime(cluster)
        return {t: [str(Report.from_dict(d)) for d in rt.call(t, {"op": "reports"})]
                for t in _tasks(spec)}

    def close(self):
        for rt in self.runtimes.values():
            rt.close()
        for c in self.clusters.values():
            c.stop()


@pytest.fixture(scope="module")
def shared():
    s = Shared()
    try:
        yield s
    finally:
        s.close()


def _tasks(spec):
    return [task_name(job, i) for job, addresses in sorted(spec.items()) for i in range(len(addresses))]


def _spec(cluster, ps, workers):
    """The part of `cluster` a job uses: its first `ps` ps and `workers` workers."""
    return {"ps": cluster.spec["ps"][:ps], "worker": cluster.spec["worker"][:workers]}


def _new_reports(before, after):
    """What each task reported after `before` (Shared.reports) was read."""
    return {t: lines[len(before.get(t, [])):] for t, lines in after.items()}


def _printed(returncode, output, prefix):
    """The JSON a client printed last after `prefix` (e.g. "RESULT "); asserts that it exited
    cleanly and printed one."""
    lines = [l for l in output.splitlines() if l.startswith(prefix)]
    assert returncode == 0 and lines, output[-4000:]
    return json.loads(lines[-1][len(prefix):])


def _client_result(shared, script, rpc_layer, *args):
    """Runs the client `script` (argv: the cluster spec, then `args`) against 1 ps + 1 worker of
    the shared cluster serving `rpc_layer`; returns its RESULT, with (rdmadev) the reports its
    tasks made meanwhile under "reports"."""
    cluster = shared.cluster(rpc_layer)
    spec = _spec(cluster, 1, 1)
    ours = rpc_layer == protocol.PROTOCOL
    before = shared.reports(cluster, spec) if ours else {}
    p = subprocess.run([sys.executable, "-c", script, json.dumps(spec), *args],
                       capture_output=True, text=True, timeout=CLIENT_TIMEOUT_S,
                       env={**os.environ, **ENV})
    result = _printed(p.returncode, p.stdout + p.stderr, "RESULT ")
    if ours:
        result["reports"] = _new_reports(before, shared.reports(cluster, spec))
    return result


def _clients(spec, workers, env=None):
    """Runs the clients of `workers` at once; returns each one's CompletedProcess."""
    procs = [subprocess.Popen(
        [sys.executable, str(HERE / "between_graph_client.py"), json.dumps(spec), str(i)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env={**os.environ, **ENV, **(env or {})}) for i in workers]
    done = []
    try:
        for p in procs:
            out, err = p.communicate(timeout=CLIENT_TIMEOUT_S)
            done.append(subprocess.CompletedProcess(p.args, p.returncode, out, err))
    finally:
        for p in procs:
            p.kill()
    return done


def _released(shared, cluster, spec):
    """The counters of `spec`'s tasks once no channel half is bound, no region registered
    there (the sessions closed: their kernels unbound their halves) and no released region's
    pages are quarantined for late writes (10 s), or after RELEASE_WAIT_S."""
    deadline = time.monotonic() + RELEASE_WAIT_S
    while True:
        c = shared.counters(cluster, spec)
        if all(v["channels"] == 0 and v["registered_bytes"] == 0 and v["quarantined_bytes"] == 0
               for v in c.values()) or time.monotonic() > deadline:
            return c
        time.sleep(0.5)


def _job(shared, rpc_layer):
    """Runs both workers' clients at once on 1 ps + 2 workers of the shared cluster serving
    `rpc_layer`; returns each client's RESULT, by worker index (rdmadev: the transfers and
    reports its tasks made since the job began), and then (rdmadev only) the tasks' counters
    once the sessions closed."""
    cluster = shared.cluster(rpc_layer)
    spec = _spec(cluster, 1, WORKERS)
    ours = rpc_layer == protocol.PROTOCOL
    if ours:
        moved = {t: c["transfers"] for t, c in shared.counters(cluster, spec).items()}
        reported = shared.reports(cluster, spec)
    results = []
    for p in _clients(spec, range(WORKERS)):
        result = _printed(p.returncode, p.stdout + p.stderr, "RESULT ")
        if ours:
            result["transfers"] = {t: n - moved[t] for t, n in result["transfers"].items()}
            result["reports"] = _new_reports(reported, result["reports"])
        results.append(result)
    if ours:
        results.append(_released(shared, cluster, spec))
    return results


@pytest.fixture(scope="module")
def runs(shared):
    ours = _job(shared, protocol.PROTOCOL)
    return {"grpc": _job(shared, "grpc"), "ours": ours[:WORKERS], "after": ours[WORKERS]}


@pytest.mark.tf
def test_between_graph_training_is_bitwise_equal_to_grpc(runs):
    for i, (grpc, ours) in enumerate(zip(runs["grpc"], runs["ours"])):
        assert ours["results"] == grpc["results"], f"worker {i}: grpc+rdmadev must compute what gRPC computes"


@pytest.mark.tf
def test_both_halves_of_every_pair_moved_over_rdmadev(runs):
    # Each client reads the counters once its own steps are done (the other worker may not
    # have started yet): its own task and the ps carried its transfers.
    for i, ours in enumerate(runs["ours"]):
        for task in ("/job:ps/replica:0/task:0", f"/job:worker/replica:0/task:{i}"):
            assert ours["transfers"][task], f"{task}: nothing moved over rdmadev for worker {i}"
    assert all(v is None for v in runs["grpc"][-1]["transfers"].values()), \
        "the gRPC cluster must not run rdmadev at all"


@pytest.mark.tf
def test_each_tasks_report_shows_its_halves_swapped(runs):
    # As the counters: each client's own task and the ps have planned its session by then.
    for i, ours in enumerate(runs["ours"]):
        for task in ("/job:ps/replica:0/task:0", f"/job:worker/replica:0/task:{i}"):
            text = "\n".join(ours["reports"][task])
            assert " half" in text, f"{task} swapped no half pair for worker {i}:\n{text}"
    for task, lines in runs["ours"][-1]["reports"].items():
        text = "\n".join(lines)
        # What stays on gRPC is only what the issue allows: strings and the client's feeds.
        for line in text.splitlines():
            if line.strip().startswith("grpc "):
                assert "non_plain_dtype" in line or \
                       "client" in line, f"{task} kept a pair it should swap: {line}"


@pytest.mark.tf
def test_closing_the_sessions_releases_every_half_on_every_task(runs):
    for task, c in runs["after"].items():
        assert c["channels"] == 0 and c["registered_bytes"] == 0 and c["memfd_maps"] == 0, \
            f"{task} still holds channels after both sessions closed: {c}"


def _mixed_launcher(job, index, spec_json):
    """The ps is `rdmadev serve` (grpc+rdmadev, its warnings on stderr: with RDMADEV_AUTO=1 it
    plans TF1 graphs); the workers serve plain gRPC (a task started without rdmadev)."""
    if job == "ps":
        return tf_cluster.rdmadev_launcher(job, index, spec_json)
    return tf_cluster.protocol_launcher("grpc")(job, index, spec_json)


#: What a job whose pairs keep TF's path must train.
SAME_AS_GRPC = "TF's path must compute what gRPC computes"


def _kept_job(env, launcher):
    """Worker 0's client alone on a cluster of its own (1 ps + 1 worker, `env`, `launcher`)
    whose half pairs cannot all be set up; returns its RESULT, the ps's reports and both
    tasks' logs."""
    env = {**ENV, "RDMADEV_AUTO": "1", **env}  # `rdmadev serve` plans TF1 graphs with it
    cluster = tf_cluster.Cluster(num_ps=1, num_workers=1, env=env, launcher=launcher)
    cluster.start()
    rt = runtime.Runtime(cluster.spec, config=Config(secret=SECRET.encode()))
    try:
        (p,) = _clients(cluster.spec, [0], env)
        result = _printed(p.returncode, p.stdout + p.stderr, "RESULT ")
        reports = [Report.from_dict(d) for d in rt.call(task_name("ps", 0), {"op": "reports"})]
        logs = {t: cluster.log_path(*t).read_text(errors="replace")
                for t in (("ps", 0), ("worker", 0))}
    finally:
        rt.close()
        cluster.stop()
    return result, reports, logs


def _kept_pairs(reports):
    """The (tensor, route) of every pair the ps's reports say it kept on TF's path."""
    return {(name, route) for r in reports for name, route, reason in r.kept
            if reason == bridge.KEPT_ON_TF}


@pytest.mark.tf
def test_a_half_whose_peer_task_runs_without_rdmadev_keeps_tfs_path(runs):
    """The worker serves plain gRPC: the ps's halves can never meet theirs. The ps keeps them on
    TF's own path (its kernels send and receive through the step's rendezvous, the worker's
    are TF's own), as soon as it finds the worker does not answer rdmadev's control requests,
    not at the deadline (here longer than the client may take), and the job trains as on gRPC,
    bit for bit. It failed every step before."""
    env = {"RDMADEV_DEADLINE_S": str(2 * CLIENT_TIMEOUT_S)}
    result, reports, logs = _kept_job(env, _mixed_launcher)
    assert result["results"] == runs["grpc"][0]["results"], SAME_AS_GRPC
    routes = {route for _, route in _kept_pairs(reports)}
    assert routes == {f"{task_name('ps', 0)} -> {W0}", f"{W0} -> {task_name('ps', 0)}"}, reports
    log = logs[("ps", 0)]
    assert "stay on TF's gRPC path" in log and \
        f"their receiving task {W0} does not answer rdmadev's control requests" in log, log[-4000:]


def _unplanned_launcher(job, index, spec_json):
    """Every task is `rdmadev serve`; the workers without RDMADEV_AUTO, so their pass rewrites
    only rdmadev.optimize'd functions and plans none of a TF1 graph's halves."""
    command = tf_cluster.rdmadev_launcher(job, index, spec_json)
    return command if job == "ps" else ["env", "RDMADEV_AUTO=0", *command]


@pytest.mark.tf
def test_half_pairs_with_a_task_that_plans_no_tf1_graph_keep_tfs_path(runs):
    """The worker runs rdmadev but does not plan TF1 graphs: the ps finds that out with one
    control request each way (not at the deadline, here longer than the client may take),
    keeps its halves on TF's path, and the job trains as on gRPC, bit for bit."""
    env = {"RDMADEV_DEADLINE_S": str(2 * CLIENT_TIMEOUT_S)}
    result, reports, logs = _kept_job(env, _unplanned_launcher)
    assert result["results"] == runs["grpc"][0]["results"], SAME_AS_GRPC
    routes = {route for _, route in _kept_pairs(reports)}
    assert routes == {f"{task_name('ps', 0)} -> {W0}", f"{W0} -> {task_name('ps', 0)}"}, reports
    assert "does not plan TF1 graphs" in logs[("ps", 0)] and "RDMADEV_AUTO=1" in logs[("ps", 0)], \
        logs[("ps", 0)][-4000:]


@pytest.mark.tf
def test_half_pairs_past_the_receivers_budget_keep_tfs_path(runs):
    """Every task's RDMADEV_MAX_REGISTERED_BYTES is 4 KiB, smaller than the slots of the
    model's pairs: each receiver keeps its halves on TF's path and tells their sender, and the
    job trains as on gRPC, bit for bit, where its steps failed before."""
    env = {"RDMADEV_MAX_REGISTERED_BYTES": "4K"}
    result, reports, logs = _kept_job(env, tf_cluster.rdmadev_launcher)
    assert result["results"] == runs["grpc"][0]["results"], SAME_AS_GRPC
    routes = {route for _, route in _kept_pairs(reports)}
    assert routes == {f"{task_name('ps', 0)} -> {W0}", f"{W0} -> {task_name('ps', 0)}"}, reports
    for task, log in logs.items():
        assert "stay on TF's gRPC path" in log and "RDMADEV_MAX_REGISTERED_BYTES" in log, \
            f"{task}: {log[-4000:]}"


# Two sessions of one graph in one client share its half pairs (same rendezvous attrs, so the
# same channel keys): closing the first must leave the second's channels bound.
TWO_SESSIONS = """
import json, sys
import numpy as np
import tensorflow as tf
tf.compat.v1.disable_eager_execution()
cluster = json.loads(sys.argv[1])
with tf.Graph().as_default() as g:
    with tf.device("/job:ps/task:0"):
        v = tf.Variable(tf.reshape(tf.range(4096, dtype=tf.float32), [64, 64]) / 9.0,
                        name="two_sessions")
    with tf.device("/job:worker/task:0"):
        y = tf.reduce_sum(tf.matmul(v, v))
    with tf.device("/job:ps/task:0"):
        step = v.assign_add(tf.fill([64, 64], y * 1e-9))
    init = tf.compat.v1.global_variables_initializer()
target = "grpc://" + cluster["worker"][0]
first, second = tf.compat.v1.Session(target, graph=g), tf.compat.v1.Session(target, graph=g)
first.run(init)
a = [first.run(step).tobytes().hex(), second.run(step).tobytes().hex()]
first.close()
a.append(second.run(step).tobytes().hex())
second.close()
print("RESULT " + json.dumps({"values": a}))
"""


@pytest.mark.tf
def test_a_second_session_keeps_the_half_pairs_it_shares_with_a_closed_one(shared):
    results = {rpc_layer: _client_result(shared, TWO_SESSIONS, rpc_layer)
               for rpc_layer in ("grpc", protocol.PROTOCOL)}
    assert results[protocol.PROTOCOL]["values"] == results["grpc"]["values"]



# Conditionals across tasks in a TF1 session, as batch norm under a `training` placeholder
# builds them: a ps variable read only on one branch, a ps variable updated only on the other,
# the branch taken changing every run; and a tf.switch_case reading ps variables in two of its
# three branches. Both TF1 control flows: v2 (If and Case, lowered before partitioning) and v1
# (Switch/Merge built directly). On a branch not taken those tensors are dead, which only TF's
# rendezvous carries: each task must keep its half of them on gRPC (rdmadev's pass marks them
# before the master partitions), and swap the rest.
CONDITIONAL = """
import json, sys
import numpy as np
import tensorflow as tf
tf.compat.v1.disable_eager_execution()
cluster = json.loads(sys.argv[1])
out = []
for flow in ("v2", "v1"):
    (tf.compat.v1.enable_control_flow_v2 if flow == "v2" else tf.compat.v1.disable_control_flow_v2)()
    with tf.Graph().as_default() as g:
        with tf.device("/job:ps/task:0"):
            moving = tf.Variable(tf.reshape(tf.range(256, dtype=tf.float32), [16, 16]) / 7.0,
                                 name="moving")
            w = tf.Variable(tf.ones([16, 16]), name="w")
        with tf.device("/job:worker/task:0"):
            training = tf.compat.v1.placeholder(tf.bool, [])
            x = tf.random.stateless_normal([16, 16], seed=[1, 2])
            mean = tf.cond(training, lambda: tf.reduce_mean(x, 0),
                           lambda: tf.reduce_mean(moving.read_value(), 0))
            update = tf.cond(training, lambda: tf.reduce_sum(w.assign_add(x * 0.01)),
                             lambda: tf.constant(0.0))
            with tf.control_dependencies([update]):  # read after the update: no race between them
                after = w.read_value()
            y = tf.reduce_sum(tf.matmul(x - mean, after)) + update
            index = tf.compat.v1.placeholder(tf.int32, [])
            picked = tf.switch_case(index, [lambda: tf.reduce_sum(moving.read_value()),
                                            lambda: tf.reduce_max(w.read_value()),
                                            lambda: tf.constant(5.0)])

            def body(i, total):  # reads the ps variable, sends a row of sums back each iteration
                rows = tf.reduce_sum(moving.read_value() * tf.cast(i + 1, tf.float32), 0)
                with tf.device("/job:ps/task:0"):
                    return i + 1, total + tf.reduce_sum(rows)
            iterations = tf.compat.v1.placeholder(tf.int32, [])
            looped = tf.while_loop(lambda i, t: i < iterations, body, [tf.constant(0), tf.constant(0.0)])[1]
        init = tf.compat.v1.global_variables_initializer()
    with tf.compat.v1.Session("grpc://" + cluster["worker"][0], graph=g) as s:
        s.run(init)
        out += [s.run(y, {training: t}).tobytes().hex() for t in (True, False, False, True, False)]
        out += [s.run(picked, {index: i}).tobytes().hex() for i in (2, 0, 1, 2, 1)]
        out += [s.run(looped, {iterations: n}).tobytes().hex() for n in (3, 0, 5)]
        out.append(s.run(w).tobytes().hex())
print("RESULT " + json.dumps({"values": out}))
"""


@pytest.mark.tf
def test_conditionals_and_loops_across_tasks_swap_their_halves_with_their_deadness(shared):
    """Each task labels its own half of a pair in a branch or a while loop (TF's _Send or
    _Recv, for rdmadev's kernels, which carry a dead tensor) and runs its loops one iteration
    at a time; the halves meet as any others and give gRPC's values whichever branch runs, for
    loops of 3, 0 and 5 iterations."""
    results = {rpc_layer: _client_result(shared, CONDITIONAL, rpc_layer)
               for rpc_layer in ("grpc", protocol.PROTOCOL)}
    assert results[protocol.PROTOCOL]["values"] == results["grpc"]["values"], \
        "grpc+rdmadev must compute what gRPC computes, whichever branch runs"
    for task, lines in results[protocol.PROTOCOL]["reports"].items():
        text = "\n".join(lines)
        kept = [l for l in text.splitlines() if l.strip().startswith("grpc ")]
        assert not [l for l in kept if "(client_terminated)" not in l], f"{task}:\n{text}"
        # Each control flow: the read on one branch, the update and its value on the other,
        # and (v2) the branch pivots' control edges to ps.
        in_branch = [l for l in text.splitlines() if "rdmadev_in_branch" in l]
        assert len(in_branch) >= 6 and all(" half" in l for l in in_branch), f"{task}:\n{text}"
        # Each control flow's loop: the read of the variable, the row of sums sent back.
        in_loop = [l for l in text.splitlines() if l.endswith(" each loop iteration")]
        assert len(in_loop) >= 4 and all(" half" in l for l in in_loop), f"{task}:\n{text}"


# A TF1 job as TF's own documentation writes it: a global step, MonitoredTrainingSession with
# StopAtStepHook, `while not sess.should_stop()`; an embedding table partitioned over the two ps
# (fixed_size_partitioner), Adam, and a batch-norm-style moving mean read and updated under
# a `training` placeholder (every third run evaluates). The hook reads the global step through
# `initialized_value()`, a tf.cond on whether the ps variable is initialized, which the
# partitioner places on ps (a Switch goes where its data is): every run skips one of its
# branches. Optionally paced (seconds per run) so that the test can kill a ps mid-job.
MONITORED = """
import json, sys, threading, time
import numpy as np
import tensorflow as tf
tf.compat.v1.disable_eager_execution()
cluster, last_step, pace = json.loads(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3])
cut_after, worker_pid = (int(a) for a in sys.argv[4:6]) if len(sys.argv) > 4 else (0, 0)
v1 = tf.compat.v1
if cut_after:  # the rdmadev tcp connections of worker:0 to ps:0 are reset during run cut_after
    import rdmadev
    from rdmadev.cluster import runtime
    from rdmadev.testing import faults
    rdmadev.counters(cluster)  # connects this process's control client
    ps = runtime.current().call("/job:ps/replica:0/task:0", {"op": "ping"})["address"]
    cut = None  # the last cut made, which may still be under way

    def cut_soon():  # resets the connections 10 ms into the run about to start
        global cut
        def reset():
            print("CUT", faults.reset_connections(ps, worker_pid, "tcp"), "connections in run",
                  runs, flush=True)
        cut = threading.Timer(0.01, reset)
        cut.start()
with tf.Graph().as_default():
    setter = v1.train.replica_device_setter(
        worker_device="/job:worker/task:0", cluster=tf.train.ClusterSpec(cluster))
    with v1.device(setter):
        step = v1.train.get_or_create_global_step()
        seed = tf.cast(step, tf.int32)
        table = v1.get_variable("table", [5000, 32], partitioner=v1.fixed_size_partitioner(2),
                                initializer=v1.random_uniform_initializer(seed=1))
        training = v1.placeholder(tf.bool, [])
        ids = tf.random.stateless_uniform([64, 8], seed=[1, seed], maxval=5000, dtype=tf.int64)
        emb = tf.reduce_sum(v1.nn.embedding_lookup(table, ids), 1)
        moving = v1.get_variable("moving_mean", [32], initializer=v1.zeros_initializer(),
                                 trainable=False)
        mean = tf.cond(training, lambda: tf.reduce_mean(emb, 0), lambda: tf.identity(moving))
        update = tf.cond(training, lambda: v1.assign(moving, 0.9 * moving + 0.1 * mean).op,
                         tf.no_op)
        w1 = v1.get_variable("w1", [32, 16], initializer=v1.glorot_uniform_initializer(seed=2))
        w2 = v1.get_variable("w2", [16, 1], initializer=v1.glorot_uniform_initializer(seed=3))
        out = tf.matmul(tf.nn.relu(tf.matmul(emb - mean, w1)), w2)
        labels = tf.random.stateless_uniform([64, 1], seed=[2, seed])
        loss = v1.losses.mean_squared_error(labels, out)
        with tf.control_dependencies([update]):
            train = v1.train.AdamOptimizer(0.01).minimize(loss, global_step=step)

    class Final(v1.train.SessionRunHook):
        sessions = 0

        def after_create_session(self, session, coord):  # the first, and each one opened again
            self.sessions += 1

        def end(self, session):  # the session as the job ends: what it trained
            self.values = session.run([step] + v1.global_variables())
    final = Final()
    hooks = [v1.train.StopAtStepHook(last_step=last_step), final]
    runs = trained = cuts = 0
    evaluated = []
    with v1.train.MonitoredTrainingSession(
            master="grpc://" + cluster["worker"][0], is_chief=True, hooks=hooks) as sess:
        while not sess.should_stop():
            runs += 1
            # A cut that lands after its run fails none if the tasks meet their pairs again
            # before the next, so one is made each run until a run fails (at most 15).
            if (cut_after and cut_after <= runs < cut_after + 15 and final.sessions == 1
                    and not (cut and cut.is_alive())):
                cut_soon()
                cuts += 1
            if runs % 3 == 0:
                evaluated.append(float(sess.run(loss, {training: False})))
            else:
                sess.run(train, {training: True})
                trained += 1
            print("STEP", runs, flush=True)
            time.sleep(pace)
out = {"trained": trained, "evaluated": evaluated, "step": int(final.values[0]), "cuts": cuts,
       "sessions": final.sessions,
       "variables": [np.asarray(v).tobytes().hex() for v in final.values[1:]]}
print("RESULT " + json.dumps(out), flush=True)
"""
LAST_STEP = 30


def _monitored(shared, rpc_layer, kill_ps_after=None, cut_after=None):
    """Runs MONITORED to LAST_STEP on 2 ps + 1 worker: of the shared cluster serving
    `rpc_layer`, or with `cut_after` of the shared tcp one, where the client resets worker:0's
    rdmadev connection to ps 0 during that run; with `kill_ps_after`, of a cluster of its own,
    whose ps 0 it kills (SIGKILL; it holds the global step and half the table) once the client
    has run that many times and starts again on its address. Returns the client's RESULT, with
    (rdmadev) the transfers and reports of the tasks meanwhile, and its output."""
    env = {**ENV, "RDMADEV_FABRIC": "tcp"} if cut_after else ENV
    if kill_ps_after:
        cluster = tf_cluster.Cluster(num_ps=2, num_workers=1, env=env,
                                     launcher=tf_cluster.protocol_launcher(rpc_layer)).start()
    else:
        cluster = shared.cluster(rpc_layer, tcp=bool(cut_after))
    spec = _spec(cluster, 2, 1)
    ours = rpc_layer == protocol.PROTOCOL
    try:
        if ours:
            moved = {t: c["transfers"] for t, c in shared.counters(cluster, spec).items()}
            reported = shared.reports(cluster, spec)
        pace = "0.05" if kill_ps_after or cut_after else "0"
        cut = [str(cut_after), str(cluster.pid("worker", 0))] if cut_after else []
        p = subprocess.Popen([sys.executable, "-c", MONITORED, json.dumps(spec), str(LAST_STEP),
                              pace, *cut], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                             text=True, env={**os.environ, **env})
        timer = threading.Timer(CLIENT_TIMEOUT_S, p.kill)
        timer.start()
        lines = []
        try:
            for line in p.stdout:
                lines.append(line)
                if kill_ps_after and line.strip() == f"STEP {kill_ps_after}":
                    cluster.kill("ps", 0)
                    cluster.restart("ps", 0)
            p.wait()
        finally:
            timer.cancel()
            p.kill()
        output = "".join(lines)
        result = _printed(p.returncode, output, "RESULT ")
        if ours:
            # (A cluster of its own starts at 0: a restarted ps counts from 0 again.)
            result["transfers"] = {t: c["transfers"] - moved[t]
                                   for t, c in shared.counters(cluster, spec).items()}
            result["reports"] = _new_reports(reported, shared.reports(cluster, spec))
        return result, output
    finally:
        if kill_ps_after:
            cluster.stop()


def _tail(output):
    """The end of MONITORED's output, without its RESULT (the variables, in hex)."""
    return "".join(l for l in output.splitlines(True) if not l.startswith("RESULT "))[-4000:]


@pytest.fixture(scope="module")
def monitored_on_grpc(shared):
    """MONITORED's RESULT on gRPC: what an uninterrupted job trains."""
    return _monitored(shared, "grpc")[0]


@pytest.mark.tf
def test_monitored_training_session_with_a_global_step_trains_as_on_grpc(shared, monitored_on_grpc):
    grpc = monitored_on_grpc
    ours, _ = _monitored(shared, protocol.PROTOCOL)
    assert grpc["step"] == ours["step"] == ours["trained"] == LAST_STEP
    assert ours["evaluated"] == grpc["evaluated"] and ours["variables"] == grpc["variables"], \
        "grpc+rdmadev must train what gRPC trains"
    assert all(ours["transfers"].values()), f"a task moved nothing over rdmadev: {ours['transfers']}"
    # The worker's halves of the ids it partitions between the ps (64 x 8 int64 at most each)
    # know their bound, and each ps's receiving half took its slots from it, not 1 MiB.
    worker = "\n".join(ours["reports"]["/job:worker/replica:0/task:0"])
    ids = re.findall(r"^  send half .* edge_\d+_embedding_lookup/DynamicPartition DT_INT64 (.*)$", worker, re.M)
    assert len(ids) >= 2 and set(ids) == {"run-time shape, slots of 4096 B (its bound from TF's shapes)"}, worker


@pytest.mark.tf
@pytest.mark.slow
def test_monitored_training_session_recovers_from_a_killed_ps(shared, monitored_on_grpc):
    """kill -9 of a ps mid-job, then the ps started again: MonitoredTrainingSession sees the
    run fail (rdmadev's error for a lost peer is TF's UnavailableError, which it recovers
    from), opens a new session (the chief initializes every variable again: no checkpoint)
    and trains on to LAST_STEP, swapping the new session's halves as well. The training steps
    after the restart are those of an uninterrupted run, so are the final variables."""
    ours, output = _monitored(shared, protocol.PROTOCOL, kill_ps_after=15)
    assert ours["step"] == LAST_STEP and ours["trained"] > LAST_STEP, _tail(output)
    assert all(ours["transfers"].values()), f"a task moved nothing over rdmadev: {ours['transfers']}"
    assert ours["variables"] == monitored_on_grpc["variables"]


@pytest.mark.tf
def test_monitored_training_session_trains_on_through_a_connection_cut_mid_step(
        shared, monitored_on_grpc):
    """worker:0's rdmadev connection to ps 0 is reset, both tasks running on, 10 ms into a
    run and again each run until a run fails (the runs are short: a cut often lands after its
    run, and fails none when the tasks met their pairs again before the next): the run that
    fails fails as Unavailable, MonitoredTrainingSession opens a new
    session (whose halves are offered while the old ones are met again: one setup at a time;
    the chief initializes every variable again: no checkpoint), and the job trains to
    LAST_STEP over rdmadev, ending where an uninterrupted job ends."""
    netns.require("ss")
    ours, output = _monitored(shared, protocol.PROTOCOL, cut_after=12)
    assert ours["sessions"] >= 2 and ours["step"] == LAST_STEP and ours["trained"] > LAST_STEP, \
        f"{ours['cuts']} cuts, {ours['sessions']} sessions:\n" + _tail(output)
    assert all(ours["transfers"].values()), f"a task moved nothing over rdmadev: {ours['transfers']}"
    assert ours["variables"] == monitored_on_grpc["variables"]


# A plain TF1 session (no MonitoredTrainingSession to open it again) over the tcp fabric. Each
# step reads the ps's variable on the worker and sends back what the ps adds to it (a pair
# each way). The rdmadev connection between worker:0 and the ps is reset (ss -K) twice: once
# with no step running, then while a thread runs steps back to back, each time until both tasks
# set their half pairs up again; the session runs on. argv: cluster spec, worker:0's pid.
CUT = """
import json, os, sys, threading, time
import numpy as np
import tensorflow as tf
import rdmadev
from rdmadev.cluster import runtime
from rdmadev.testing import faults
tf.compat.v1.disable_eager_execution()
v1 = tf.compat.v1
cluster, worker_pid = json.loads(sys.argv[1]), int(sys.argv[2])
PS, W0 = "/job:ps/replica:0/task:0", "/job:worker/replica:0/task:0"

def cut_and_wait():
    before = rdmadev.counters(cluster)
    cut = faults.reset_connections(ps, worker_pid, "tcp")
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:  # until both set their pairs up again (bounded)
        now = rdmadev.counters(cluster)
        if all(now[t]["reopened"] > before[t]["reopened"] for t in (PS, W0)):
            break
        time.sleep(0.2)
    return cut, {t: now[t]["reopened"] - before[t]["reopened"] for t in (PS, W0)}

with tf.Graph().as_default():
    with tf.device("/job:ps/task:0"):
        v = v1.get_variable("v", [1024], initializer=v1.zeros_initializer())
    with tf.device("/job:worker/task:0"):
        delta = tf.floor(v * 0.001) + tf.range(1, 1025, dtype=tf.float32)
    with tf.device("/job:ps/task:0"):
        train = v1.assign_add(v, delta)
    with v1.Session("grpc://" + cluster["worker"][0]) as sess:
        sess.run(v1.global_variables_initializer())
        out = {"values": [sess.run(train).tobytes().hex() for _ in range(3)]}
        rdmadev.counters(cluster)  # connects this process's control client
        ps = runtime.current().call(PS, {"op": "ping"})["address"]
        out["idle"] = cut_and_wait()
        out["values"] += [sess.run(train).tobytes().hex() for _ in range(3)]
        runs = {"ok": 0, "failed": [], "stop": threading.Event()}

        def steps():  # bounded: stopped below, and each step ends by the tasks' deadline
            while not runs["stop"].is_set():
                try:
                    sess.run(train)
                    runs["ok"] += 1
                except (tf.errors.UnavailableError, tf.errors.AbortedError) as e:
                    runs["failed"].append(type(e).__name__ + ": " + e.message[:300])
        stepping = threading.Thread(target=steps)
        stepping.start()
        time.sleep(0.5)
        out["running"] = cut_and_wait()
        after, deadline = runs["ok"], time.monotonic() + 120
        out["failed_before_reopened"] = len(runs["failed"])
        while runs["ok"] < after + 10 and time.monotonic() < deadline:
            time.sleep(0.1)
        moved = rdmadev.counters(cluster)
        time.sleep(0.5)
        runs["stop"].set()
        stepping.join()
        out["moved"] = {t: c["transfers"] - moved[t]["transfers"]
                        for t, c in rdmadev.counters(cluster).items()}
        out.update(ok=runs["ok"], failed=len(runs["failed"]), failures=runs["failed"][:3],
                   final=sess.run(v).tobytes().hex())
print("RESULT " + json.dumps(out), flush=True)
"""


@pytest.mark.tf
def test_a_session_whose_connection_to_the_ps_was_cut_trains_on_over_rdmadev(shared):
    """The half pairs of a session whose rdmadev connection broke, both tasks running on, are
    met again (each by its receiving task), and the same session's next steps run on them.
    Cut with no step running, no step fails and every value is what the same arithmetic
    gives in numpy; cut mid-step, the steps it hit fail as transient (Unavailable or
    Aborted), the later ones move over rdmadev, and the variable holds exactly the
    applications of the steps that ran (a failed one may have been applied on the ps)."""
    netns.require("ss")
    cluster = shared.cluster(protocol.PROTOCOL, tcp=True)
    p = subprocess.run([sys.executable, "-c", CUT, json.dumps(_spec(cluster, 1, 1)),
                        str(cluster.pid("worker", 0))], capture_output=True, text=True,
                       timeout=CLIENT_TIMEOUT_S, env={**os.environ, **ENV, "RDMADEV_FABRIC": "tcp"})
    r = _printed(p.returncode, p.stdout + p.stderr, "RESULT ")
    ps = "/job:ps/replica:0/task:0"
    for when in ("idle", "running"):
        cut, reopened = r[when]
        # each task receives on a half pair, so each met one again (a region from the other)
        assert cut >= 1 and reopened[ps] >= 1 and reopened[W0] >= 1, (when, r)
    x = np.arange(1, 1025, dtype=np.float32)
    applied = [np.zeros(1024, np.float32)]
    for _ in range(6 + r["ok"] + r["failed"]):
        applied.append(applied[-1] + (np.floor(applied[-1] * np.float32(0.001)) + x))
    assert r["values"] == [a.tobytes().hex() for a in applied[1:7]]
    assert r["ok"] >= 10 and all(n > 0 for n in r["moved"].values()), r
    # Steps fail (at once) from the cut until both tasks met their pairs again; of those
    # begun before that, at most the two in flight then fail after it.
    assert r["failed"] >= 1 and r["failed"] - r["failed_before_reopened"] <= 2, r
    for failure in r["failures"]:
        assert failure.startswith("UnavailableError") and "connection" in failure, failure
    ran = [a.tobytes().hex() for a in applied[6 + r["ok"]:]]
    assert r["final"] in ran, "the variable is not the result of the steps that ran"
