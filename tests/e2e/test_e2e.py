"""rdmadev.optimize end to end on a real loopback cluster of `rdmadev serve` tasks: the
same numbers as TF's own gRPC path, bit for bit, with the tensors moved by rdmadev."""
import os
import re

import pytest

from e2e_util import run_driver, run_many

pytestmark = pytest.mark.tf


#: Scenarios whose gRPC run is another's: rdmadev.optimize of the model's train_step changes
#: nothing on TF's own path.
SAME_ON_GRPC = {"keras_optimize": "keras"}
#: Scenarios run with rdmadev's default settings, one after the other in one coordinator
#: process per group, gRPC's run of each first, when a test first asks for one of them: one TF
#: import and one remote context for the group. The ParameterServerStrategy ones share the
#: process's strategy over one worker (pss2's has two: a process of its own).
GROUPS = (("train", "conv", "batch_norm", "noop", "big", "retrace", "loop", "cond", "overlapping",
           "bundles", "mixed", "underbound", "tf1", "profile", "keras", "keras_optimize",
           "keras_loop"),
          ("pss1", "tf_function", "keras2"))
_on_grpc, _grouped = {}, {}
#: A group's process: TF import, connecting, and each scenario's gRPC and rdmadev runs.
GROUP_TIMEOUT_S = 1200


def run_both(cluster, scenario, env=None):
    """(gRPC's result, rdmadev's) for `scenario`: from its group's process (GROUPS), or with
    `env` (rdmadev's settings: one process's) in a process of its own, TF's own path run once
    per scenario in the session (its result depends on none of those settings)."""
    baseline = SAME_ON_GRPC.get(scenario, scenario)
    group = next((g for g in GROUPS if scenario in g), None)
    if not env and group is not None:
        if ("rdmadev", scenario) not in _grouped:
            runs = list(dict.fromkeys(r for s in group
                                      for r in (("grpc", SAME_ON_GRPC.get(s, s)), ("rdmadev", s))))
            _grouped.update(zip(runs, run_many(cluster, runs, timeout=GROUP_TIMEOUT_S)))
        grpc, rdma = _grouped[("grpc", baseline)], _grouped[("rdmadev", scenario)]
    elif baseline in _on_grpc:
        grpc, rdma = _on_grpc[baseline], run_driver(cluster, "rdmadev", scenario, env=env)
    else:
        grpc, rdma = run_many(cluster, [("grpc", baseline), ("rdmadev", scenario)], env=env)
    for result in (grpc, rdma):
        assert "error" not in result, result["error"]
    _on_grpc[baseline] = grpc
    return grpc, rdma


def _swapped(report):
    return [int(n) for n in re.findall(r"(\d+) transfers swapped", report)]


def test_training_is_bitwise_identical(cluster):
    grpc, rdma = run_both(cluster, "train")
    assert len(rdma["losses"]) == 30
    assert rdma["losses"] == grpc["losses"]
    assert rdma["w"] == grpc["w"] and rdma["b"] == grpc["b"]
    assert _swapped(rdma["report"]) and _swapped(rdma["report"])[0] >= 6
    # Both directions moved: variable reads ps -> workers, gradients workers -> ps.
    assert re.search(r"ps/replica:0/task:0 -> /job:worker", rdma["report"])
    assert re.search(r"worker/replica:0/task:\d -> /job:ps", rdma["report"])


@pytest.mark.parametrize("aliased", [False, True], ids=["copied", "aliased"])
def test_conv_with_bias_gradient(cluster, aliased):
    """Regression: oneDNN's fused conv filter+bias gradient op has a wrong shape function
    for the bias; the channel must still get the right size (or stay on gRPC). Aliased: with
    RDMADEV_ZERO_COPY_MIN_BYTES=1 the worker's convolutions (oneDNN's forward and input
    gradient ops) read the filter in its slot (a bundle's tensors are copied: without
    bundles). Copied: the small filters share one bundle, copied out of its slot."""
    grpc, rdma = run_both(cluster, "conv", env={"RDMADEV_ZERO_COPY_MIN_BYTES": "1",
                                                "RDMADEV_BUNDLE_BELOW_BYTES": "0"} if aliased else {})
    assert rdma["losses"] == grpc["losses"] and rdma["bias"] == grpc["bias"]
    assert _swapped(rdma["report"])
    for conv, nbytes in (("Conv2D", 864), ("Conv2D_1", 1152)):
        read = re.search(rf"^\s*(\S+)\s.*ps/replica:0/task:0 -> \S+\s+edge_\d+_{conv}/ReadVariableOp "
                         rf"DT_FLOAT {nbytes} B$", rdma["report"], re.M)
        assert read and read.group(1) == ("shm+zc" if aliased else "shm"), rdma["report"]
        bundle = re.search(rf"^\s*\S+\s+(bundle \w+\s+)?\S+ -> \S+\s+edge_\d+_{conv}/ReadVariableOp DT_FLOAT", rdma["report"], re.M)
        assert bundle and bool(bundle.group(1)) != aliased, rdma["report"]


def test_batch_norm_statistics_and_gradients_have_static_channels(cluster):
    """oneDNN's batch norm ops register TF's own shape functions for outputs 1 and 2 (the
    batch statistics, the scale and offset gradients): trusted, each is a 32-byte static
    channel instead of a run-time-shaped one of two 1 MiB slots, and the values match gRPC."""
    grpc, rdma = run_both(cluster, "batch_norm")
    assert rdma["losses"] == grpc["losses"] and rdma["state"] == grpc["state"]
    report = rdma["report"]
    to_ps = re.findall(r"^\s*\S+(?: bundle \w+)?\s+/job:worker/replica:0/task:0 -> /job:ps/replica:0/task:0  (\S+) "
                       r"DT_FLOAT (.+)$",
                       report, re.M)
    assert len(to_ps) == 5 and "run-time shape" not in report, report  # the filter's gradient and four [8]
    assert sorted(size for _, size in to_ps) == ["32 B"] * 4 + ["864 B"], report


def test_function_without_cross_task_pair_is_left_alone(cluster):
    grpc, rdma = run_both(cluster, "noop")
    assert rdma["values"] == grpc["values"] == [32.0, 48.0, 64.0]
    assert rdma["report"] == "rdmadev: no cross-task transfer in this function (nothing to rewrite)"


def test_64_mib_transfers_both_ways(cluster):
    grpc, rdma = run_both(cluster, "big")
    assert rdma["values"] == grpc["values"] and rdma["digest"] == grpc["digest"]
    assert "67108864 B" in rdma["report"]
    # Static channels have one slot: each task registers about the bytes a step moves into it
    # (issue 13's target: at most 1.1x), where two slots registered twice that.
    ratios = re.findall(r"^\s*registered on /job:(ps|worker)\S*: \d+ B for (\d+) B a step \(([\d.]+)x\)$",
                        rdma["report"], re.M)
    assert {job for job, _, _ in ratios} == {"ps", "worker"}, rdma["report"]
    assert all(int(moved) >= 64 << 20 and float(x) <= 1.1 for _, moved, x in ratios), rdma["report"]


def test_retracing_and_two_functions(cluster):
    grpc, rdma = run_both(cluster, "retrace")
    assert rdma["values"] == grpc["values"]
    assert all(_swapped(r) for r in rdma["reports"])


def test_wrong_secret_is_a_clear_error_not_a_silent_fallback(cluster):
    proc = run_driver(cluster, "rdmadev", "train", env={"RDMADEV_SECRET": "not-the-secret"},
                      expect_ok=False)
    assert proc.returncode != 0
    assert "rdmadev.optimize cannot use task" in proc.stderr and "RDMADEV_SECRET" in proc.stderr


def test_tasks_started_without_rdmadev_give_a_clear_error():
    """Plain TF servers (no `rdmadev serve`): the optimized call fails and says how to fix it,
    in-graph and under ParameterServerStrategy (where the worker would otherwise run the step
    on gRPC without a word)."""
    from e2e_util import tf_cluster
    plain = tf_cluster.shared_cluster()  # the session's plain TF servers (the planner's tests')
    procs = [run_driver(plain, "rdmadev", scenario, expect_ok=False) for scenario in ("train", "pss1")]
    for proc in procs:
        assert proc.returncode != 0
        assert "rdmadev.optimize cannot use task" in proc.stderr and "rdmadev serve" in proc.stderr


@pytest.mark.parametrize("workers", [1, 2])
def test_parameter_server_strategy(cluster, workers):
    """rdmadev.optimize(step) is scheduled by ClusterCoordinator; the worker running each step
    partitions it and rewrites it because the step's name carries the opt-in (RDMADEV_AUTO is
    off in the tasks). Steps are joined one by one, so even two workers apply them in the same
    order as gRPC and the results stay bitwise identical."""
    grpc, rdma = run_both(cluster, f"pss{workers}")
    assert rdma["losses"] == grpc["losses"] and rdma["w"] == grpc["w"] and rdma["b"] == grpc["b"]
    assert rdma["total"] == grpc["total"]
    report = "\n".join(rdma["reports"])
    assert "5 transfers swapped, 0 stayed on gRPC" in report
    # the cross-task control edge went through rdmadev too, as a signal
    assert re.search(r"^\s*shm\s.*GroupCrossDeviceControlEdges\S* control edge \(orders execution, "
                     r"carries no data\)$", report, re.M), report
    assert re.search(r"step__rdmadev_[0-9a-f]{8}_\d+ on /job:worker/replica:0/task:\d", report)
    # the step's reports come from every worker that ran it; the unwrapped function was not planned
    ran_on = set(re.findall(r"on (/job:worker/replica:0/task:\d)", report))
    assert ran_on and ran_on <= {f"/job:worker/replica:0/task:{k}" for k in range(workers)}
    assert not any("unwrapped" in r for r in rdma["all_reports"])


def test_optimize_returns_a_genuine_tf_function(cluster):
    """Called inside strategy.run from a plain scheduled tf.function, the optimized function
    still opts its caller's instantiation in; it keeps TF's tracing and exports."""
    grpc, rdma = run_both(cluster, "tf_function")
    assert rdma["values"] == grpc["values"]
    assert rdma["is_tf_function"] and rdma["name"] == "replica_step"
    assert rdma["concrete_inputs"][0] == "(None, 16)"  # then the captured variable
    assert rdma["tracing_counts"] == grpc["tracing_counts"] == [0, 1, 2, 2]
    assert rdma["exported"] == grpc["exported"] == [2.0, 2.0]
    report = "\n".join(rdma["reports"])
    assert re.search(r"transfers swapped", report) and "__inference_step_" in report


@pytest.mark.parametrize("scenario", ["keras", "keras_optimize", "keras_loop"])
def test_keras_fit(cluster, scenario):
    """`fit` unchanged with RDMADEV_AUTO in the tasks, or the model's train_step wrapped by
    rdmadev.optimize, or unchanged with `steps_per_execution=4` (Keras runs the steps in a
    while loop, whose pairs move each iteration); the same losses as gRPC every way."""
    grpc, rdma = run_both(cluster, scenario)
    assert len(rdma["loss"]) == 3 and rdma["loss"] == grpc["loss"]
    assert rdma["weights"] == grpc["weights"]
    report = "\n".join(rdma["reports"])
    assert "DT_INT64" in report and "sgd/Mul" in report
    if scenario == "keras_loop":
        looped = re.findall(r"^\s*(\S+)\s.*sgd/Mul\S* DT_FLOAT \d+ B each loop iteration$", report, re.M)
        assert looped and set(looped) <= {"shm", "shm+zc"}, report
        assert re.search(r"\(__inference_multi_step_on_iterator_\d+ on /job:worker/replica:0/task:0\): "
                         r"\d+ transfers swapped, 0 stayed on gRPC", report), report


def test_tf_keras_fit_under_parameter_server_strategy(cluster):
    """Keras 2 (tf_keras) `model.fit` under ParameterServerStrategy, the model's train_step
    wrapped by rdmadev.optimize and fit otherwise unchanged: the train function fit schedules
    is rewritten by the worker (train_step is traced into it under its marked scope), the
    losses and weights equal gRPC's bit for bit, and dropping the model frees what every task
    held for it."""
    grpc, rdma = run_both(cluster, "keras2")
    assert len(rdma["loss"]) == 3 and rdma["loss"] == grpc["loss"]
    assert rdma["weights"] == grpc["weights"]
    report = "\n".join(rdma["reports"])
    assert "__inference_train_function_" in report and _swapped(report)[0] >= 8
    # Variables ps -> worker and their gradients worker -> ps, inside train_step's scope.
    assert re.search(r"ps/replica:0/task:0 -> /job:worker.*train_step__rdmadev_[0-9a-f]+/sequential", report)
    assert re.search(r"worker/replica:0/task:0 -> /job:ps.*gradient_tape/train_step__rdmadev_", report)
    before, during, after = rdma["counters"]
    for task in ("/job:ps/replica:0/task:0", "/job:worker/replica:0/task:0"):
        assert during[task]["channels"] >= 8, during[task]
        for what in ("channels", "regions", "registered_bytes", "memfd_maps"):
            assert after[task][what] == before[task][what], (task, what, before, after)


@pytest.fixture(scope="module")
def doomed():
    """A cluster of `rdmadev serve` tasks whose tasks the kill tests kill (each starts its
    victim again afterwards), apart from the one the other tests share."""
    from e2e_util import ENV, rdmadev_launcher, tf_cluster
    with tf_cluster.Cluster(env=ENV, launcher=rdmadev_launcher) as c:
        yield c


@pytest.mark.parametrize("victim, survivor, scenario", [
    (("worker", 1), ("ps", 0), "train_until_killed"), (("ps", 0), ("worker", 0), "train_until_killed"),
    (("ps", 0), ("worker", 0), "loop_until_killed")])
def test_killing_a_task_fails_training_promptly(doomed, victim, survivor, scenario):
    """A task dies mid-training, or in the middle of a while loop whose pairs move each
    iteration: the coordinator gets an error naming it (never a hang), whichever error reached
    TF first (rdmadev's, or TF's own RPC to the task failing with "Connection reset by peer",
    which rdmadev.optimize then names), the other tasks keep serving, nothing is left in
    /dev/shm."""
    import json
    import subprocess
    import sys
    from e2e_util import ENV, HERE
    before = set(os.listdir("/dev/shm"))
    driver = subprocess.Popen(
        [sys.executable, os.path.join(HERE, "driver.py"), json.dumps(doomed.spec), "rdmadev",
         scenario], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2", **ENV})
    try:
        for line in driver.stdout:
            if line.startswith("STEP 5"):
                break
        doomed.kill(*victim)
        _, err = driver.communicate(timeout=120)  # well inside RDMADEV_DEADLINE_S=60 x 2
    finally:
        if driver.poll() is None:
            driver.kill()
    assert driver.returncode != 0
    assert "Error" in err and f"/job:{victim[0]}/replica:0/task:{victim[1]}" in err, err[-3000:]
    assert doomed.pid(*survivor) and doomed._procs[survivor][0].poll() is None
    assert set(os.listdir("/dev/shm")) <= before
    doomed.restart(*victim)


def test_pairs_inside_while_loops_move_in_iteration_order(cluster):
    """A loop's iterations may run ahead of each other (parallel_iterations), while a channel
    carries its transfers in order, and its exit iteration sends a dead tensor: the pass
    labels TF's own _Send/_Recv for rdmadev's kernels and runs each loop around them, nested
    ones too, one iteration at a time. Loops of 3, 5 and 0 iterations, run by the coordinator,
    by worker:0 and nested, and one whose tensors grow past their channel's capacity from one
    iteration to the next, give gRPC's values bitwise; every pair in a loop moves over shm,
    and only the coordinator's pairs stay on gRPC."""
    grpc, rdma = run_both(cluster, "loop")
    assert rdma["values"] == grpc["values"] and len(rdma["values"]) == 3
    assert grpc["values"][2][1:] == [0.0] * 5 and len(set(grpc["values"][0])) == 4, grpc["values"]
    report = rdma["report"]
    kept = re.findall(r"^\s*grpc\s.*\((\w+)\)$", report, re.M)
    assert set(kept) == {"client_task"}, report
    looped = re.findall(r"^\s*(\S+)\s.* each loop iteration$", report, re.M)
    assert len(looped) >= 11 and set(looped) <= {"shm", "shm+zc"}, report
    # The growing loop's rows (the other loops' reads from ps have static shapes).
    assert re.search(r"^\s*shm\S*\s+/job:ps\S* -> /job:worker\S*\s+\S+ DT_FLOAT "
                     r"run-time shape, slots of \d+ B each loop iteration$", report, re.M), report
    assert re.search(rf"^\s*{len(looped)} swapped in while loops: their loops run one iteration at a time",
                     report, re.M), report
    assert re.search(r"ps/replica:0/task:0 -> /job:worker/replica:0/task:0  edge_\d+_ReadVariableOp DT_FLOAT "
                     r"16384 B$", report, re.M), report


def test_pairs_inside_a_conditional_branch_move_with_their_deadness(cluster):
    """On the branch not taken, a lowered tf.cond's tensors are dead, and TF runs no custom op
    on a dead input (a swapped pair's receive would wait for a write that never comes). The
    pass keeps TF's own _Send/_Recv for such pairs, labelled for rdmadev's kernels, which TF
    does run on a dead input: the sender writes the deadness, the receiver outputs a dead
    tensor. Every pair of both branches moves, over steps that take the branch, skip it
    twice in a row and take it again, bitwise as on gRPC, those of the while loop inside a
    branch included."""
    grpc, rdma = run_both(cluster, "cond")
    assert rdma["values"] == grpc["values"] and grpc["values"][1] == grpc["values"][2] == [-2.0, -2.0]
    report = rdma["report"]
    kept = re.findall(r"^\s*grpc\s.*\((\w+)\)$", report, re.M)
    assert set(kept) == {"client_task"}, report
    assert re.search(r"^\s*shm\S*\s.*each loop iteration$", report, re.M), report
    in_branch = [line.split()[0] for line in report.splitlines()  # between ps and worker:0
                 if "rdmadev_in_branch" in line and not line.endswith("(client_task)")]
    assert len(in_branch) >= 6 and set(in_branch) <= {"shm", "shm+zc"}, report
    assert re.search(r"^\s*shm\s+/job:ps/replica:0/task:0 -> /job:worker/replica:0/task:0\s+edge_\d+_cond/then/"
                     r"\S+/MatMul/ReadVariableOp/rdmadev_in_branch\S* DT_FLOAT 16384 B$", report, re.M), report
    assert re.search(r"^\s*shm\s+/job:worker/replica:0/task:0 -> /job:ps/replica:0/task:0\s+edge_\d+_cond/"
                     r"output\S* DT_FLOAT 4 B$", report, re.M), report


def test_calls_from_two_threads_at_once_give_grpcs_values(cluster):
    """TF runs two calls of one function concurrently; a channel carries one step at a time
    (the next step reuses its slot), so rdmadev.optimize runs them one after the other.
    Before it did, the second call failed at once with "all 1 slots are held"."""
    grpc, rdma = run_both(cluster, "overlapping")
    assert grpc["errors"] == [] and rdma["errors"] == [], rdma["errors"]
    assert rdma["values"] == grpc["values"] and [len(v) for v in rdma["values"]] == [12, 12]
    assert re.search(r"^\s*shm\+zc\s.*ReadVariableOp DT_FLOAT 262144 B$", rdma["report"], re.M), \
        rdma["report"]


def test_small_tensors_of_a_step_share_a_bundle_and_give_grpcs_values(cluster):
    grpc, rdma = run_both(cluster, "bundles")
    for key in ("values", "f", "n", "flags"):
        assert rdma[key] == grpc[key], key
    rows = re.findall(r"^\s*shm\s+(?:bundle (\w+)\s+)?(\S+) -> (\S+)\s+(\S+) (DT_\w+) (\d+) B$",
                      rdma["report"], re.M)
    to_worker = [(bundle, name, dtype, int(size)) for bundle, frm, to, name, dtype, size in rows
                 if "ps" in frm and "worker" in to]
    # the round trip's answer comes at level 2, with the read of f after its update
    (later,) = {bundle for bundle, name, _, _ in to_worker if "stack" in name}
    first = {bundle for bundle, _, _, size in to_worker if bundle and bundle != later}
    assert later and len(first) == 1, rdma["report"]
    members = [(dtype, size) for bundle, _, dtype, size in to_worker if bundle in first]
    assert sorted(members) == [("DT_BOOL", 3), ("DT_FLOAT", 128), ("DT_HALF", 12), ("DT_INT32", 32),
                               ("DT_INT64", 16)], rdma["report"]
    assert [bundle for bundle, _, _, size in to_worker if size == 16384] == [""], rdma["report"]  # its own


def test_strings_stay_on_grpc_and_dynamic_shapes_move(cluster):
    grpc, rdma = run_both(cluster, "mixed")
    assert rdma["values"] == grpc["values"]
    report = rdma["report"]
    assert "2 transfers swapped" in report
    assert "AsString (non_plain_dtype)" in report
    # tf.boolean_mask picks at most all 100 floats of v (its tf.where is bounded by the mask's
    # elements): the channel's slots hold 400 B, not RDMADEV_DYNAMIC_CAPACITY's 1 MiB.
    assert re.search(r"boolean_mask/GatherV2\S* DT_FLOAT run-time shape, slots of 400 B \(its bound "
                     r"from TF's shapes\)$", report, re.M), report


@pytest.mark.parametrize("env", [{"RDMADEV_DYNAMIC_CAPACITY": "1M"}, {"RDMADEV_DYNAMIC_CAPACITY": "256"},
                                 {"RDMADEV_ZERO_COPY_MIN_BYTES": "1"}], ids=["1M", "256", "aliased"])
def test_an_embedding_step_with_run_time_shapes_is_bitwise_identical(cluster, env):
    """tf.unique'd ids, gathered rows and IndexedSlices gradients move through rdmadev, batches
    and sequence lengths changing (ragged, empty); with 256-byte slots every tensor but the
    smallest arrives in chunks; with RDMADEV_ZERO_COPY_MIN_BYTES=1 every tensor whose consumers
    keep nothing is aliased in its slot (ids read by ResourceGather, rows by GatherV2, gradient
    values by Mul, their indices by ResourceScatterSub, a shape's slices by ConcatV2). Nothing
    of a plain-bytes dtype stays on gRPC but the coordinator's arguments and results."""
    grpc, rdma = run_both(cluster, "sparse", env=env)
    assert rdma["losses"] == grpc["losses"] and rdma["unique"] == grpc["unique"]
    assert rdma["table"] == grpc["table"] and rdma["dense"] == grpc["dense"]
    assert 0 in rdma["unique"] and max(rdma["unique"]) * 64 > 4 * 256  # empty and chunked steps
    report = rdma["report"]
    kept = re.findall(r"\((\w+)\)\s*$", report, re.M)
    assert set(kept) <= {"client_task"}, report
    assert report.count("run-time shape") >= 3, report
    # Aliased where every consumer keeps nothing: the ids (ResourceGather, ResourceScatterSub),
    # the rows (GatherV2), the gradients (Mul), a shape (its slices reach ConcatV2).
    aliased = set(re.findall(r"^\s*shm\+zc\s+\S+ -> \S+\s+edge_\d+_(\S+) \S+ run-time shape", report, re.M))
    assert aliased == {"Unique", "Gather", "gradient_tape/Gather/Reshape",
                       "gradient_tape/MatMul/MatMul_1", "gradient_tape/Shape_4"}, report


def test_views_of_received_tensors_read_them_in_their_slots(cluster):
    """With RDMADEV_ZERO_COPY_MIN_BYTES=1 a tensor read through a view (Reshape, ExpandDims,
    Squeeze, Slice, StridedSlice, a same-type Cast, Transpose) by ops that keep nothing is
    aliased in its slot, and so are rows stacked (Pack) or concatenated (ConcatV2) with
    others, summed by a segment reduction (UnsortedSegmentSum, SparseSegmentSum) and gathered
    rows stitched by a sharded lookup; one whose view is the function's result is copied, and
    so is one whose slice plus one is assigned to a variable (aliased, the variable took the
    slot over and the next step failed: "all 1 slots are held"). Bitwise equal to gRPC over
    steps whose bytes all differ."""
    grpc, rdma = run_both(cluster, "views", env={"RDMADEV_ZERO_COPY_MIN_BYTES": "1"})
    assert rdma["sums"] == grpc["sums"] and rdma["kept"] == grpc["kept"] and rdma["held"] == grpc["held"]
    report = rdma["report"]
    fabric = dict((name, f) for f, name in re.findall(r"^\s*(\S+)\s+\S+ -> \S+\s+edge_\d+_for_(\w+) ", report, re.M))
    read = ("Reshape", "ExpandDims", "Squeeze", "Slice", "StridedSlice", "Cast", "Transpose",
            "UnsortedSegmentSum", "SparseSegmentSum", "Pack", "ConcatV2")  # driver.VIEWS + driver.FRESH
    assert fabric == {**{v: "shm+zc" for v in read}, "result": "shm", "held": "shm"}, report
    rows = re.findall(r"^\s*(\S+)\s+\S+ -> \S+\s+edge_\d+_embedding_lookup/\S+ DT_FLOAT run-time shape", report, re.M)
    assert rows == ["shm+zc", "shm+zc"], report


def test_a_channel_grows_past_its_capacity_mid_training(cluster):
    """A dynamic tensor larger than its 4 KiB slots is staged once (the worker copies it into
    a region of its own, ps reads it from there); ps then moves the channel to slots that
    hold it (a re-registration, counted as grown) and later steps of up to that size go in
    one slot; a much larger one is staged and grows it once more, a tensor of 0 elements
    moves too, and smaller ones never grow it again. Bitwise equal to gRPC."""
    grpc, rdma = run_both(cluster, "growing", env={"RDMADEV_DYNAMIC_CAPACITY": "4K"})
    assert rdma["values"] == grpc["values"]
    # 12000 B past 4 KiB slots, then 400000 B past the 64 KiB ones: one transfer each.
    assert rdma["chunks"] == [1, 1, 1, 1, 1, 1, 1], rdma["chunks"]
    assert rdma["staged"] == [1, 0, 0, 1, 0, 0, 0], rdma["staged"]
    assert rdma["grown"] == [1, 0, 0, 1, 0, 0, 0], rdma["grown"]


def test_a_tensor_past_the_bound_tf_gave_it_moves_and_grows_its_channel(cluster):
    """A bound only sizes slots: a tensor larger than it (the bound of 4096 - len(unique ids)
    is too small, subtraction not being monotone) is staged, the channel grows to hold it, and
    the values are gRPC's; a later tensor within the grown slots is not staged."""
    grpc, rdma = run_both(cluster, "underbound")
    assert rdma["values"] == grpc["values"]
    assert re.search(r"edge_\d+_mul DT_FLOAT run-time shape, slots of 8192 B \(its bound from TF's "
                     r"shapes\)$", rdma["report"], re.M), rdma["report"]
    assert rdma["staged"] == [1, 0, 0, 0] and rdma["grown"] == [1, 0, 0, 0], rdma


def test_a_channel_grown_in_one_run_fits_its_slots_at_once_in_the_next(cluster):
    """What a channel learned outlives the coordinator: a second run of the same step (a
    new process, so new instantiations and keys: a job started again) gets, from ps, the
    slots the first run's channel grew to, so its tensors go in one slot from the first
    step, none staged and nothing grown again. Bitwise equal to the first run."""
    env = {"RDMADEV_DYNAMIC_CAPACITY": "4K", "RDMADEV_E2E_STEP_NAME": f"grows_once_{os.getpid()}"}
    first = run_driver(cluster, "rdmadev", "growing", env=env)
    again = run_driver(cluster, "rdmadev", "growing", env=env)
    assert first["grown"] == [1, 0, 0, 1, 0, 0, 0], first
    assert again["values"] == first["values"]
    assert again["staged"] == [0] * 7 and again["grown"] == [0] * 7, again
    assert again["chunks"] == [1] * 7, again


def test_tf1_session_gives_the_same_values(cluster):
    """In a TF1 session each task plans only its own half of a pair; both halves are
    swapped, meet through the receiver, and each task's report says so."""
    grpc, rdma = run_both(cluster, "tf1")
    assert rdma["values"] == grpc["values"] == [16.0, 48.0, 80.0]
    assert rdma["reports"] and all(re.search(r" half(\+zc)? ", r) and "0 stayed on gRPC" in r
                                   for r in rdma["reports"]), rdma["reports"]


def test_every_swapped_transfer_is_on_tfs_profiler_timeline(cluster):
    """The ops' TraceMe events (trace.h) read back from a real profiler trace of every task:
    each channel's bytes and chunks as the plan says, its phases on the right side, the copied
    receive with its copy and the zero-copy one (a dynamic tensor in one slot of its grown
    channel) without; gRPC's run of the same step records none."""
    grpc, rdma = run_both(cluster, "profile")
    assert rdma["first"] == grpc["first"] == [524288.0, 159999600000.0]
    assert grpc["channels"] == {}
    ch = rdma["channels"]
    by_side = {" ".join(k.split()[:2]): v for k, v in ch.items()}
    assert sorted(by_side) == ["ps:0 recv", "ps:0 send", "worker:0 recv", "worker:0 send"], ch
    # The variable read: 1 MiB in one slot, copied out (ReverseV2 may not read a slot).
    assert re.search(r"^\s*shm\s.*ReadVariableOp DT_FLOAT 1048576 B$", rdma["report"], re.M), rdma["report"]
    read_send, read_recv = by_side["ps:0 send"], by_side["worker:0 recv"]
    assert read_send["bytes"] == read_recv["bytes"] == [1048576]
    assert read_send["chunks"] == read_recv["chunks"] == [1]
    assert read_recv["peer"] == "/job:ps/replica:0/task:0"
    assert read_send["phases"] == {"write": read_send["n"]}
    assert read_recv["phases"] == {"wait_data": read_recv["n"], "copy": read_recv["n"]}
    # The unique'd ids: 400,000 int64 on a dynamic channel of 1 MiB slots (not below
    # RDMADEV_STAGE_BELOW_SLOT_BYTES, so not staged), so 4 chunks (gathered by copies) the first
    # time; ps then grew the channel (before the trace), so one slot each, aliased by Mul (the
    # report's shm+zc).
    assert re.search(r"^\s*shm\+zc\s.*Unique DT_INT64 run-time shape, slots of 1048576 B$", rdma["report"],
                     re.M), rdma["report"]
    assert rdma["first_chunks"] == 4 and rdma["grown"] == 1
    ids_send, ids_recv = by_side["worker:0 send"], by_side["ps:0 recv"]
    assert ids_send["bytes"] == ids_recv["bytes"] == [3200000]
    assert ids_send["chunks"] == ids_recv["chunks"] == [1]
    assert ids_send["phases"]["write"] == ids_send["n"]
    assert set(ids_send["phases"]) <= {"write", "wait_credit"}
    assert ids_recv["phases"] == {"wait_data": ids_recv["n"]}  # no copy: zero-copy
    rows = {(r["task"], r["kind"]): r for r in rdma["rows"]}
    assert min(r["steps"] for r in rows.values()) >= 3, rdma["table"]
    assert rows[("ps:0", "recv")]["bytes"] == 3200000 and rows[("worker:0", "recv")]["bytes"] == 1048576
    assert rows[("worker:0", "send")]["chunks"] == 1
    assert rows[("worker:0", "recv")]["copy_ms"] > 0 and rows[("ps:0", "recv")]["copy_ms"] == 0
    # The sends and receives of a channel are matched across the two tasks' traces (one clock).
    for key in [("ps:0", "recv"), ("worker:0", "recv")]:
        assert 0 < rows[key]["notice_us"] <= rows[key]["notice_p90_us"], rdma["table"]
    assert rows[("ps:0", "send")]["notice_us"] is None
